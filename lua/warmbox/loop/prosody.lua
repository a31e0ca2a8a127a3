--- warmbox on Prosody's event loop (its `net.server`: epoll, select or libevent):
-- the engine's fd is watched with `server.watchfd` and its timeout with
-- `util.timer`, so tasks run while Prosody serves everything else.
--
--   -- in a Prosody module (see examples/prosody/mod_warmbox.lua):
--   local wb = assert(require("warmbox").new{})
--   local hook = require("warmbox.loop.prosody").attach(wb)
--   wb:spawn(function() return wb:session(key):run(code) end)
--     :on_done(function(t) response:send(...) end)          -- from any handler
--   function module.unload() hook:detach(); wb:close() end
--
-- `wb:spawn` is wrapped (on this object, until detach) to arm a timer at once,
-- so a task spawned from any handler runs with no further call.
-- @module warmbox.loop.prosody

local type, error = type, error

local _M = {}

local HOST = {}

function HOST.arm(hook, seconds)
  local timer = hook.timer
  if hook.timer_id then timer.stop(hook.timer_id) end
  hook.timer_id = seconds and timer.add_task(seconds, hook.on_timer) or nil
end

function HOST.close(hook)
  HOST.arm(hook, nil)
  hook.watch:close()
end

--- Attach `wb` to Prosody's loop.
-- @tparam warmbox.Warmbox wb
-- @tparam[opt] table opts `server` (default `require "net.server"`), `timer`
--   (default `require "util.timer"`)
-- @treturn table the hook (`detach()`)
function _M.attach(wb, opts)
  if type(wb) ~= "table" or type(wb.pollfd) ~= "function" then
    error("bad argument #1 to 'attach' (warmbox.Warmbox expected, got " .. type(wb) .. ")", 2)
  end
  opts = opts or {}
  local fd = wb:pollfd()
  local hook = require("warmbox.loop").hook(wb, HOST, "warmbox.loop.prosody.Hook")
  hook.timer = opts.timer or require "util.timer"
  hook.on_timer = function()
    hook.timer_id = nil
    hook:pump()
  end
  local server = opts.server or require "net.server"
  hook.watch = server.watchfd(fd, function() hook:pump() end)
  if wb:pending() > 0 then HOST.arm(hook, 0) end
  return hook
end

return _M
