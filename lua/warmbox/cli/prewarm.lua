--- `warmbox prewarm`: get a session's sandbox ready for a run that is
-- coming (the command waits for it).
local tostring, pcall = tostring, pcall
local string_format = string.format

local args_ = require "warmbox.cli.args"
local common = require "warmbox.cli.common"

local parse_args, env_arg, number_arg = args_.parse_args, args_.env_arg, args_.number_arg
local fail, FAILED = common.fail, common.FAILED

local _M = {}

--- The command: status 0 or 2.
function _M.execute(o, args, io_)
  local key, within, actor, start, env
  local function session(v) key = v end
  parse_args(args, "prewarm", {
    ["--session"] = session, ["-s"] = session,
    ["--within"] = function(v, a) within = number_arg(a, v) end,
    ["--actor"] = function(v) actor = v end,
    ["--start"] = { function() start = true end },
    ["--env"] = function(v) env = env_arg(env, v) end,
  })
  if not key then error("prewarm needs --session KEY", 0) end
  local now = require("warmbox.core").now
  if not common.ensure_local_server(o, io_, start) then return FAILED end
  local wb = common.new_warmbox(o, io_)
  if not wb then return FAILED end
  local t0 = now()
  local ok, t = pcall(function() return wb:session(key, { env = env, actor = actor }):prewarm{ within = within } end)
  if not ok then
    wb:close()
    error(t, 0)
  end
  wb:loop()
  local info, msg, code = t:result()
  wb:close()
  if not info then return fail(io_.stderr, "prewarm failed: " .. tostring(msg), code) end
  local ms = math.floor((now() - t0) * 1000 + 0.5)
  if info.action == "busy" then
    io_.stdout:write(string_format("prewarmed %s: busy (a run holds the session) (%d ms)\n", key, ms))
  else
    io_.stdout:write(string_format("prewarmed %s: %s sandbox %s (%d ms)\n", key, info.action,
      tostring(info.sandbox_id), ms))
  end
  return 0
end

return _M
