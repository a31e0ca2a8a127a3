--- What the host-loop adapters (`warmbox.loop.luv`, `.prosody`; `.cqueues` uses
-- `wrap_spawn`) share: a hook that steps `wb` when its fd or timer fires and
-- re-arms the host's timer for `wb:timeout()`.
-- @module warmbox.loop

local rawget, setmetatable = rawget, setmetatable

local _M = {}

--- Wrap `wb:spawn` on this object so that every spawn calls `kick()` (the
-- adapter arms its loop: a task spawned from any callback, or before the loop
-- runs, is run with no further call). Returns the function that undoes it.
-- @tparam warmbox.Warmbox wb
-- @tparam function kick
-- @treturn function unwrap
function _M.wrap_spawn(wb, kick)
  local spawn, own = wb.spawn, rawget(wb, "spawn")
  local function wrapper(w, ...)
    local t = spawn(w, ...)
    kick()
    return t
  end
  wb.spawn = wrapper
  return function()
    if rawget(wb, "spawn") == wrapper then wb.spawn = own end
  end
end

local Hook = {}
Hook.__index = Hook

--- A hook of `wb` on a host loop. `host` gives `arm(hook, seconds)` (re-arm the
-- host's one-shot timer; `nil`: stop it), `kick(hook)` (a task was spawned:
-- run a round soon; default `arm(hook, 0)`) and `close(hook)` (release the
-- host's handles). The adapter calls `hook:pump()` from its fd watch and timer.
-- @treturn table the hook (`pump()`, `detach()`)
function _M.hook(wb, host, name)
  local self = setmetatable({ wb = wb, host = host }, { __index = Hook, __name = name })
  self.unwrap = _M.wrap_spawn(wb, function()
    if self.detached then return end
    if host.kick then host.kick(self) else host.arm(self, 0) end
  end)
  return self
end

--- One round: the ready tasks and the engine, then the timer re-armed.
function Hook:pump()
  if self.detached then return end
  local wb = self.wb
  if not wb.closed then wb:step(0) end
  if wb.closed then return self:detach() end
  self.host.arm(self, wb:timeout())
end

--- Stop watching (the host's handles are released). Idempotent.
function Hook:detach()
  if self.detached then return true end
  self.detached = true
  self.unwrap()
  self.host.close(self)
  return true
end

return _M
