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

local math_ceil, type, error, ipairs = math.ceil, type, error, ipairs

local _M = {}

local HOST = {}

function HOST.arm(hook, seconds)
  if hook.wb:pending() > 0 then hook.poll:ref() else hook.poll:unref() end
  hook.timer:stop()
  if seconds then hook.timer:start(math_ceil(seconds * 1000), 0, hook.on_timer) end
end

function HOST.kick(hook)
  hook.poll:ref()
  hook.timer:stop()
  hook.timer:start(0, 0, hook.on_timer)
end

function HOST.close(hook)
  for _, h in ipairs({ hook.poll, hook.timer, hook.prepare }) do
    if not h:is_closing() then h:close() end
  end
end

--- Attach `wb` to the luv loop.
-- @tparam warmbox.Warmbox wb
-- @tparam[opt] table opts `uv` (the luv module, default `require "luv"`)
-- @treturn table the hook (`detach()`)
function _M.attach(wb, opts)
  if type(wb) ~= "table" or type(wb.pollfd) ~= "function" then
    error("bad argument #1 to 'attach' (warmbox.Warmbox expected, got " .. type(wb) .. ")", 2)
  end
  local uv = opts and opts.uv or require "luv"
  local fd = wb:pollfd()
  local hook = require("warmbox.loop").hook(wb, HOST, "warmbox.loop.luv.Hook")
  hook.poll, hook.timer, hook.prepare = uv.new_poll(fd), uv.new_timer(), uv.new_prepare()
  hook.on_timer = function() hook:pump() end
  hook.poll:start("r", hook.on_timer)
  hook.poll:unref()
  -- before the loop blocks: tasks made ready by a callback since the last round
  hook.prepare:start(function()
    if not hook.detached and not wb.closed and wb:timeout() == 0 then hook:pump() end
  end)
  hook.prepare:unref()
  if wb:pending() > 0 then HOST.kick(hook) end
  return hook
end

return _M
