--- `warmbox server start|stop|status`: the per-user warmboxd in the background.
local tostring, pcall, ipairs = tostring, pcall, ipairs
local string_format = string.format

local fail = require("warmbox.cli.common").fail
local cli_args = require "warmbox.cli.args"
local parse_args, int_arg = cli_args.parse_args, cli_args.int_arg

local _M = {}

-- How the per-user server ends (its state's idle_exit: warmboxd --idle-exit).
local function server_ending(st)
  local idle = math.tointeger(st.idle_exit)
  local maxr = math.tointeger(st.max_running)
  return string_format("it ends %s`warmbox server stop`; paused sandboxes are kept for its next start "
    .. "(files, not memory)\n", idle and string_format("once no sandbox has run for %d s, or on ", idle) or "on ")
    .. (maxr and string_format("it runs %s sandboxes at once (--max-running)\n",
      maxr == 0 and "any number of" or "at most " .. maxr) or "")
end

--- The command: status 0, 2, or 3 (status: not running).
function _M.execute(o, args, io_)
  local server = require "warmbox.server"
  local sub = args[1]
  if not (sub == "start" or sub == "stop" or sub == "status") or (sub ~= "start" and #args ~= 1) then
    error("usage: warmbox server start [--max-running N] [--idle-exit S] | stop | status", 0)
  end
  local out = io_.stdout
  if sub == "start" then
    local sopts = { bin = o.warmboxd }
    local flags = {}
    for _, set in ipairs(server.SETTINGS) do
      flags[set.flag] = function(v, flag) sopts[set.name] = int_arg(flag, v, 0) end
    end
    parse_args({ table.unpack(args, 2) }, "server start", flags)
    local st, already, code = server.start_local(sopts)
    if not st then return fail(io_.stderr, "cannot start the local server: " .. tostring(already), code) end
    out:write(string_format("%s at %s (pid %d; state in %s)\n", already and "already running" or "started",
      st.url, st.pid, server.state_path()), server_ending(st))
    return 0
  elseif sub == "stop" then
    local st = server.stop_local()
    if st then
      out:write(string_format("stopped the local server at %s (pid %d)\n", st.url, st.pid))
    else
      out:write("no local server was running\n")
    end
    return 0
  end
  local st, why = server.local_server()
  if not st then
    out:write("not running (" .. tostring(why) .. ")\n")
    return 3
  end
  out:write(string_format("running at %s (pid %d; state in %s)\n", st.url, st.pid, server.state_path()),
    server_ending(st))
  local ok, wb = pcall(require("warmbox").new, { api_url = st.url, api_key = st.api_key, sandbox_url = st.url,
    lock = "memory" })
  if ok and wb then
    local list = wb:sessions()
    if list then out:write(string_format("%d session%s\n", #list, #list == 1 and "" or "s")) end
    wb:close()
  end
  return 0
end

return _M
