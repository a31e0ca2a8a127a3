--- warmbox on a luv (libuv) loop: attach once, and tasks spawned at any time
-- (a TCP handler, a timer, another task's on_done) run and complete with no
-- manual kick.
--
--   local uv = require "luv"
--   local hook = require("warmbox.loop.luv").attach(wb)
--   -- anywhere, any time:
--   wb:spawn(function() return wb:session(key):run(code) end):on_done(function(t) reply(t:result()) end)
--   uv.run()                -- your handles and warmbox's tasks, on one loop
--   hook:detach()           -- (wb:close() detaches it too, at its next turn)
--
-- It watches the engine's fd (`wb:pollfd()`) and a timer for `wb:timeout()`,
-- and a prepare handle runs tasks that became ready in a callback before the
-- loop next blocks. While tasks are pending the fd watch keeps the loop alive;
-- with none pending it does not (uv.run() ends when your handles do). `wb:spawn`
-- is wrapped (on this object, until detach) so that a task spawned before
-- `uv.run()` keeps the loop alive too. After `detach()` outside a callback, let
-- the loop turn once (`uv.run("nowait")`) so that luv frees the handles.
-- @module warmbox.loop.luv

local math_ceil, type, error, setmetatable, ipairs, rawget = math.ceil, type, error, setmetatable, ipairs, rawget

local _M = {}

local Hook = {}
Hook.__index = Hook
Hook.__name = "warmbox.loop.luv.Hook"

-- One round: the ready tasks and the engine, then the timer re-armed.
local function pump(self)
  if self.detached then return end
  local wb = self.wb
  if wb.closed then return self:detach() end
  wb:step(0)
  if wb.closed then return self:detach() end
  if wb:pending() > 0 then self.poll:ref() else self.poll:unref() end
  self.timer:stop()
  local t = wb:timeout()
  if t then self.timer:start(math_ceil(t * 1000), 0, self.on_timer) end
end

--- Attach `wb` to the luv loop.
-- @tparam warmbox.Warmbox wb
-- @tparam[opt] table opts `uv` (the luv module, default `require "luv"`)
-- @treturn warmbox.loop.luv.Hook (`detach()`)
function _M.attach(wb, opts)
  if type(wb) ~= "table" or type(wb.pollfd) ~= "function" then
    error("bad argument #1 to 'attach' (warmbox.Warmbox expected, got " .. type(wb) .. ")", 2)
  end
  local uv = opts and opts.uv or require "luv"
  local self = setmetatable({ wb = wb, uv = uv }, Hook)
  self.poll, self.timer, self.prepare = uv.new_poll(wb:pollfd()), uv.new_timer(), uv.new_prepare()
  self.on_timer = function() pump(self) end
  self.poll:start("r", self.on_timer)
  self.poll:unref()
  -- before the loop blocks: tasks spawned (or woken) by a callback since the last round
  self.prepare:start(function()
    if not self.detached and not wb.closed and wb:timeout() == 0 then pump(self) end
  end)
  self.prepare:unref()
  -- a task spawned outside the loop's callbacks (before uv.run()) keeps it alive too
  local spawn, own = wb.spawn, rawget(wb, "spawn")
  local function wrapper(w, ...)
    local t = spawn(w, ...)
    if not self.detached then
      self.poll:ref()
      self.timer:stop()
      self.timer:start(0, 0, self.on_timer)
    end
    return t
  end
  wb.spawn = wrapper
  self.unwrap = function() if rawget(wb, "spawn") == wrapper then wb.spawn = own end end
  if wb:pending() > 0 then self.timer:start(0, 0, self.on_timer) end
  return self
end

--- Stop watching (the handles are closed). Idempotent.
function Hook:detach()
  if self.detached then return true end
  self.detached = true
  self.unwrap()
  for _, h in ipairs({ self.poll, self.timer, self.prepare }) do
    if not h:is_closing() then h:close() end
  end
  return true
end

return _M
