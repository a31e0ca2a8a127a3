--- warmbox.gc.act: what a GC pass does to a sandbox it decided to kill or
-- demote: lock its session, re-check, act.
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
-- Demote: a running sandbox is paused with `{ memory = false }`. A paused one
-- is resumed (`connect`, 60 s lease) and paused again with `{ memory = false }`:
-- E2B cannot turn a memory snapshot into a filesystem-only one in place.
--
-- `methods` are `warmbox.gc.pass`'s Pass methods; `release` kills the
-- sandboxes of a conversation (what `warmbox.gc.release` does).
-- @module warmbox.gc.act
local decide = require "warmbox.gc.decide"
local listing = require "warmbox.gc.listing"
local lock_mod = require "warmbox.lock"
local state_codec = require "warmbox.state"

local type, pairs, ipairs, tostring, pcall = type, pairs, ipairs, tostring, pcall
local fmt = string.format
local decode_state = state_codec.decode
local finish = listing.finish

local _M = { methods = {} }
local Pass = _M.methods

local DEMOTE_LEASE = 60

-- A collected or released session's lock: its state forgotten and, with
-- warmbox.lock, its files removed (lk:remove releases it; unlock after is a no-op).
local function forget(lk)
  if type(lk.remove) == "function" then return lk:remove() end
  return lk:set_state(nil)
end

-- (a pass holds a batch of locks across steps, so it closes them by hand;
-- release uses <close> through lock.closing.)
local function close_lock(lk)
  if type(lk.close) == "function" then pcall(lk.close, lk) end
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
  h = { lk = lk, refs = 1, state = decode_state(lk:get_state()) }
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
      h.lk:set_state(state_codec.encode(h.state))
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
        h.state.hooked = nil
        h.state.memory_lost = item.sandbox_id
        h.rewrite = true
      end
    end
  end
  self:done_with(e)
end

-- ---------------------------------------------------------------------------
-- release: a conversation's sandboxes
-- ---------------------------------------------------------------------------

-- Kills what `ids` names, in parallel where the client can (bounded; on the
-- engine inside a task): how many were killed, and the last error.
local function kill_all(client, ids, concurrency)
  local results, killed, kerr, kcode = {}, 0, nil, nil
  if client.kill_many and #ids > 1 then
    results = client:kill_many(ids, { concurrency = concurrency })
  else
    for i, id in ipairs(ids) do results[i] = { client:kill(id) } end
  end
  for i = 1, #ids do
    local r = results[i] or {}
    -- false: gone (404). Listed under the session's lock a moment ago, so
    -- killed by this release (a retry after a lost answer finds it gone).
    if r[1] ~= nil then
      killed = killed + 1
    elseif r[1] == nil then
      kerr, kcode = r[2], r[3]
    end
  end
  return killed, kerr, kcode
end

--- Kills the sandboxes of each session in `order` (tag values; `what` names
-- them in a lock error): each session is locked first (waiting for a run in
-- progress), its sandboxes listed under the lock and killed, its remembered
-- state forgotten. Returns how many were killed, or nil, err, code.
function _M.release(client, tag, order, what, new_lock, concurrency)
  local killed = 0
  for _, v in ipairs(order) do
    local lk = new_lock()
    local _, lerr = lk:lock(v)
    if lerr then
      close_lock(lk)
      return lock_mod.failure(fmt("session '%s'", what or v), lerr)
    end
    local ids = {}
    local ok, err, code = listing.each_listed(client, { state = { "running", "paused" }, metadata = { [tag] = v } },
      function(item)
        -- Exact re-check: a loose server-side match never hands over another session.
        if type(item.metadata) == "table" and item.metadata[tag] == v then ids[#ids + 1] = item.sandbox_id end
      end)
    local kerr, kcode = err, code
    if ok then
      -- A checkpoint's snapshot made twice left an unnamed one of these sandboxes.
      local drop_strays = require("warmbox.checkpoint").drop_strays
      for _, id in ipairs(ids) do drop_strays(client, id) end
      local n
      n, kerr, kcode = kill_all(client, ids, concurrency)
      killed = killed + n
      if not kerr then forget(lk) end
    end
    lk:unlock()
    close_lock(lk)
    if kerr then return nil, kerr, kcode end
  end
  return killed
end

return _M
