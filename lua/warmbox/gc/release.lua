--- warmbox.gc.release: kills the sandboxes of conversations (what
-- `warmbox.gc.release` and `wb:release` do), and the two lock helpers a GC
-- pass shares with it (`close_lock`; the lock's state is dropped with
-- `warmbox.session.memo.drop`). Requires no other GC module.
-- @module warmbox.gc.release
local listing = require "warmbox.gc.listing"
local lock_mod = require "warmbox.lock"
local memo = require "warmbox.session.memo"

local type, ipairs, pcall = type, ipairs, pcall
local fmt = string.format

local _M = {}

-- (a pass holds a batch of locks across steps, so it closes them by hand;
-- release uses <close> through lock.closing.)
-- syntax: release.close_lock(lk) (the lock helpers a GC pass shares with it)
function _M.close_lock(lk)
  if type(lk.close) == "function" then pcall(lk.close, lk) end
end

local forget, close_lock = memo.drop, _M.close_lock

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
-- syntax: n = release.release(client, tag, order, what, new_lock, concurrency) (a conversation's sandboxes
--   killed under its lock)
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
      local drop_strays = require("warmbox.session.checkpoint").drop_strays
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
