--- warmbox.lock.memory: the memory backend of warmbox.lock, this Lua state
-- only (a dead holder frees its keys with the state). The backend interface
-- (every backend has it; warmbox.lock calls it) is described in
-- lua/warmbox/lock/init.lua.
local queue = require "warmbox.lock.queue"
local next_fence = require("warmbox.lock.common").next_fence

local _M = {}

-- key -> state string; pkey -> queue; pkey -> the last fencing number
local mem_state, mem_queues, mem_fence = {}, {}, {}

function _M.ns() return "memory\0" end

function _M.acquire(lk, _, e, _, mode, local_busy)
  local q = mem_queues[e.pkey] or queue.new()
  mem_queues[e.pkey] = q
  local _, got, err, code, head = queue.step(lk, q, e, mode, local_busy, function()
    e.fence = next_fence(mem_fence[e.pkey])
    mem_fence[e.pkey] = e.fence
    return e
  end)
  if #q.list == 0 then mem_queues[e.pkey] = nil end
  return got, err, code, head
end

function _M.leave(_, _, pkey, token)
  local q = mem_queues[pkey]
  if q then
    queue.leave(q, token)
    if #q.list == 0 then mem_queues[pkey] = nil end
  end
end

function _M.release() return true end
function _M.expire() return true end
function _M.keepalive() return true end
function _M.get_state(_, key) return mem_state[key] end

function _M.set_state(_, key, _, s)
  mem_state[key] = s
  return true
end

return _M
