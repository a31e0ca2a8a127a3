--- warmbox.gc: garbage collection of tagged sandboxes, streamed page by page.
--
-- E2B keeps paused sandboxes until they are killed. `run` lists the sandboxes
-- that carry the tag (running and paused), one page at a time, asks the GC
-- policy what to do with each ("keep", "kill" or "demote" to a
-- filesystem-only snapshot) and acts. A page goes through four steps:
--
--   list -> decide -> lock its sessions and re-check -> act (kill / demote)
--
-- and the steps of consecutive pages overlap: one `client:batch` carries the
-- next page's list request, this page's re-check and the kills already
-- re-checked (at most `concurrency` kills in flight). When the policy's
-- decisions do not depend on the listing order (`rules.is_any_order`), two
-- cursors list at once, newest first and oldest first, and stop where they
-- meet (each drops what the other took; see "listing from both ends"). Memory is O(page +
-- concurrency + tenants), whatever the total: nothing is kept of a page once
-- it is done, except what `on_action` / `report.actions` keep.
--
--   local report, err, code, partial = require("warmbox.gc").run{
--     client = e2b_client, tag = "warmboxSessionId", policy = policy, lock = lock_opts,
--     clock = os.time, concurrency = 8, dry_run = false, max_age = 86400,
--     max_kills = nil, next_token = nil, pages = nil, limit = 100,
--     on_action = nil, on_page = nil, actions = true, order = nil }
--
-- It never acts on a busy session: before acting it try-locks the session
-- (the lock key is the tag value) and re-checks the sandbox: the page is
-- listed again from the same cursor (one request per page, cursors are
-- stable under kills) and a sandbox that is missing from it, or whose state,
-- `end_at`, `started_at` or tag changed since it was listed, is skipped. A
-- client without `batch` (the simulator's model) re-checks with `info`.
--
-- Last activity (unix seconds, the clock's unit): a paused sandbox's
-- `end_at` (the time it was paused), a running one's `started_at` (reset by
-- E2B on resume), or, once its session is locked, the later remembered last
-- run from the session's lock state (when that state remembers this
-- sandbox); the policy is then asked again with the refined item.
--
-- Demote: a running sandbox is paused with `{ memory = false }`. A paused one
-- is resumed (`connect`, 60 s lease) and paused again with `{ memory = false }`:
-- E2B cannot turn a memory snapshot into a filesystem-only one in place. The
-- listing does not say which kind of snapshot a paused sandbox has, so a
-- policy that demotes the same sandbox on every pass pays a cold boot each
-- time: demote within an age band (see `warmbox.policy.retention`).
--
-- Resumption: `next_token` starts the pass at that page; `pages` stops it after
-- that many pages. The report's `next_token` is where to continue (nil once the
-- listing is exhausted), and so is the 4th value when the listing fails mid-pass.
-- @module warmbox.gc
local lock_mod = require "warmbox.lock"
local errors = require "warmbox.errors"
local util = require "warmbox.util"
local state_codec = require "warmbox.state"
local json = require "warmbox.json"
local rules = require "warmbox.policy.rules"

local type, pairs, ipairs, tostring, tonumber, error, xpcall, pcall =
  type, pairs, ipairs, tostring, tonumber, error, xpcall, pcall
local traceback, fmt, floor, max, min = debug.traceback, string.format, math.floor, math.max, math.min
local os_time = os.time

local _M = {}

local DEMOTE_LEASE = 60
-- Rounds of `concurrency` kills a kills-only batch carries (and the backlog of
-- re-checked kills, in the same unit, above which the listing waits).
local DRAIN_ROUNDS = 4

-- ---------------------------------------------------------------------------
-- time
-- ---------------------------------------------------------------------------

_M.parse_time = util.parse_time
local parse_time = _M.parse_time

local function last_activity(item)
  if item.state == "paused" then
    return parse_time(item.end_at) or parse_time(item.started_at)
  end
  return parse_time(item.started_at)
end
_M.last_activity = last_activity

--- The default tenant of a session key: the part before the first `:`
-- (the whole key when it has none).
function _M.default_tenant(key)
  if type(key) ~= "string" then return nil end
  return key:match("^([^:]*):") or key
end

-- ---------------------------------------------------------------------------
-- options
-- ---------------------------------------------------------------------------

local RUN_OPTS = { client = true, tag = true, policy = true, lock = true, clock = true, concurrency = true,
  dry_run = true, max_age = true, max_kills = true, next_token = true, pages = true, limit = true,
  on_action = true, on_page = true, actions = true, order = true }
local RELEASE_OPTS = { client = true, tag = true, tag_value = true, key = true, lock = true, concurrency = true }

local function check_opts(opts, known, fname)
  if type(opts) ~= "table" then
    error(fmt("bad argument #1 to '%s' (table expected, got %s)", fname, type(opts)), 3)
  end
  errors.check_options(opts, known, fname, 1, 3)
  local c = opts.client
  if (type(c) ~= "table" and type(c) ~= "userdata") then
    error(fmt("bad argument #1 to '%s' (option 'client': an e2b client expected)", fname), 3)
  end
  if opts.tag ~= nil and (type(opts.tag) ~= "string" or opts.tag == "") then
    error(fmt("bad argument #1 to '%s' (option 'tag': a non-empty string expected)", fname), 3)
  end
end

local function positive_int(v, name, fname, allow_nil, level)
  if v == nil and allow_nil then return end
  if math.type(v) ~= "integer" or v < 1 then
    error(fmt("bad argument #1 to '%s' (option '%s': a positive integer expected)", fname, name), level or 4)
  end
end

-- lock: what warmbox.lock.factory takes; options are checked now, not in the
-- middle of a pass.
local function lock_factory(l, fname) return lock_mod.factory(l, nil, nil, fname) end

local decode_state = state_codec.decode

local function copy(t)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  return o
end

-- A collected or released session's lock: its state forgotten and, with
-- warmbox.lock, its files removed (lk:remove releases it; unlock after is a no-op).
local function forget(lk)
  if type(lk.remove) == "function" then return lk:remove() end
  return lk:set_state(nil)
end

local function close_lock(lk)
  if type(lk.close) == "function" then pcall(lk.close, lk) end
end
-- (gc.run holds a batch of locks across steps, so it closes them by hand;
-- release uses <close> through lock.closing.)

local ACTIONS = { keep = true, kill = true, demote = true }

-- ---------------------------------------------------------------------------
-- listing from both ends
-- ---------------------------------------------------------------------------

-- E2B's listing order (e2b-api.md, pagination): newest first by `startedAt`
-- truncated to microseconds, ties by sandbox id ascending; `order=asc` is the
-- exact reverse, and a page starts strictly after its cursor's item. A key is
-- `{ microseconds, id }`, or nil when `started_at` cannot be read.
local function list_key(d)
  local s = d.started_at
  if type(s) ~= "string" or type(d.sandbox_id) ~= "string" then return nil end
  local base, frac, tz = s:match("^(%d%d%d%d%-%d%d%-%d%d[Tt ]%d%d:%d%d:%d%d)%.?(%d*)(.*)$")
  if not base then return nil end
  local secs = math.tointeger(parse_time(base .. tz))
  if not secs then return nil end
  return { secs * 1000000 + tonumber((frac .. "000000"):sub(1, 6)), d.sandbox_id }
end
_M.list_key = list_key

-- Whether key a comes before key b in the newest-first order.
local function before(a, b)
  if a[1] ~= b[1] then return a[1] > b[1] end
  return a[2] < b[2]
end
_M.before = before

-- Whether direction d (its frontier `d.key`: the last item it took) already
-- took the item at key k: newest-first covers what is at or before its
-- frontier, oldest-first what is at or after it.
local function covered(d, k)
  local f = d.key
  if f[1] == k[1] and f[2] == k[2] then return true end
  if d.asc then return before(f, k) end
  return before(k, f)
end

local TOKEN_PREFIX = "wbgc1."

local function encode_key(k)
  if not k then return false end
  return fmt("%d/%s", k[1], k[2])
end

local function decode_key(s)
  if s == false or s == nil then return nil end
  if type(s) ~= "string" then return nil, false end
  local us, id = s:match("^(%-?%d+)/(.+)$")
  if not us then return nil, false end
  return { math.tointeger(tonumber(us)), id }
end

-- A two-ended pass's resume token: "wbgc1." and base64url of the JSON
-- `{ d = side, a = side }`, a side being `{ t = E2B page token | false, k =
-- frontier key "us/id" | false }` or `{ done = true, k = ... }`.
local function encode_token(t)
  local b = util.b64_encode(json.encode(t)):gsub("[+/=]", { ["+"] = "-", ["/"] = "_", ["="] = "" })
  return TOKEN_PREFIX .. b
end

local function decode_token(s)
  local raw = util.b64_decode(s:sub(#TOKEN_PREFIX + 1))
  local t = raw and json.decode(raw)
  if type(t) ~= "table" then return nil end
  local out = {}
  for _, side in ipairs({ "d", "a" }) do
    local e = t[side]
    if type(e) ~= "table" then return nil end
    local k, bad = decode_key(e.k)
    if bad == false then return nil end
    if e.done == true then
      out[side] = { done = true, key = k }
    else
      if e.t ~= false and type(e.t) ~= "string" then return nil end
      out[side] = { token = e.t or nil, key = k }
    end
  end
  return out
end

-- ---------------------------------------------------------------------------
-- the item a policy sees
-- ---------------------------------------------------------------------------

-- A listed sandbox as the policy sees it, or nil when it does not carry the tag.
-- `orphan`: the tag is there but is not a warmbox tag value (no key, no tenant).
local function make_item(d, tag, tenant_of)
  local md = d.metadata
  local tv = type(md) == "table" and md[tag]
  if type(tv) ~= "string" or tv == "" then return nil end
  local tag_mod = require "warmbox.tag"
  local key, enc = tag_mod.parse_tag(tv)
  local item = {
    sandbox_id = d.sandbox_id, state = d.state, started_at = d.started_at, end_at = d.end_at,
    template_id = d.template_id, metadata = md, tag_value = tv, key = key, orphan = enc == nil,
  }
  item.last_activity = last_activity(d)
  item.demoted = state_codec.looks_demoted(d) -- (paused within seconds of its resume)
  if enc then
    local ok, t = pcall(tenant_of, key or tv, item)
    if not ok then errors.reraise_interrupt(t) end
    item.tenant = ok and type(t) == "string" and t or _M.default_tenant(key or tv)
  end
  return item
end

--- The session key of a tag value, and whether it is a warmbox tag (exposed for the CLI).
function _M.describe_tag(tv)
  local tag_mod = require "warmbox.tag"
  local key, enc = tag_mod.parse_tag(tv)
  return key, enc ~= nil
end

-- Pages of a client without `batch`: its `list_pages`, or pages cut from its
-- `list` iterator (such a client's tokens are not resumable).
local function pages_of(client, opts)
  if type(client.list_pages) == "function" then return client:list_pages(opts) end
  local it = client:list(opts)
  local done, n = false, 0
  local ahead, aerr, acode = it()
  return function()
    if done then return nil end
    local page = {}
    while #page < opts.limit do
      if ahead == false or (ahead == nil and aerr ~= nil) then
        done = true
        return false, aerr, acode
      end
      if ahead == nil then break end
      page[#page + 1] = ahead
      ahead, aerr, acode = it()
    end
    n = n + 1
    if ahead == nil and aerr == nil then done = true end
    if #page == 0 then return nil end
    return page, false, (not done) and ("list:" .. n) or nil
  end
end

-- ---------------------------------------------------------------------------
-- run
-- ---------------------------------------------------------------------------

-- GC's own tasks on the event engine (`warmbox.runner`), for a warmbox.e2b
-- client used outside any task: `{ runner, client }`, the client a copy of
-- `client` whose requests go on that runner's engine inside its tasks. nil
-- otherwise (another client, one with a transport of its own, or already
-- inside a task: then the batch loop).
local function tasks_for(client)
  local e2b = package.loaded["warmbox.e2b"]
  if not e2b or getmetatable(client) ~= e2b.Client or client.transport ~= nil then return nil end
  local runner = require "warmbox.runner"
  if runner.running() then return nil end
  local r = runner.new()
  if not r then return nil end
  local tc = {}
  for k, v in pairs(client) do tc[k] = v end
  tc.transport = runner.transport(client.http)
  return { runner = r, client = setmetatable(tc, e2b.Client) }
end

-- run's option checks after check_opts, in their order (errors name run's
-- caller); returns the policy, clock, concurrency and max_age, defaults applied.
local function run_settings(opts)
  local policy = opts.policy or require "warmbox.policy.default"
  if type(policy) ~= "table" or type(policy.gc) ~= "function" then
    error("bad argument #1 to 'run' (option 'policy': a table with a 'gc' function expected)", 3)
  end
  local clock = opts.clock or os_time
  if type(clock) ~= "function" then error("bad argument #1 to 'run' (option 'clock': a function expected)", 3) end
  local concurrency = opts.concurrency or 8
  -- (level 5: the frame these checks have always named, one above run's caller)
  positive_int(concurrency, "concurrency", "run", nil, 5)
  positive_int(opts.max_kills, "max_kills", "run", true, 5)
  positive_int(opts.pages, "pages", "run", true, 5)
  positive_int(opts.limit, "limit", "run", true, 5)
  local max_age = opts.max_age or 86400
  if type(max_age) ~= "number" then error("bad argument #1 to 'run' (option 'max_age': a number expected)", 3) end
  if opts.next_token ~= nil and type(opts.next_token) ~= "string" then
    error("bad argument #1 to 'run' (option 'next_token': a string expected)", 3)
  end
  for _, k in ipairs({ "on_action", "on_page" }) do
    if opts[k] ~= nil and type(opts[k]) ~= "function" then
      error(fmt("bad argument #1 to 'run' (option '%s': a function expected)", k), 3)
    end
  end
  return policy, clock, concurrency, max_age
end

-- Checks run's `order` and `next_token` (errors name run's caller); returns
-- whether the pass lists from both ends, and the two-ended token's sides.
local function listing_ends(opts, pipelined, policy)
  local order = opts.order
  if order ~= nil and order ~= "newest" and order ~= "both" then
    error("bad argument #1 to 'run' (option 'order': \"newest\" or \"both\" expected)", 3)
  end
  -- Two cursors (newest first and oldest first) when the client batches and the
  -- policy's decisions do not depend on the listing order (no caps), or when
  -- asked; a two-ended pass's resume token resumes both.
  local both, resume_from = false, nil
  local nt = opts.next_token
  if nt and nt:sub(1, #TOKEN_PREFIX) == TOKEN_PREFIX then
    resume_from = decode_token(nt)
    if not resume_from then
      error("bad argument #1 to 'run' (option 'next_token': not a valid GC resume token)", 3)
    end
    if not pipelined then
      error("bad argument #1 to 'run' (option 'next_token': a two-ended pass's token needs a client with batch)", 3)
    end
    both = true
  elseif nt == nil and pipelined then
    both = order == "both" or (order == nil and rules.is_any_order(policy.gc))
  end
  return both, resume_from
end

--- One GC pass. See the module comment.
-- @treturn[1] table report `{ listed, tagged, orphans, kept, killed, demoted, busy, skipped,
--   failed, pages, budget_kept, errors, actions (unless `actions = false`), next_token, dry_run }`
-- @return[2] nil, message, code, partial report (the listing failed; its `next_token`
--   is the page to resume from)
function _M.run(opts)
  check_opts(opts, RUN_OPTS, "run")
  local client = opts.client
  local tag = opts.tag or "warmboxSessionId"
  local policy, clock, concurrency, max_age = run_settings(opts)
  local dry_run = opts.dry_run and true or false
  local new_lock = lock_factory(opts.lock, "run")
  local limit = min(opts.limit or 100, 100)
  local max_kills, max_pages = opts.max_kills, opts.pages
  local on_action, on_page = opts.on_action, opts.on_page
  local tenant_of = type(policy.tenant) == "function" and policy.tenant or _M.default_tenant
  local pipelined = type(client.batch) == "function"
  local both, resume_from = listing_ends(opts, pipelined, policy)
  local list_opts = { state = { "running", "paused" }, limit = limit }

  local report = { listed = 0, tagged = 0, orphans = 0, kept = 0, killed = 0, demoted = 0, busy = 0, skipped = 0,
                   failed = 0, pages = 0, budget_kept = 0, errors = {}, actions = opts.actions ~= false and {} or nil,
                   dry_run = dry_run }
  local function note(item, action, reason)
    local a = { sandbox_id = item.sandbox_id, session = item.tag_value, key = item.key, tenant = item.tenant,
                action = action, reason = reason }
    if report.actions then report.actions[#report.actions + 1] = a end
    if on_action then on_action(a) end
  end
  local function fail(item, action, msg, code)
    report.failed = report.failed + 1
    local e = { sandbox_id = item.sandbox_id, session = item.tag_value, action = action, message = msg, code = code }
    report.errors[#report.errors + 1] = e
    if on_action then
      on_action({ sandbox_id = item.sandbox_id, session = item.tag_value, key = item.key, tenant = item.tenant,
                  action = "error", reason = tostring(msg), code = code, failed = action })
    end
  end

  -- Decisions so far (what the policy sees as counts): per tenant and in total.
  local tenants, totals = {}, { seen = 0, kept = 0, kill = 0, demote = 0 }
  local function count(item, action, d)
    local t = item.tenant or (item.orphan and "(orphans)") or "(hashed)"
    local c = tenants[t]
    if not c then
      c = { kept = 0, kill = 0, demote = 0 }
      tenants[t] = c
    end
    local k = action == "keep" and "kept" or action
    c[k] = c[k] + d
    totals[k] = totals[k] + d
  end

  -- An action decided but not done: the sandbox counts as kept when it still exists
  -- (busy, changed, failed), so caps later in the pass see it.
  local function undo(item, action, exists)
    count(item, action, -1)
    if exists then count(item, "keep", 1) end
  end

  local function decide(item)
    local t = item.tenant or (item.orphan and "(orphans)") or "(hashed)"
    local c = tenants[t] or { kept = 0, kill = 0, demote = 0 }
    local ctx = { now = clock(), max_age = max_age, retention = max_age, tag = tag, tag_value = item.tag_value,
                  tenant = item.tenant, counts = { kept = c.kept, kill = c.kill, demote = c.demote },
                  totals = { seen = totals.seen, kept = totals.kept, kill = totals.kill, demote = totals.demote },
                  max_kills = max_kills, dry_run = dry_run }
    local ok, action, reason = xpcall(policy.gc, traceback, copy(item), ctx)
    if not ok then return nil, "gc policy failed: " .. tostring(errors.reraise_interrupt(action)) end
    if not ACTIONS[action] then
      return nil, "gc policy returned " .. tostring(action) .. " (expected \"keep\", \"kill\" or \"demote\")"
    end
    if reason ~= nil and type(reason) ~= "string" then reason = tostring(reason) end
    if reason == nil and action ~= "keep" and item.last_activity then
      reason = fmt("inactive for %ds (max_age %ds)", floor(ctx.now - item.last_activity), floor(max_age))
    end
    if action == "kill" and max_kills and totals.kill >= max_kills then
      report.budget_kept = report.budget_kept + 1
      return "keep", fmt("max-kills budget (%d) spent", max_kills)
    end
    return action, reason
  end

  -- Session locks held by this pass: tag value -> { lk, refs, state, forget }.
  local held = {}
  local function acquire(tv)
    local h = held[tv]
    if h then
      h.refs = h.refs + 1
      return h
    end
    local lk = new_lock()
    local got, lerr, lcode = lk:try_lock(tv)
    if not got then
      close_lock(lk)
      return nil, lerr, lcode
    end
    h = { lk = lk, refs = 1, state = decode_state(lk:get_state()) }
    held[tv] = h
    return h
  end
  local function release_ref(tv)
    local h = held[tv]
    h.refs = h.refs - 1
    if h.refs == 0 then
      if h.forget then
        forget(h.lk) -- the session's sandbox was collected
      elseif h.rewrite then
        h.lk:set_state(state_codec.encode(h.state))
      end
      h.lk:unlock()
      close_lock(h.lk)
      held[tv] = nil
    end
  end
  local function release_all()
    for tv, h in pairs(held) do
      h.lk:unlock()
      close_lock(h.lk)
      held[tv] = nil
    end
  end

  -- Per listing direction, the pages with entries not finished yet, oldest
  -- first: the earliest one's token is where a pass interrupted now would have
  -- to resume (`report.resume_token`).
  local function finish(e)
    local pg = e.page
    if not pg then return end
    e.page = nil
    pg.left = pg.left - 1
    local d = pg.dir
    while d.open[d.ohead] and d.open[d.ohead].left == 0 do
      d.open[d.ohead] = nil
      d.ohead = d.ohead + 1
    end
  end
  local function done_with(e)
    release_ref(e.item.tag_value)
    finish(e)
  end

  -- A listed page: decide each tagged item; returns the entries to act on.
  local function take_page(items)
    report.pages = report.pages + 1
    local entries = {}
    for _, d in ipairs(items) do
      report.listed = report.listed + 1
      local item = make_item(d, tag, tenant_of)
      if item then
        report.tagged = report.tagged + 1
        if item.orphan then report.orphans = report.orphans + 1 end
        totals.seen = totals.seen + 1
        local action, reason = decide(item)
        if not action then
          fail(item, "policy", reason, "POLICY")
        else
          count(item, action, 1)
          if action == "keep" then
            report.kept = report.kept + 1
            if reason then note(item, "keep", reason) end
          else
            entries[#entries + 1] = { item = item, action = action, reason = reason }
          end
        end
      end
    end
    return entries
  end

  -- Lock the entries' sessions and refine running sandboxes' last activity
  -- with the remembered last run; returns the entries still to act on.
  local function lock_entries(entries)
    local out = {}
    for _, e in ipairs(entries) do
      local item = e.item
      local h, lerr, lcode = acquire(item.tag_value)
      if not h then
        undo(item, e.action, true)
        if lerr == "busy" then
          report.busy = report.busy + 1
          note(item, "busy", "session is busy")
        else
          fail(item, e.action, "cannot lock session: " .. tostring(lerr), lcode or "LOCK")
        end
        finish(e)
      else
        local st = h.state
        local last_run = tonumber(st.last_run)
        local keep_it = false
        if st.sandbox_id == item.sandbox_id and last_run and last_run > (item.last_activity or -math.huge) then
          item.last_activity = last_run
          count(item, e.action, -1)
          local action, reason = decide(item)
          if not action then
            fail(item, "policy", reason, "POLICY")
            count(item, "keep", 1) -- it stays
            keep_it = true
          else
            count(item, action, 1)
            if action == "keep" then
              report.kept = report.kept + 1
              note(item, "keep", reason or "used since it was listed")
              keep_it = true
            else
              e.action, e.reason = action, reason
            end
          end
        end
        if keep_it then
          done_with(e)
        else
          out[#out + 1] = e
        end
      end
    end
    return out
  end

  local function same(item, cur, tv)
    if cur.metadata == nil or cur.metadata[tag] ~= tv then return false end
    if cur.state ~= item.state then return false end
    if cur.end_at ~= item.end_at and item.state == "paused" then return false end
    if cur.started_at ~= item.started_at then return false end
    return true
  end

  local act_client = client -- the client that acts (on the engine inside gc's tasks)
  local function demote(item)
    local id = item.sandbox_id
    if item.state == "paused" then
      local sb, cerr, ccode = act_client:connect(id, { timeout = DEMOTE_LEASE })
      if not sb then return nil, cerr, ccode end
    end
    local r, perr, pcode = act_client:pause(id, { memory = false })
    if r == nil then return nil, perr, pcode end
    return r
  end

  local queue, qhead, qtail = {}, 1, 0 -- re-checked kills, FIFO
  -- Re-check a locked page's entries against `current` (id -> detail | false when
  -- gone | nil when not seen); demotes act here, kills are queued.
  local function rechecked(entries, current)
    for _, e in ipairs(entries) do
      local item = e.item
      local cur = current[item.sandbox_id]
      if cur and same(item, cur, item.tag_value) then
        if e.action == "kill" then
          qtail = qtail + 1
          queue[qtail] = e
        else
          local r, derr, dcode = demote(item)
          if r == nil then
            undo(item, "demote", true)
            fail(item, "demote", derr, dcode)
          elseif r == false then
            undo(item, "demote", true)
            report.skipped = report.skipped + 1
            note(item, "changed", "already paused")
          else
            report.demoted = report.demoted + 1
            note(item, "demote", e.reason)
            -- its kernel is gone: the session must install its output hooks again
            -- and its memory: a session with require_memory replaces it
            local h = held[item.tag_value]
            if h.state.sandbox_id == item.sandbox_id then
              h.state.hooked = nil
              h.state.memory_lost = item.sandbox_id
              h.rewrite = true
            end
          end
          done_with(e)
        end
      else
        undo(item, e.action, cur ~= false)
        report.skipped = report.skipped + 1
        if cur == false then
          note(item, "gone", "sandbox no longer exists")
        else
          note(item, "changed", "changed since it was listed (resumed, re-paused, retagged or gone)")
        end
        done_with(e)
      end
    end
  end

  local function killed(e, r, kerr, kcode)
    local item = e.item
    if r == nil then
      undo(item, "kill", true)
      fail(item, "kill", kerr, kcode)
    elseif r == false then
      undo(item, "kill", false)
      report.skipped = report.skipped + 1
      note(item, "gone", "sandbox no longer exists")
    else
      report.killed = report.killed + 1
      note(item, "kill", e.reason)
      local h = held[item.tag_value]
      if h and h.state.sandbox_id == item.sandbox_id then h.forget = true end
    end
    done_with(e)
  end

  -- ---- the pass --------------------------------------------------------
  -- Listing directions: one (newest first, E2B's order) or, with `order =
  -- "both"`, two cursors, newest first and oldest first, that meet in the
  -- middle. Each: `token` (the next page), `key` (the listing key of the last
  -- item it took: its frontier), `done`, `pending` (its page listed last,
  -- awaiting the re-check), `open` pages (resume tokens).
  local function new_dir(asc, st)
    st = st or {}
    return { asc = asc, token = st.token, key = st.key, done = st.done or false, open = {}, ohead = 1, otail = 0 }
  end
  local dirs
  if both then
    -- (a side that finished in an earlier pass lists nothing: its key bounds the other)
    dirs = { new_dir(false, resume_from and resume_from.d), new_dir(true, resume_from and resume_from.a) }
    dirs[1].other, dirs[2].other = dirs[2], dirs[1]
  else
    dirs = { new_dir(false, { token = opts.next_token }) }
  end
  local pages_left = max_pages
  local seq_pages -- the listing iterator of a client without batch
  local function listing_done()
    for _, d in ipairs(dirs) do if not d.done then return false end end
    return true
  end
  local function listing_active()
    for _, d in ipairs(dirs) do if not d.done and not d.paused then return true end end
    return false
  end
  -- May another page be listed (`pages`)? Counts the lists of this batch.
  local function may_list(d, n)
    return not d.done and not d.paused and (not pages_left or n < pages_left)
  end
  local function stop_all()
    for _, d in ipairs(dirs) do d.done = true end
  end

  -- Where a pass starts again: the earliest open page of each direction when
  -- `open`, else its next page; nil when nothing is left.
  local function token_of(open)
    if not both then
      local d = dirs[1]
      local pg = open and d.open[d.ohead]
      if pg then return pg.token or nil end
      if d.done then return nil end
      return d.token
    end
    local t, left = {}, false
    for _, d in ipairs(dirs) do
      local pg = open and d.open[d.ohead]
      local e
      if pg then
        e = { t = pg.token or false, k = encode_key(pg.key) }
        left = true
      elseif d.done then
        e = { done = true, k = encode_key(d.key) }
      else
        e = { t = d.token or false, k = encode_key(d.key) }
        left = true
      end
      t[d.asc and "a" or "d"] = e
    end
    if not left then return nil end
    return encode_token(t)
  end

  local function page_done(token)
    local nxt = token_of(false)
    report.next_token = nxt
    report.resume_token = token_of(true)
    if on_page then
      on_page({ token = token, next_token = nxt, resume_token = report.resume_token, report = report,
                queued = qtail - qhead + 1 })
    end
  end

  -- A listed page of direction d: drops what the other direction already took
  -- (the two met), advances d's frontier and decides the rest. Returns the
  -- entries to act on, and the page record (for resume tokens).
  local function listed(d, items, used, nxt)
    local page_key = d.key
    if both then
      local o, kept, crossed, last = d.other, {}, false, nil
      for _, it in ipairs(items) do
        local k = list_key(it)
        if k and o.key and covered(o, k) then
          crossed = true
        else
          kept[#kept + 1] = it
          if k then last = k end
        end
      end
      items = kept
      if last then d.key = last end
      -- Met the other side, or reached the end: everything is listed.
      if crossed or not nxt then stop_all() end
    elseif not nxt then
      d.done = true
    end
    d.token = nxt
    if pages_left then
      pages_left = pages_left - 1
      if pages_left <= 0 then
        for _, x in ipairs(dirs) do x.paused = true end
      end
    end
    local taken = take_page(items)
    local pg
    if #taken > 0 then
      pg = { token = used, key = page_key, left = #taken, dir = d }
      for _, e in ipairs(taken) do e.page = pg end
      d.otail = d.otail + 1
      d.open[d.otail] = pg
    end
    return taken
  end

  -- The next page of a client without batch (its listing made on first use,
  -- from the first direction's token).
  local function seq_page()
    if not seq_pages then
      seq_pages = pages_of(client, { state = list_opts.state, limit = limit, next_token = dirs[1].token })
    end
    return seq_pages()
  end

  local function list_op(d, token)
    return { op = "list", opts = { state = list_opts.state, limit = limit, next_token = token or nil,
                                   order = d.asc and "asc" or nil } }
  end

  -- A dry run: list and decide every page, count what would be done, act on
  -- nothing; returns what run returns.
  local function dry_pass()
    while not listing_done() do
      local ops, which = {}, {}
      for _, d in ipairs(dirs) do
        if may_list(d, #ops) then
          ops[#ops + 1] = list_op(d, d.token)
          which[#ops] = d
        end
      end
      if #ops == 0 then break end
      local res
      if pipelined then
        res = client:batch(ops, { concurrency = #ops })
      else
        local items, a, b = seq_page()
        res = { items == nil and { done = true } or { items, a, b } }
      end
      for i, d in ipairs(which) do
        local r = res[i]
        if r.done then
          d.done = true
        elseif r[1] == false then
          report.next_token = token_of(false)
          return nil, r[2], r[3], report, r[5]
        else
          for _, e in ipairs(listed(d, r[1], r[2], r[3])) do
            local k = e.action == "kill" and "killed" or "demoted"
            report[k] = report[k] + 1
            note(e.item, e.action, e.reason)
            finish(e)
          end
          page_done(r[2])
        end
      end
    end
    report.next_token = token_of(false)
    report.resume_token = report.next_token
    return report
  end
  if dry_run then return dry_pass() end

  local list_error
  local backlog = max(concurrency * DRAIN_ROUNDS, limit)

  -- One step's list requests: the next page of each side (unless `can_list` is
  -- false) and the re-check of each side's pending page (`rechecks`).
  local function list_ops(can_list, rechecks)
    local ops, kinds, which = {}, {}, {}
    for _, d in ipairs(dirs) do
      if can_list and may_list(d, #ops) then
        ops[#ops + 1] = list_op(d, d.token)
        kinds[#ops], which[#ops] = "list", d
      end
    end
    local nlists = #ops
    if rechecks then
      for _, d in ipairs(dirs) do
        if d.pending then
          ops[#ops + 1] = list_op(d, d.pending.token)
          kinds[#ops], which[#ops] = "recheck", d
        end
      end
    end
    return ops, kinds, which, nlists
  end

  -- The re-checks answered (a client with batch): queue the kills, do the demotes.
  local function after_rechecks(ops, kinds, which, results)
    for i = 1, #ops do
      if kinds[i] == "recheck" then
        local d, r = which[i], results[i]
        local pending = d.pending
        d.pending = nil
        if r[1] == false then
          -- cannot re-check: act on nothing of that page
          for _, e in ipairs(pending.entries) do
            undo(e.item, e.action, true)
            fail(e.item, e.action, "re-check failed: " .. tostring(r[2]), r[3])
            done_with(e)
          end
        else
          local current = {}
          for _, x in ipairs(r[1]) do current[x.sandbox_id] = x end
          rechecked(pending.entries, current)
        end
      end
    end
  end

  -- The pages listed: decide, lock, and keep each side's page for its re-check.
  local function after_lists(nlists, which, results)
    for i = 1, nlists do
      local d, r = which[i], results[i]
      if r.done then
        d.done = true
      elseif r[1] == false then
        -- stop listing, finish what was listed; resume from this page
        for _, x in ipairs(dirs) do x.paused = true end
        list_error = list_error or { r[2], r[3], r[5] }
      else
        local used = r[2]
        local entries = lock_entries(listed(d, r[1], used, r[3]))
        if #entries > 0 then d.pending = { token = used, entries = entries } end
        page_done(used)
      end
    end
  end

  -- Moves up to n queued kills into a batch's ops; returns how many it moved.
  local function take_kills(ops, kinds, n)
    local nkills = 0
    while qhead <= qtail and nkills < n do
      local e = queue[qhead]
      queue[qhead] = nil
      qhead = qhead + 1
      nkills = nkills + 1
      ops[#ops + 1] = { op = "kill", id = e.item.sandbox_id, entry = e }
      kinds[#ops] = "kill"
    end
    return nkills
  end

  -- A batch's results from a client without batch: each list from its listing,
  -- then the kills (with its kill_many when it has one).
  local function seq_results(ops, kinds)
    local results = {}
    local kill_ids, kill_at = {}, {}
    for i, o in ipairs(ops) do
      if kinds[i] == "list" then
        local items, a, b, c, d = seq_page()
        results[i] = items == nil and { done = true } or { items, a, b, c, d }
      else
        kill_ids[#kill_ids + 1] = o.id
        kill_at[#kill_at + 1] = i
      end
    end
    if #kill_ids > 0 then
      local kr = type(client.kill_many) == "function"
        and client:kill_many(kill_ids, { concurrency = concurrency })
      for j, i in ipairs(kill_at) do
        results[i] = kr and kr[j] or { client:kill(kill_ids[j]) }
      end
    end
    return results
  end

  -- The pending page's re-check with `info` (a client without batch): an entry
  -- whose sandbox cannot be read fails, the others are re-checked.
  local function recheck_by_info()
    local pending = dirs[1].pending
    dirs[1].pending = nil
    local current = {}
    for _, e in ipairs(pending.entries) do
      local info, ierr, icode = client:info(e.item.sandbox_id)
      if info then
        current[e.item.sandbox_id] = info
      elseif icode == "NOT_FOUND" then
        current[e.item.sandbox_id] = false
      else
        current[e.item.sandbox_id] = { metadata = {}, failed = { ierr, icode } }
      end
    end
    local kept = {}
    for _, e in ipairs(pending.entries) do
      local cur = current[e.item.sandbox_id]
      if cur and cur.failed then
        undo(e.item, e.action, true)
        fail(e.item, e.action, cur.failed[1], cur.failed[2])
        done_with(e)
      else
        kept[#kept + 1] = e
      end
    end
    rechecked(kept, current)
  end

  local ok, err
  local tasks = tasks_for(client)
  if tasks then
    -- The kills on the event engine: `concurrency` tasks take the queued kills
    -- one by one, each sending the next as soon as its last one is answered,
    -- while a lister task lists and re-checks (its requests apart from the
    -- kills: never more than `concurrency` kills in flight). No step waits for
    -- the slowest request of a batch.
    local r, tc = tasks.runner, tasks.client
    act_client = tc
    local sched = r.sched
    local queued_ev, room_ev = sched:event(), sched:event()
    local over, failure = false, nil
    local function guard(fn)
      return function()
        local fok, ferr = pcall(fn)
        if not fok then
          failure = failure or { ferr }
          over = true
          queued_ev:broadcast(true)
          room_ev:broadcast(true)
        end
      end
    end
    local function worker()
      while true do
        while qhead > qtail and not over do queued_ev:wait() end
        if failure or qhead > qtail then return end
        local e = queue[qhead]
        queue[qhead] = nil
        qhead = qhead + 1
        if qtail - qhead + 1 <= backlog then room_ev:broadcast(true) end
        local kr, kerr, kcode = tc:kill(e.item.sandbox_id)
        killed(e, kr, kerr, kcode)
      end
    end
    local function lister()
      while not failure do
        while qtail - qhead + 1 > backlog and not failure do room_ev:wait() end
        if failure then return end
        local ops, kinds, which, nlists = list_ops(true, true)
        if #ops == 0 then break end
        local results = tc:batch(ops, { concurrency = #ops })
        after_rechecks(ops, kinds, which, results)
        if qhead <= qtail then queued_ev:broadcast(true) end
        after_lists(nlists, which, results)
      end
      over = true
      queued_ev:broadcast(true)
    end
    ok = true
    local lerr
    local ran, rerr = pcall(function()
      r:spawn(guard(lister))
      for _ = 1, concurrency do r:spawn(guard(worker)) end
      ok, lerr = r:loop()
    end)
    if not ran then
      -- Raised outside the tasks (a signal: lua.c's ^C lands in the main thread):
      -- stop, but let the requests in flight finish (and their kills be counted)
      -- rather than abort kills the server may already have done.
      failure = failure or { rerr }
      over = true
      queued_ev:broadcast(true)
      room_ev:broadcast(true)
      pcall(r.loop, r)
    end
    r:close()
    act_client = client
    if not ran then
      ok, err = false, rerr
    elseif failure then
      ok, err = false, failure[1]
    elseif not ok then
      err = "gc: " .. tostring(lerr)
    end
  else
    ok, err = pcall(function()
      while true do
        local ops, kinds, which, nlists = list_ops(qtail - qhead + 1 <= backlog, pipelined)
        local nreq = #ops
        -- While anything is listed or re-checked, a batch carries one round of
        -- `concurrency` kills (the batch runs at concurrency + its list requests, so
        -- kills never exceed `concurrency` in flight) and the next batch follows at
        -- once: listing never waits behind a long batch of kills. Kills only:
        -- several rounds at `concurrency` (h:batch refills a freed slot at once).
        local busy_listing = nreq > 0 or listing_active()
        local max_kills_now = busy_listing and concurrency or concurrency * DRAIN_ROUNDS
        local nkills = take_kills(ops, kinds, max_kills_now)
        local pending_seq = not pipelined and dirs[1].pending
        if #ops == 0 and not pending_seq then break end
        local results
        if pipelined then
          results = client:batch(ops, { concurrency = (nkills > 0 and concurrency or 0) + nreq })
        else
          results = seq_results(ops, kinds)
        end
        -- 1. kills
        for i, o in ipairs(ops) do
          if kinds[i] == "kill" then
            local r = results[i]
            killed(o.entry, r[1], r[2], r[3])
          end
        end
        -- 2. the pending pages' re-checks
        if pipelined then
          after_rechecks(ops, kinds, which, results)
        elseif pending_seq then
          recheck_by_info()
        end
        -- 3. the pages just listed
        after_lists(nlists, which, results)
      end
    end)
  end
  if not ok then
    release_all() -- a callback or the lock backend raised: leave no session locked
    error(err, 0)
  end
  report.next_token = token_of(false)
  report.resume_token = report.next_token
  if list_error then return nil, list_error[1], list_error[2], report, list_error[3] end
  return report
end
-- ---------------------------------------------------------------------------
-- release
-- ---------------------------------------------------------------------------

-- Calls fn(item) for each listed item, page by page (`list` when the client has
-- it, else `list_all`); an error (nil/false, msg, code) is returned, not swallowed.
local function each_listed(client, opts, fn)
  if type(client.list) ~= "function" then
    local items, err, code = client:list_all(opts)
    if not items then return nil, err, code end
    for _, it in ipairs(items) do fn(it) end
    return true
  end
  for item, err, code in client:list(opts) do
    if not item then return nil, err, code end
    fn(item)
  end
  return true
end
_M.each_listed = each_listed

-- After release's kills: the conversation's checkpoints go too (warmbox.gc_checkpoints).
local function release_checkpoints(client, key, tv, killed)
  local deleted, derr, dcode = require("warmbox.gc_checkpoints").release(client, key, not key and tv or nil)
  if not deleted then return nil, derr, dcode end
  return killed, deleted
end

--- Kills a conversation's sandboxes (the conversation was deleted): with
-- `tag_value`, those whose tag equals it exactly; with `key`, those whose tag
-- decodes to that session key, whatever the fingerprint (env, actor,
-- template). Each session is locked first (waiting for a run in progress, up to
-- the lock's `timeout`), and its remembered state is cleared.
-- @tparam table opts client, tag ("warmboxSessionId"), tag_value | key, lock
-- Then the conversation's checkpoints are deleted (issue 24).
-- @treturn[1] number how many sandboxes were killed
-- @treturn[1] number how many checkpoints were deleted
-- @return[2] nil, message, code ("BUSY" when a session stayed locked)
function _M.release(opts)
  check_opts(opts, RELEASE_OPTS, "release")
  local client, tag, tv, key = opts.client, opts.tag or "warmboxSessionId", opts.tag_value, opts.key
  if key ~= nil then
    if type(key) ~= "string" or key == "" then
      error("bad argument #1 to 'release' (option 'key': a non-empty string expected)", 2)
    end
  elseif type(tv) ~= "string" or tv == "" then
    error("bad argument #1 to 'release' (option 'tag_value': a non-empty string expected)", 2)
  end
  local new_lock = lock_factory(opts.lock, "release")
  local tag_mod = require "warmbox.tag"
  -- With a key: the tag values that decode to it (a conversation has few).
  local order = { tv }
  if key then
    order = {}
    local seen = {}
    local ok, err, code = each_listed(client, { state = { "running", "paused" } }, function(item)
      local v = type(item.metadata) == "table" and item.metadata[tag]
      if type(v) == "string" and not seen[v] and tag_mod.tag_matches_key(v, key) then
        seen[v] = true
        order[#order + 1] = v
      end
    end)
    if not ok then return nil, err, code end
  end
  -- Each session: lock (a run in progress finishes first), list its sandboxes
  -- under the lock, kill them, forget the remembered state.
  local killed = 0
  for _, v in ipairs(order) do
    local lk = new_lock()
    local _, lerr = lk:lock(v)
    if lerr then
      close_lock(lk)
      return lock_mod.failure(fmt("session '%s'", key or v), lerr)
    end
    local ids = {}
    local ok, err, code = each_listed(client, { state = { "running", "paused" }, metadata = { [tag] = v } },
      function(item)
        -- Exact re-check: a loose server-side match never hands over another session.
        if type(item.metadata) == "table" and item.metadata[tag] == v then ids[#ids + 1] = item.sandbox_id end
      end)
    local kerr, kcode = err, code
    if ok then
      -- In parallel where the client can (bounded; on the engine inside a task).
      local results = {}
      if client.kill_many and #ids > 1 then
        results = client:kill_many(ids, { concurrency = opts.concurrency or 8 })
      else
        for i, id in ipairs(ids) do results[i] = { client:kill(id) } end
      end
      for i = 1, #ids do
        local r = results[i] or {}
        if r[1] then
          killed = killed + 1
        elseif r[1] == nil then
          kerr, kcode = r[2], r[3]
        end
      end
      if not kerr then forget(lk) end
    end
    lk:unlock()
    close_lock(lk)
    if kerr then return nil, kerr, kcode end
  end
  return release_checkpoints(client, key, tv, killed)
end

return _M
