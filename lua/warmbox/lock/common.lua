--- warmbox.lock.common: what the lock's front (warmbox.lock) and its
-- backends share: the clock in ms, tokens, fencing numbers, the Redis keeper.
local core = require "warmbox.core"

local type, tostring = type, tostring
local fmt, floor = string.format, math.floor
local now = core.now

local _M = {}

--- The monotonic clock in whole milliseconds.
-- syntax: ms = common.now_ms()
function _M.now_ms() return floor(now() * 1000) end

local counter = 0

--- A fresh token (32 hex digits): unique across the processes and hosts
-- that share a backend.
-- syntax: token = common.new_token()
function _M.new_token()
  counter = counter + 1
  return core.sha256(fmt("%d:%.9f:%d:%s:%.17g", core.getpid(), now(), counter,
    tostring({}), math.random())):sub(1, 32)
end

--- Fencing: every acquisition of a key gets a number greater than any its
-- earlier holders got (`lk:fence()`); a key whose count `prev` was lost
-- starts again from the wall clock in ms, above any number an earlier count
-- can have reached.
-- syntax: n = common.next_fence(prev)
function _M.next_fence(prev)
  local base = os.time() * 1000
  if type(prev) ~= "number" or prev < base - 86400000 * 366 then return base end
  return prev + 1
end

--- Stops the keeper thread of entry `e` (the Redis backend's), if it has one.
-- syntax: common.stop_keeper(e)
function _M.stop_keeper(e)
  if e.keeper then
    e.keeper:stop()
    e.keeper = nil
  end
end

return _M
