--- warmbox.gc.pass: one GC pass as an object.
--
-- A `Pass` holds what the pass was given (its settings and collaborators,
-- all set when it is made: the client it acts with, the runner its tasks use,
-- the lock factory), what it has done (the report, the counts the policy
-- sees) and what it holds (its listing, the session locks, the queue of
-- re-checked kills). Its methods decide the pages listed (with
-- `warmbox.gc.decide`), then lock, re-check and act; `warmbox.gc.drive`
-- runs the steps.
--
-- What it does to a sandbox it decided to kill or demote: lock its session,
-- re-check, act.
--
-- It never acts on a busy session: before acting it try-locks the session
-- (the lock key is the tag value) and re-checks the sandbox: the page is
-- listed again from the same cursor (one request per page, cursors are
-- stable under kills) and a sandbox that is missing from it, or whose state,
-- `end_at`, `started_at` or tag changed since it was listed, is skipped. A
-- client without `batch` (the simulator's model) re-checks with `info`.
-- Under the lock, a later last run the session remembers of that sandbox
-- refines its last activity, and the policy is asked again.
--
-- A create made twice (an intermediary forwarded it twice, or a retry after a
-- 503/429 that had been forwarded): two sandboxes of one session carry the
-- same create id. Whatever the policy says, the one that is not the
-- session's remembered sandbox is killed (locked and re-checked as any
-- kill: never a busy session's, never the remembered one); a session that
-- remembers neither keeps both. Pairs are found within a pass, acted on
-- within a page.
--
-- Demote: a running sandbox is paused with `{ memory = false }`. A paused one
-- is resumed (`connect`, 60 s lease) and paused again with `{ memory = false }`:
-- E2B cannot turn a memory snapshot into a filesystem-only one in place.
-- @module warmbox.gc.pass
local decide = require "warmbox.gc.decide"
local listing = require "warmbox.gc.listing"
local release = require "warmbox.gc.release"
local memo = require "warmbox.session.memo"

local type, pairs, ipairs, tostring, setmetatable, next =
  type, pairs, ipairs, tostring, setmetatable, next

local _M = {}

local Pass = { __name = "warmbox.gc.Pass" }
Pass.__index = Pass

local forget, close_lock = memo.drop, release.close_lock
local CREATE_TAG = require("warmbox.tag").CREATE_TAG
local decode_state = memo.read
local finish = listing.finish
local DEMOTE_LEASE = 60

-- Whether the pass is called from a task: of `caller` (the runner the caller
-- gave: warmbox's own), or, given none, of any runner (`runner.running()`).
local function in_task(caller)
  if caller then return caller:where() ~= nil end
  return require("warmbox.runner").running() ~= nil
end

-- GC's own tasks on the event engine (`warmbox.runner`), for a warmbox.e2b
-- client used outside any task: the runner and a client like `client` whose
-- requests go on that runner's engine inside its tasks. nil otherwise
-- (another client, one with a transport of its own, or called from a task:
-- then the batch loop, whose requests go on the caller's engine).
local function on_engine(client, caller)
  -- a warmbox.e2b client says so by `with_transport` (as warmbox.new checks)
  if type(client.with_transport) ~= "function" or client.transport ~= nil or client.http == nil then return nil end
  if in_task(caller) then return nil end
  local runner = require "warmbox.runner"
  local r = runner.new()
  if not r then return nil end
  return r, client:with_transport(runner.transport(client.http, r))
end

--- A pass, from `warmbox.gc.run`'s checked options `s` (defaults applied):
-- `client`, `tag`, `policy`, `clock`, `concurrency`, `max_age`, `max_kills`,
-- `dry_run`, `new_lock`, `limit`, `pages`, `next_token`, `on_action`,
-- `on_page`, `actions`, the listing's ends (`both`, `resume_from`) and
-- `caller` (the runner whose task may be calling, or nil).
function _M.new(s)
  local client, policy = s.client, s.policy
  local self = setmetatable({
    client = client, tag = s.tag, policy = policy, clock = s.clock, concurrency = s.concurrency,
    max_age = s.max_age, max_kills = s.max_kills, dry_run = s.dry_run, new_lock = s.new_lock, limit = s.limit,
    on_action = s.on_action, on_page = s.on_page,
    tenant_of = type(policy.tenant) == "function" and policy.tenant or decide.default_tenant,
    pipelined = type(client.batch) == "function",
    listing = listing.new(client, { limit = s.limit, both = s.both, resume_from = s.resume_from,
      next_token = s.next_token, pages = s.pages }),
    report = { listed = 0, tagged = 0, orphans = 0, kept = 0, killed = 0, demoted = 0, busy = 0, skipped = 0,
      failed = 0, pages = 0, budget_kept = 0, errors = {}, actions = s.actions ~= false and {} or nil,
      dry_run = s.dry_run },
    -- decisions so far (what the policy sees as counts): per tenant and in total
    tenants = {}, totals = { seen = 0, kept = 0, kill = 0, demote = 0 },
    -- session locks held: tag value -> { lk, refs, state, forget, rewrite }
    held = {},
    -- re-checked kills, FIFO
    queue = {}, qhead = 1, qtail = 0,
    -- the sandboxes seen per session and create id (tag value .. "\0" .. create id -> { id = true })
    creates = {},
  }, Pass)
  if not s.dry_run then
    -- the pass's requests on its own tasks when it can (the runner is the drive's to close)
    local r, tc = on_engine(client, s.caller)
    if r then self.runner, self.client = r, tc end
  end
  return self
end

--- An action the pass reports (`report.actions`, `on_action`).
function Pass:note(item, action, reason)
  local a = { sandbox_id = item.sandbox_id, session = item.tag_value, key = item.key, tenant = item.tenant,
              action = action, reason = reason }
  local report = self.report
  if report.actions then report.actions[#report.actions + 1] = a end
  if self.on_action then self.on_action(a) end
end

--- An action that failed (`report.errors`, `on_action` with action "error").
function Pass:fail(item, action, msg, code)
  local report = self.report
  report.failed = report.failed + 1
  local e = { sandbox_id = item.sandbox_id, session = item.tag_value, action = action, message = msg, code = code }
  report.errors[#report.errors + 1] = e
  if self.on_action then
    self.on_action({ sandbox_id = item.sandbox_id, session = item.tag_value, key = item.key, tenant = item.tenant,
                     action = "error", reason = tostring(msg), code = code, failed = action })
  end
end

function Pass:count(item, action, d)
  decide.count(self.tenants, self.totals, item, action, d)
end

--- An action decided but not done: the sandbox counts as kept when it still
-- exists (busy, changed, failed), so caps later in the pass see it.
function Pass:undo(item, action, exists)
  decide.count(self.tenants, self.totals, item, action, -1)
  if exists then decide.count(self.tenants, self.totals, item, "keep", 1) end
end

--- The policy's action for `item` and its reason, or nil and a message.
function Pass:decide(item)
  local ctx = decide.context(self, self.clock(), item, self.tenants, self.totals)
  local action, reason = decide.ask(self.policy.gc, item, ctx)
  if not action then return nil, reason end
  local budget_kept
  action, reason, budget_kept = decide.budget(action, reason, self.max_kills, self.totals.kill)
  if budget_kept then self.report.budget_kept = self.report.budget_kept + 1 end
  return action, reason
end

-- The key of `item`'s create (its session and create id), or nil.
local function create_key(item)
  local cid = type(item.metadata) == "table" and item.metadata[CREATE_TAG]
  return type(cid) == "string" and item.tag_value .. "\0" .. cid or nil
end

--- The items of a page kept by the policy whose create made another sandbox
-- seen in the pass (see the module comment) become kill entries `dup`,
-- decided under their session's lock (`Pass:lock_entries`).
function Pass:twins(page, entries)
  local creates, twins = self.creates, {}
  for _, p in ipairs(page) do
    local k = create_key(p.item)
    if k then
      local seen = creates[k] or {}
      creates[k] = seen
      seen[p.item.sandbox_id] = true
      if next(seen, next(seen)) then twins[k] = true end
    end
  end
  if self.dry_run then return end -- which one goes is known only under the lock
  for _, p in ipairs(page) do
    local x = p.item
    if p.kept and twins[create_key(x)] then
      self:count(x, "keep", -1)
      self:count(x, "kill", 1)
      self.report.kept = self.report.kept - 1
      entries[#entries + 1] = { item = x, action = "kill", reason = "another sandbox of its create", dup = true }
    end
  end
end

-- Whether a `dup` entry's sandbox may go: its session remembers another
-- sandbox of the same create.
function Pass:dup_collectable(item, st)
  local rid = type(st) == "table" and st.sandbox_id
  local seen = self.creates[create_key(item)]
  return type(rid) == "string" and rid ~= item.sandbox_id and seen ~= nil and seen[rid] == true
end

--- A listed page: decides each tagged item; returns the entries to act on,
-- `{ item, action, reason }`.
function Pass:take_page(items)
  local report, totals = self.report, self.totals
  report.pages = report.pages + 1
  local entries, page = {}, {}
  for _, d in ipairs(items) do
    report.listed = report.listed + 1
    local item = decide.item(d, self.tag, self.tenant_of)
    if item then
      report.tagged = report.tagged + 1
      if item.orphan then report.orphans = report.orphans + 1 end
      totals.seen = totals.seen + 1
      local action, reason = self:decide(item)
      if not action then
        self:fail(item, "policy", reason, "POLICY")
      else
        self:count(item, action, 1)
        if action == "keep" then
          report.kept = report.kept + 1
          if reason then self:note(item, "keep", reason) end
          page[#page + 1] = { item = item, kept = true }
        else
          entries[#entries + 1] = { item = item, action = action, reason = reason }
          page[#page + 1] = { item = item }
        end
      end
    end
  end
  self:twins(page, entries)
  return entries
end

--- A page of direction d listed (`used` its token, `nxt` the next): what the
-- other direction took is dropped, the rest decided. Returns the entries to
-- act on; their page stays open (resume tokens) until they are finished.
function Pass:listed(d, items, used, nxt)
  local kept, page_key = self.listing:take(d, items, nxt)
  local taken = self:take_page(kept)
  if #taken > 0 then listing.open(d, used, page_key, taken) end
  return taken
end

--- How many re-checked kills wait.
function Pass:queued()
  return self.qtail - self.qhead + 1
end

--- The page at `token` is decided: the report's tokens, `on_page`.
function Pass:page_done(token)
  local report = self.report
  local nxt = self.listing:token(false)
  report.next_token = nxt
  report.resume_token = self.listing:token(true)
  if self.on_page then
    self.on_page({ token = token, next_token = nxt, resume_token = report.resume_token, report = report,
                   queued = self:queued() })
  end
end

--- The pass is over: where the next one continues (nil: the listing is done).
function Pass:finish_tokens()
  local report = self.report
  report.next_token = self.listing:token(false)
  report.resume_token = report.next_token
end

--- An entry is finished (acted on, or not: its page may close) and its
-- session's lock released.
function Pass:done_with(e)
  self:release_ref(e.item.tag_value)
  listing.finish(e)
end


-- ---------------------------------------------------------------------------
-- the session locks a pass holds
-- ---------------------------------------------------------------------------

--- Try-locks the session of tag value `tv` (once for all its entries): its
-- hold `{ lk, refs, state }`, or nil, err, code.
function Pass:acquire(tv)
  local h = self.held[tv]
  if h then
    h.refs = h.refs + 1
    return h
  end
  local lk = self.new_lock()
  local got, lerr, lcode = lk:try_lock(tv)
  if not got then
    close_lock(lk)
    return nil, lerr, lcode
  end
  h = { lk = lk, refs = 1, state = decode_state(lk) }
  self.held[tv] = h
  return h
end

--- One entry of session `tv` is done; its last one unlocks it (forgetting the
-- state when its sandbox was collected, or writing the changed state).
function Pass:release_ref(tv)
  local h = self.held[tv]
  h.refs = h.refs - 1
  if h.refs == 0 then
    if h.forget then
      forget(h.lk)
    elseif h.rewrite then
      memo.save(h.lk, h.state)
    end
    h.lk:unlock()
    close_lock(h.lk)
    self.held[tv] = nil
  end
end

--- Unlocks every session held (the pass is aborted).
function Pass:release_all()
  for tv, h in pairs(self.held) do
    h.lk:unlock()
    close_lock(h.lk)
    self.held[tv] = nil
  end
end

-- ---------------------------------------------------------------------------
-- lock, then re-check
-- ---------------------------------------------------------------------------

-- The policy asked again of an entry whose last activity the lock refined;
-- true when the sandbox stays.
local function decide_again(self, e)
  local item = e.item
  self:count(item, e.action, -1)
  local action, reason = self:decide(item)
  if not action then
    self:fail(item, "policy", reason, "POLICY")
    self:count(item, "keep", 1) -- it stays
    return true
  end
  self:count(item, action, 1)
  if action == "keep" then
    self.report.kept = self.report.kept + 1
    self:note(item, "keep", reason or "used since it was listed")
    return true
  end
  e.action, e.reason = action, reason
  return false
end

--- Locks the entries' sessions and refines a sandbox's last activity with
-- the remembered last run; returns the entries still to act on.
function Pass:lock_entries(entries)
  local out = {}
  for _, e in ipairs(entries) do
    local item = e.item
    local h, lerr, lcode = self:acquire(item.tag_value)
    if not h then
      self:undo(item, e.action, true)
      if lerr == "busy" then
        self.report.busy = self.report.busy + 1
        self:note(item, "busy", "session is busy")
      else
        self:fail(item, e.action, "cannot lock session: " .. tostring(lerr), lcode or "LOCK")
      end
      finish(e)
    elseif e.dup then
      -- another sandbox of its create: only when the session remembers the other
      if self:dup_collectable(item, h.state) then
        out[#out + 1] = e
      else
        self:undo(item, e.action, true)
        self.report.kept = self.report.kept + 1
        self:done_with(e)
      end
    else
      local last_run = decide.remembered(item, h.state)
      if last_run then item.last_activity = last_run end
      if last_run and decide_again(self, e) then
        self:done_with(e)
      else
        out[#out + 1] = e
      end
    end
  end
  return out
end

--- Demotes a sandbox (see the module comment): truthy, false (already
-- paused), or nil, err, code.
function Pass:demote(item)
  local c, id = self.client, item.sandbox_id
  if item.state == "paused" then
    local sb, cerr, ccode = c:connect(id, { timeout = DEMOTE_LEASE })
    if not sb then return nil, cerr, ccode end
  end
  local r, perr, pcode = c:pause(id, { memory = false })
  if r == nil then return nil, perr, pcode end
  return r
end

--- Re-checks a locked page's entries against `current` (id -> detail | false
-- when gone | nil when not seen): kills are queued, demotes done.
function Pass:rechecked(entries, current)
  local report = self.report
  for _, e in ipairs(entries) do
    local item = e.item
    local cur = current[item.sandbox_id]
    if cur and decide.unchanged(item, cur, self.tag) then
      if e.action == "kill" then
        self.qtail = self.qtail + 1
        self.queue[self.qtail] = e
      else
        self:acted(e, "demote", self:demote(item))
      end
    else
      self:undo(item, e.action, cur ~= false)
      report.skipped = report.skipped + 1
      if cur == false then
        self:note(item, "gone", "sandbox no longer exists")
      else
        self:note(item, "changed", "changed since it was listed (resumed, re-paused, retagged or gone)")
      end
      self:done_with(e)
    end
  end
end

--- A pending page listed again (`r`: the batch's list result): re-checked,
-- or, when that listing failed, nothing of it acted on.
function Pass:recheck_page(pending, r)
  if r[1] == false then
    for _, e in ipairs(pending.entries) do
      self:undo(e.item, e.action, true)
      self:fail(e.item, e.action, "re-check failed: " .. tostring(r[2]), r[3])
      self:done_with(e)
    end
    return
  end
  local current = {}
  for _, x in ipairs(r[1]) do current[x.sandbox_id] = x end
  self:rechecked(pending.entries, current)
end

--- A pending page re-checked with `info` (a client without batch): an entry
-- whose sandbox cannot be read fails, the others are re-checked.
function Pass:recheck_by_info(pending)
  local client, current = self.client, {}
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
      self:undo(e.item, e.action, true)
      self:fail(e.item, e.action, cur.failed[1], cur.failed[2])
      self:done_with(e)
    else
      kept[#kept + 1] = e
    end
  end
  self:rechecked(kept, current)
end

-- ---------------------------------------------------------------------------
-- kill
-- ---------------------------------------------------------------------------

--- The next queued kill's entry, or nil.
function Pass:next_kill()
  local qhead = self.qhead
  if qhead > self.qtail then return nil end
  local e = self.queue[qhead]
  self.queue[qhead] = nil
  self.qhead = qhead + 1
  return e
end

-- A kill or demote that did nothing: what the pass says, and whether the
-- sandbox still exists (it counts as kept).
local NOTHING_DONE = { kill = { "gone", "sandbox no longer exists", false },
  demote = { "changed", "already paused", true } }
local DONE = { kill = "killed", demote = "demoted" }

--- A kill or demote answered (`r`: truthy done, false nothing to do: already
-- gone or paused, nil failed with err, code): reported, and a done one told
-- to its session's remembered state.
function Pass:acted(e, action, r, err, code)
  local item, report = e.item, self.report
  if r == nil then
    self:undo(item, action, true)
    self:fail(item, action, err, code)
  elseif r == false then
    local nd = NOTHING_DONE[action]
    self:undo(item, action, nd[3])
    report.skipped = report.skipped + 1
    self:note(item, nd[1], nd[2])
  else
    report[DONE[action]] = report[DONE[action]] + 1
    self:note(item, action, e.reason)
    local h = self.held[item.tag_value]
    if h and h.state.sandbox_id == item.sandbox_id then
      if action == "kill" then
        h.forget = true -- the session's sandbox was collected
      else
        -- its kernel is gone: the session must install its output hooks again
        -- and its memory: a session with require_memory replaces it
        memo.kernel_lost(h.state, item.sandbox_id)
        h.rewrite = true
      end
    end
  end
  self:done_with(e)
end

return _M
