--- warmbox.sim.lock: session locks for one simulation.
--
-- The methods of a `warmbox.lock` object (`lock`, `try_lock`, `unlock`,
-- `expire`, `keepalive`, `fence`, `get_state`, `set_state`, `remove`, `key`, `close`,
-- `wait_counts`) over a table owned by one
-- simulation. `warmbox.lock`'s memory backend is not used because its
-- per-key state is process-wide (two simulations in one process, or a host
-- that also uses the memory backend, would share remembered sandboxes) and
-- its expiry and waits use the real clock. Made with a `warmbox.task`
-- scheduler, `lock` waits for a held key in virtual time (FIFO) inside its
-- tasks; otherwise a held key answers `nil, "timeout"` (`lock`) at once.
-- `try_lock` answers `nil, "busy"` at once.
--
--   local new_lock = require("warmbox.sim.lock").factory()
--   local lk = new_lock()
--   assert(lk:lock("key")); lk:set_state("..."); lk:unlock()
-- @module warmbox.sim.lock

local type, error, setmetatable = type, error, setmetatable

local _M = {}

local Lock = {}
Lock.__index = Lock
Lock.__name = "warmbox.sim.Lock"

local function take(self, key, err)
  if type(key) ~= "string" then error("bad argument #1 to 'lock' (string expected, got " .. type(key) .. ")", 3) end
  if self._key then return nil, "locked" end
  if self.world.held[key] then return nil, err end
  self.world.held[key] = self
  self._key = key
  local f = (self.world.fences[key] or 0) + 1
  self.world.fences[key], self._fence = f, f
  return true
end

--- Takes the lock on `key`: seconds waited | nil, "timeout" | nil, "locked".
-- Inside a task of the factory's scheduler a held key is waited for (FIFO,
-- in virtual time); elsewhere it answers `nil, "timeout"` at once.
function Lock:lock(key)
  local ok, err = take(self, key, "timeout")
  if ok then return 0 end
  local sched = self.world.sched
  if err ~= "timeout" or not sched or not sched:current() then return nil, err end
  local t0 = sched:now()
  local waits = self.world.waits
  repeat
    local ev = waits[key]
    if not ev then ev = sched:event(); waits[key] = ev end
    ev:wait()
    self._wakes = (self._wakes or 0) + 1
    ok, err = take(self, key, "timeout")
  until ok or err ~= "timeout"
  if not ok then return nil, err end
  return sched:now() - t0
end

--- Takes the lock on `key` if free: true | nil, "busy" | nil, "locked".
function Lock:try_lock(key)
  return take(self, key, "busy")
end

--- Releases the lock: true | nil, "unlocked".
function Lock:unlock()
  local key = self._key
  if not key then return nil, "unlocked" end
  self._key = nil
  self.world.held[key] = nil
  local ev = self.world.waits[key]
  if ev then
    if ev:waiting() > 0 then ev:signal() else self.world.waits[key] = nil end
  end
  return true
end

--- Virtual locks do not expire: true | nil, "unlocked".
function Lock:expire()
  if not self._key then return nil, "unlocked" end
  return true
end

--- Virtual locks are never lost: true | nil, "unlocked".
function Lock:keepalive()
  if not self._key then return nil, "unlocked" end
  return true
end

--- Whether the hold is still this object's: in virtual time no lock is lost.
function Lock:held()
  if not self._key then return nil, "unlocked" end
  return true
end

--- The hold's fencing number (grows with every hold of the key), nil when nothing is held.
function Lock:fence()
  return self._key and self._fence or nil
end

--- Waits so far: polls (none: a release wakes a virtual waiter), wakes.
function Lock:wait_counts()
  return 0, self._wakes or 0
end

--- The key's shared state, only while held.
function Lock:get_state()
  if not self._key then return nil, "unlocked" end
  return self.world.state[self._key]
end

--- Replaces the key's shared state (nil clears it), only while held.
function Lock:set_state(s)
  if s ~= nil and type(s) ~= "string" then
    error("bad argument #1 to 'set_state' (string or nil expected, got " .. type(s) .. ")", 2)
  end
  if not self._key then return nil, "unlocked" end
  self.world.state[self._key] = s
  return true
end

--- Forgets the key's state and releases the lock (warmbox.lock's `remove`):
-- true | nil, "unlocked".
function Lock:remove()
  if not self._key then return nil, "unlocked" end
  self.world.state[self._key] = nil
  return self:unlock()
end

--- The key held, or nil.
function Lock:key()
  return self._key
end

--- Releases the lock if held (idempotent): true.
function Lock:close()
  if self._key then self:unlock() end
  return true
end
Lock.__close = function(self) self:close() end

--- A lock constructor for one simulation: `function() return lock end`; every
-- lock it makes shares one table of held keys and states.
-- @tparam[opt] warmbox.task.Scheduler sched whose tasks wait for held keys
-- @treturn function
function _M.factory(sched)
  local world = { held = {}, state = {}, waits = {}, fences = {}, sched = sched }
  return function() return setmetatable({ world = world }, Lock) end
end

return _M
