--- warmbox.cli.args: the CLI's one argument reader and the readers of
-- option values every command shares. Misuse raises a message without
-- position (warmbox.cli prints it, exit status 2).
local tonumber, type, tostring = tonumber, type, tostring
local string_format = string.format

local _M = {}

--- Reads a command's arguments against `flags`: flag -> function(value, flag)
-- for an option with a value, or `{ function(flag) }` for a switch. Other
-- arguments go to `positional(arg)` (anything not starting with "--"), or are
-- refused.
-- syntax: cli_args.parse_args(args, cmd, flags, positional)
function _M.parse_args(args, cmd, flags, positional)
  local i = 1
  while i <= #args do
    local a = args[i]
    local f = flags[a]
    if type(f) == "table" then
      f[1](a)
    elseif f then
      i = i + 1
      if args[i] == nil then error("option " .. a .. " needs a value", 0) end
      f(args[i], a)
    elseif positional and a:sub(1, 2) ~= "--" then
      positional(a)
    else
      error("unknown argument " .. a .. " to " .. cmd, 0)
    end
    i = i + 1
  end
end

--- `--env K=V`: adds K to the table `env` (created when nil) and returns it.
-- syntax: env = cli_args.env_arg(env, "K=V")
function _M.env_arg(env, v)
  local k, val = v:match("^([^=]+)=(.*)$")
  if not k then error("--env needs K=V", 0) end
  env = env or {}
  env[k] = val
  return env
end

--- A number (an integer when `integer`) for option `flag`, or an error naming it.
-- syntax: n = cli_args.number_arg(flag, v, integer)
function _M.number_arg(flag, v, integer)
  local n = tonumber(v)
  if not n or (integer and math.type(n) ~= "integer") then
    error(string_format("option %s needs %s, got '%s'", flag, integer and "an integer" or "a number", v), 0)
  end
  return n
end

--- A duration for option `flag` (units s, m, h, d: "7d"; warmbox.policy.rules'), in seconds.
-- syntax: s = cli_args.duration_arg(flag, v)
function _M.duration_arg(flag, v)
  local rules = require "warmbox.policy.rules"
  local s, err = rules.duration(v or "")
  if not s then error(flag .. ": " .. tostring(err), 0) end
  return s
end

--- An integer >= `min` (default 1) for option `flag`.
-- syntax: n = cli_args.int_arg(flag, v, min)
function _M.int_arg(flag, v, min)
  local n = tonumber(v)
  if not n or math.type(n) ~= "integer" or n < (min or 1) then
    error(string_format("%s needs an integer >= %d, got '%s'", flag, min or 1, tostring(v)), 0)
  end
  return n
end

return _M
