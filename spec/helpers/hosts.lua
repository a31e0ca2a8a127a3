-- Real hosts for the examples' specs: start a host process
-- on loopback, wait for its address, talk to it, stop it.
local wbd = require "spec.helpers.warmboxd"

local q = wbd.sh_quote
local M = {}

M.COUNTER = "x = globals().get('x', 0) + 1\nx"

-- The tree's root, absolute (hosts change directory).
function M.root()
  local p = assert(io.popen("cd " .. q(wbd.root()) .. " && pwd"))
  local root = p:read("l")
  p:close()
  return root
end

-- LUA_PATH / LUA_CPATH that load this tree (lua/ and the build the specs use).
function M.lua_env()
  local build = require("warmbox.core").module_path():match("^(.*)/warmbox/[^/]*$")
  local root = M.root()
  return "LUA_PATH=" .. q(root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;;")
    .. " LUA_CPATH=" .. q(build .. "/?.so;" .. build .. "/?/?.so;;")
end

-- Starts `cmd` (a program and its arguments, run from the tree's root, without an E2B key)
-- in the background, its output in a log; waits until the log has a line
-- matching `ready` (a pattern with one capture: the port). Returns
-- { pid, port, log } or raises with the log.
function M.start(cmd, ready, seconds)
  local log = os.tmpname()
  -- exec: the pid is the host's own (stop signals it, not a shell around it);
  -- setsid: a group of its own (lighttpd ends its workers with kill(0, SIGTERM))
  local p = assert(io.popen("cd " .. q(wbd.root()) .. " && exec setsid env -u E2B_API_KEY -u E2B_API_URL "
    .. M.lua_env() .. " " .. cmd .. " >" .. q(log) .. " 2>&1 & echo $!"))
  local pid = tonumber(p:read("l"))
  p:close()
  local port
  local up = wbd.eventually(function()
    port = (wbd.read_all(log) or ""):match(ready)
    return port ~= nil or not wbd.alive(pid)
  end, seconds or 60)
  if not (up and port) then
    os.execute("kill " .. pid .. " 2>/dev/null")
    error("the host did not start: " .. tostring(wbd.read_all(log)), 2)
  end
  return { pid = pid, port = tonumber(port), log = log }
end

-- A loopback port free now (for hosts that take a fixed one).
function M.free_port()
  local socket = require "socket"
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

-- Stops a host started by M.start (SIGTERM, then SIGKILL after `grace` s).
function M.stop(h, grace)
  if not h then return end
  require("warmbox.server").kill(h.pid, grace or 20)
  os.remove(h.log)
end

-- An HTTP request on loopback (warmbox.core's client): status, body, headers.
function M.http(method, url, body, timeout)
  local http = require("warmbox.core").http{ timeout = timeout or 60 }
  local res, err = http:request{ method = method, url = url, body = body,
    headers = body and { ["Content-Type"] = "text/plain" } or nil }
  if http.close then http:close() end
  if not res then return nil, err end
  return res.status, res.body, res.headers
end

return M
