--- warmbox.gc: garbage collection of tagged sandboxes.
--
-- E2B keeps paused sandboxes until they are killed. `run` lists every sandbox
-- that carries the tag (running and paused, every page), computes its last
-- activity, asks the GC policy what to do with it ("keep", "kill" or
-- "demote" to a filesystem-only snapshot) and acts, a bounded number of
-- sandboxes at a time. It never acts on a busy session: before acting it
-- try-locks the session (the lock key is the tag value) and re-checks the
-- sandbox (`info`): a sandbox that was resumed, re-paused or is gone since
-- it was listed is skipped. `release` kills one session's sandboxes.
--
--   local report, err, code = require("warmbox.gc").run{
--     client = e2b_client, tag = "warmboxSessionId", policy = policy, lock = lock_opts,
--     clock = os.time, concurrency = 8, dry_run = false, max_age = 86400 }
--   -- report = { listed, tagged, kept, killed, demoted, busy, skipped, errors = { ... },
--   --            actions = { { sandbox_id, session, action, reason }, ... }, dry_run }
--
-- Last activity (unix seconds, the clock's unit): a paused sandbox's
-- `end_at` (the time it was paused); a running one's `started_at` (reset by
-- E2B on resume) or, once its session is locked, the later remembered last
-- run from the session's lock state (`last_run`, when that state remembers
-- this sandbox); the policy is then asked again with the refined item.
--
-- Demote: a running sandbox is paused with `{ memory = false }`. A paused one
-- is resumed (`connect`, 60 s lease) and paused again with `{ memory = false }`:
-- E2B cannot turn a memory snapshot into a filesystem-only one in place. The
-- listing does not say which kind of snapshot a paused sandbox has, so a
-- policy that demotes the same sandbox on every pass pays a cold boot each
-- time: demote within an age band (see `warmbox.policy.default`).
--
-- Parallelism: the client has no batch kill in its contract; when it offers
-- `client:kill_many(ids, { concurrency = n })` (results shaped like
-- `core.http:batch`: `{ { true|false } | { nil, msg, code }, ... }`) kills go
-- through it, otherwise they are sequential. `concurrency` also bounds how
-- many sandboxes (and so sessions) are locked at once.
-- @module warmbox.gc
local lock_mod = require "warmbox.lock"
local errors = require "warmbox.errors"
local util = require "warmbox.util"
local state_codec = require "warmbox.state"

local type, pairs, ipairs, tostring, tonumber, error, xpcall =
  type, pairs, ipairs, tostring, tonumber, error, xpcall
local traceback, fmt, floor, max = debug.traceback, string.format, math.floor, math.max
local os_time = os.time

local _M = {}

local DEMOTE_LEASE = 60

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

-- ---------------------------------------------------------------------------
-- options
-- ---------------------------------------------------------------------------

local RUN_OPTS = { client = "table|userdata", tag = "string", policy = "table", lock = "string|table|function",
  clock = "function", concurrency = "number", dry_run = "boolean", max_age = "number" }
local RELEASE_OPTS = { client = "table|userdata", tag = "string", tag_value = "string",
  lock = "string|table|function" }

-- Level 3: the caller of run or release.
local function check_opts(opts, known, fname)
  if type(opts) ~= "table" then errors.bad_argument(1, fname, "table expected, got " .. type(opts), 3) end
  errors.check_options(opts, known, fname, 1, 3)
  if opts.client == nil then errors.bad_option(1, fname, "client", "an e2b client expected", 3) end
  if opts.tag == "" then errors.bad_option(1, fname, "tag", "a non-empty string expected", 3) end
end

-- The remembered state a session keeps under its lock (only `sandbox_id`
-- and `last_run` are read here).
local decode_state = state_codec.decode

-- Iterates `client:list(opts)` by hand, so an error (nil/false, msg, code)
-- is seen rather than ending the loop. Calls fn(item) for each item.
local function each_listed(client, opts, fn)
  if type(client.list) ~= "function" then
    local items, err, code = client:list_all(opts)
    if not items then return nil, err, code end
    for _, it in ipairs(items) do fn(it) end
    return true
  end
  local iter, st, ctl = client:list(opts)
  if type(iter) ~= "function" then return nil, tostring(st or "list failed"), ctl end
  while true do
    local item, err, code = iter(st, ctl)
    if not item then
      if err ~= nil then return nil, err, code end
      return true
    end
    ctl = item
    fn(item)
  end
end

local function copy(t)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  return o
end

local ACTIONS = { keep = true, kill = true, demote = true }

-- Asks the policy; returns action, reason | nil, msg
local function ask(policy, item, ctx)
  local ok, action, reason = xpcall(policy.gc, traceback, copy(item), copy(ctx))
  if not ok then return nil, "gc policy failed: " .. tostring(action) end
  if not ACTIONS[action] then
    return nil, "gc policy returned " .. tostring(action) .. " (expected \"keep\", \"kill\" or \"demote\")"
  end
  if reason == nil and action ~= "keep" and item.last_activity then
    reason = fmt("inactive for %ds (max_age %ds)", floor(ctx.now - item.last_activity), floor(ctx.max_age))
  end
  return action, reason
end

-- ---------------------------------------------------------------------------
-- run
-- ---------------------------------------------------------------------------

--- One GC pass. See the module comment.
-- @treturn[1] table report
-- @return[2] nil, message, code (listing failed)
function _M.run(opts)
  check_opts(opts, RUN_OPTS, "run")
  local client = opts.client
  local tag = opts.tag or "warmboxSessionId"
  local policy = opts.policy or require "warmbox.policy.default"
  if type(policy) ~= "table" or type(policy.gc) ~= "function" then
    error("bad argument #1 to 'run' (option 'policy': a table with a 'gc' function expected)", 2)
  end
  local clock = opts.clock or os_time
  if type(clock) ~= "function" then error("bad argument #1 to 'run' (option 'clock': a function expected)", 2) end
  local concurrency = opts.concurrency or 8
  if math.type(concurrency) ~= "integer" or concurrency < 1 then
    error("bad argument #1 to 'run' (option 'concurrency': a positive integer expected)", 2)
  end
  local max_age = opts.max_age or 86400
  if type(max_age) ~= "number" then error("bad argument #1 to 'run' (option 'max_age': a number expected)", 2) end
  local dry_run = opts.dry_run and true or false
  local new_lock = lock_mod.factory(opts.lock, nil, nil, "run")

  local report = { listed = 0, tagged = 0, kept = 0, killed = 0, demoted = 0, busy = 0, skipped = 0,
                   errors = {}, actions = {}, dry_run = dry_run }
  local function note(item, tv, action, reason)
    report.actions[#report.actions + 1] = { sandbox_id = item.sandbox_id, session = tv, action = action,
                                            reason = reason }
  end
  local function fail(item, tv, action, msg, code)
    report.errors[#report.errors + 1] = { sandbox_id = item.sandbox_id, session = tv, action = action,
                                          message = msg, code = code }
  end

  -- 1. list and decide
  local pending, order = {}, {} -- tag value -> { {item, action, reason}, ... }
  local ok, err, code = each_listed(client, { state = { "running", "paused" }, limit = 100 }, function(item)
    report.listed = report.listed + 1
    local md = item.metadata
    local tv = type(md) == "table" and md[tag]
    if type(tv) ~= "string" or tv == "" then return end -- not ours: never touched
    report.tagged = report.tagged + 1
    local it = copy(item)
    it.last_activity = last_activity(item)
    local action, reason = ask(policy, it, { now = clock(), max_age = max_age, tag = tag, tag_value = tv })
    if not action then
      fail(item, tv, "policy", reason, "POLICY")
      return
    end
    if action == "keep" then
      report.kept = report.kept + 1
      return
    end
    if not pending[tv] then
      pending[tv] = {}
      order[#order + 1] = tv
    end
    local p = pending[tv]
    p[#p + 1] = { item = it, action = action, reason = reason }
  end)
  if not ok then return nil, err, code end

  if dry_run then
    for _, tv in ipairs(order) do
      for _, p in ipairs(pending[tv]) do
        local k = p.action == "kill" and "killed" or "demoted"
        report[k] = report[k] + 1
        note(p.item, tv, p.action, p.reason)
      end
    end
    return report
  end

  -- 2. act, `concurrency` sandboxes at a time, each session locked meanwhile
  local function recheck(p, tv)
    local item = p.item
    local info, ierr, icode = client:info(item.sandbox_id)
    if not info then
      if icode == "NOT_FOUND" then return "gone" end
      return nil, ierr, icode
    end
    local md = info.metadata
    if type(md) == "table" and md[tag] ~= nil and md[tag] ~= tv then return "changed" end
    if info.state ~= item.state then return "changed" end
    if item.state == "paused" and info.end_at ~= nil and item.end_at ~= nil and info.end_at ~= item.end_at then
      return "changed"
    end
    if item.state == "running" and info.started_at ~= nil and item.started_at ~= nil
      and info.started_at ~= item.started_at then
      return "changed"
    end
    return true
  end

  local function demote(item)
    local id = item.sandbox_id
    if item.state == "paused" then
      local sb, cerr, ccode = client:connect(id, { timeout = DEMOTE_LEASE })
      if not sb then return nil, cerr, ccode end
    end
    local r, perr, pcode = client:pause(id, { memory = false })
    if r == nil then return nil, perr, pcode end
    return r
  end

  local function act_batch(batch)
    -- batch: { { tv, lk, state, entries = { p, ... } }, ... } (sessions locked)
    local kills, kill_ps = {}, {}
    for _, s in ipairs(batch) do
      for _, p in ipairs(s.entries) do
        local okc, cerr, ccode = recheck(p, s.tv)
        if okc == true then
          if p.action == "kill" then
            kills[#kills + 1] = p.item.sandbox_id
            kill_ps[#kill_ps + 1] = { p = p, s = s }
          else
            local r, derr, dcode = demote(p.item)
            if r == nil then
              fail(p.item, s.tv, "demote", derr, dcode)
            elseif r == false then
              report.skipped = report.skipped + 1
              note(p.item, s.tv, "changed", "already paused")
            else
              report.demoted = report.demoted + 1
              note(p.item, s.tv, "demote", p.reason)
            end
          end
        elseif okc then
          report.skipped = report.skipped + 1
          note(p.item, s.tv, okc, okc == "gone" and "sandbox no longer exists" or "changed since it was listed")
        else
          fail(p.item, s.tv, p.action, cerr, ccode)
        end
      end
    end
    local results
    if #kills > 0 and type(client.kill_many) == "function" then
      results = client:kill_many(kills, { concurrency = concurrency })
    end
    for i, kp in ipairs(kill_ps) do
      local res = results and results[i]
      local r, kerr, kcode
      if res then
        r, kerr, kcode = res[1], res[2], res[3]
      else
        r, kerr, kcode = client:kill(kills[i])
      end
      if r == nil then
        fail(kp.p.item, kp.s.tv, "kill", kerr, kcode)
      elseif r == false then
        report.skipped = report.skipped + 1
        note(kp.p.item, kp.s.tv, "gone", "sandbox no longer exists")
      else
        report.killed = report.killed + 1
        note(kp.p.item, kp.s.tv, "kill", kp.p.reason)
        if kp.s.state.sandbox_id == kp.p.item.sandbox_id then kp.s.forget = true end
      end
    end
    for _, s in ipairs(batch) do
      if s.forget then s.lk:set_state(nil) end
      s.lk:unlock()
    end
  end

  local batch, size = {}, 0
  for _, tv in ipairs(order) do
    local entries = pending[tv]
    local lk = new_lock()
    local got, lerr, lcode = lk:try_lock(tv)
    if not got then
      for _, p in ipairs(entries) do
        if lerr == "busy" then
          report.busy = report.busy + 1
          note(p.item, tv, "busy", "session is busy")
        else
          fail(p.item, tv, p.action, "cannot lock session: " .. tostring(lerr), lcode or "LOCK")
        end
      end
    else
      local state = decode_state(lk:get_state())
      -- Refine a running sandbox's last activity with the remembered last run.
      local keep = {}
      for _, p in ipairs(entries) do
        local last_run = tonumber(state.last_run)
        if p.item.state == "running" and state.sandbox_id == p.item.sandbox_id and last_run
          and last_run > (p.item.last_activity or -math.huge) then
          p.item.last_activity = last_run
          local action, reason = ask(policy, p.item, { now = clock(), max_age = max_age, tag = tag, tag_value = tv })
          if not action then
            fail(p.item, tv, "policy", reason, "POLICY")
          elseif action == "keep" then
            report.kept = report.kept + 1
          else
            p.action, p.reason = action, reason
            keep[#keep + 1] = p
          end
        else
          keep[#keep + 1] = p
        end
      end
      batch[#batch + 1] = { tv = tv, lk = lk, state = state, entries = keep }
      size = size + max(#keep, 1)
      if size >= concurrency then
        act_batch(batch)
        batch, size = {}, 0
      end
    end
  end
  if #batch > 0 then act_batch(batch) end
  return report
end

-- ---------------------------------------------------------------------------
-- release
-- ---------------------------------------------------------------------------

--- Kills every sandbox whose tag equals `tag_value` exactly (a conversation
-- was deleted), waiting for the session's lock (the lock's `timeout`), and
-- clears the session's remembered state.
-- @tparam table opts client, tag ("warmboxSessionId"), tag_value, lock
-- @treturn[1] number how many sandboxes were killed
-- @return[2] nil, message, code ("BUSY" when the session stayed locked)
function _M.release(opts)
  check_opts(opts, RELEASE_OPTS, "release")
  local client, tag, tv = opts.client, opts.tag or "warmboxSessionId", opts.tag_value
  if type(tv) ~= "string" or tv == "" then
    error("bad argument #1 to 'release' (option 'tag_value': a non-empty string expected)", 2)
  end
  local lk = lock_mod.factory(opts.lock, nil, nil, "release")()
  local guard <close> = lock_mod.closing(lk) -- luacheck: ignore 211 (closed at scope exit)
  local _, lerr = lk:lock(tv)
  if lerr then return lock_mod.failure(fmt("session '%s'", tv), lerr) end
  local ids = {}
  local ok, err, code = each_listed(client, { state = { "running", "paused" }, metadata = { [tag] = tv },
                                              limit = 100 }, function(item)
    -- Exact re-check: a loose server-side match never hands over another session.
    if type(item.metadata) == "table" and item.metadata[tag] == tv then ids[#ids + 1] = item.sandbox_id end
  end)
  if not ok then
    lk:unlock()
    return nil, err, code
  end
  local killed, kerr, kcode = 0, nil, nil
  for _, id in ipairs(ids) do
    local r, e, c = client:kill(id)
    if r then
      killed = killed + 1
    elseif r == nil then
      kerr, kcode = e, c
    end
  end
  lk:set_state(nil)
  lk:unlock()
  if kerr then return nil, kerr, kcode end
  return killed
end

return _M
