--- warmbox.sim.lock: session locks for one simulation.
--
-- The methods of a `warmbox.lock` object (`lock`, `try_lock`, `unlock`,
-- `expire`, `keepalive`, `get_state`, `set_state`, `key`, `close`) over a table owned by one
-- simulation. `warmbox.lock`'s memory backend is not used because its
-- per-key state is process-wide (two simulations in one process, or a host
-- that also uses the memory backend, would share remembered sandboxes) and
-- its expiry and waits use the real clock. The simulator runs one turn at a
-- time, so a lock is never contended while a session holds it; a held key
-- answers `nil, "timeout"` (`lock`) or `nil, "busy"` (`try_lock`) at once.
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
  return true
end

--- Takes the lock on `key`: 0 (seconds waited) | nil, "timeout" | nil, "locked".
function Lock:lock(key)
  local ok, err = take(self, key, "timeout")
  if not ok then return nil, err end
  return 0
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
-- @treturn function
function _M.factory()
  local world = { held = {}, state = {} }
  return function() return setmetatable({ world = world }, Lock) end
end

return _M
