-- Do two long cells of different conversations run at once behind lighttpd?
-- TRIES times, two 3 s cells (conversations a and b, warm) are sent at the same
-- moment, each on a new connection, to
--   mod_magnet    examples/lighttpd (warmbox.lua in lighttpd, 2 workers): the
--                 kernel hands each connection to a worker, a busy one too
--   service       examples/lighttpd/service.lua behind lighttpd-service.conf
--                 (2 workers, SCGI): every request a task on one luv loop
-- and the wall time until both answered is printed (about 3 s: side by side;
-- about 6 s: one waited for the other), with a ping sent 1 s into each try.
--
--   lua5.4 bench/lighttpd_isolation.lua [TRIES]      (after scripts/setup; default 6)
-- It runs under a fresh XDG_RUNTIME_DIR: its own shared local server.
if not os.getenv("WARMBOX_BENCH_RUNDIR") then
  local p = assert(io.popen("mktemp -d /tmp/wb-bench-lighttpd.XXXXXX"))
  local dir = p:read("l")
  p:close()
  local ok = os.execute(string.format("WARMBOX_BENCH_RUNDIR=%s XDG_RUNTIME_DIR=%s lua5.4 %s %s", dir, dir, arg[0],
    arg[1] or ""))
  -- its shared server ends with it, whatever happened (ours: the state file's pid)
  local here = arg[0]:match("^(.*)/[^/]*$") or "."
  os.execute(string.format("XDG_RUNTIME_DIR=%s LUA_PATH='%s/../lua/?.lua;%s/../lua/?/init.lua;;' "
    .. "LUA_CPATH='%s/../build/?.so;%s/../build/?/?.so;;' lua5.4 -e 'require(\"warmbox.server\").stop_local()'",
    dir, here, here, here, here))
  os.execute("rm -rf " .. dir)
  os.exit(ok and 0 or 1)
end

local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")
local hosts = require "spec.helpers.hosts"
local wbd = require "spec.helpers.warmboxd"
local core = require "warmbox.core"

local q = wbd.sh_quote
local TRIES = tonumber(arg[1]) or 6
-- one line: lighttpd refuses control characters (a newline) in a URL
local LONG = "import time; time.sleep(3); 'done'"

local function wait_for(url)
  assert(wbd.eventually(function() return hosts.http("GET", url, nil, 5) ~= nil end, 30), "no answer at " .. url)
end

-- One try: both cells at once (curl in the background), the ping 1 s later.
-- → seconds until both answered, seconds the ping took
local function try(run_url, ping_url)
  local outs = { os.tmpname(), os.tmpname() }
  local t0 = core.now()
  for i, k in ipairs({ "a", "b" }) do
    os.execute("(curl -s -o /dev/null -w '%{http_code}' " .. q(run_url(k, LONG)) .. " >" .. q(outs[i]) .. " &)")
  end
  core.sleep(1)
  local p0 = core.now()
  hosts.http("GET", ping_url, nil, 30)
  local ping = core.now() - p0
  assert(wbd.eventually(function()
    return (wbd.read_all(outs[1]) or "") ~= "" and (wbd.read_all(outs[2]) or "") ~= ""
  end, 60))
  local wall = core.now() - t0
  for _, o in ipairs(outs) do
    assert(wbd.read_all(o) == "200", "a cell failed: " .. tostring(wbd.read_all(o)))
    os.remove(o)
  end
  return wall, ping
end

local function report(name, run_url, ping_url)
  for _, k in ipairs({ "a", "b" }) do hosts.http("GET", run_url(k, "0")) end -- warm
  local walls, pings, serial = {}, {}, 0
  for i = 1, TRIES do
    local wall, ping = try(run_url, ping_url)
    walls[i], pings[i] = string.format("%.1f", wall), string.format("%.2f", ping)
    if wall > 5 then serial = serial + 1 end
  end
  print(string.format("%-11s both answered after (s): %s   one waited for the other: %d of %d   "
    .. "ping during a cell (s): %s", name, table.concat(walls, " "), serial, TRIES, table.concat(pings, " ")))
end

local function urlenc(s)
  return (s:gsub("[^%w%-_%.~]", function(c) return string.format("%%%02X", c:byte()) end))
end

local dir = hosts.root() .. "/examples/lighttpd"
local errlog = os.tmpname()

-- mod_magnet, 2 workers
local port = hosts.free_port()
local magnet = hosts.start("WARMBOX_EXAMPLE_DIR=" .. q(dir) .. " PORT=" .. port .. " LIGHTTPD_ERRORLOG=" .. q(errlog)
  .. " lighttpd -D -f examples/lighttpd/lighttpd.conf", "()", 5)
local base = "http://127.0.0.1:" .. port
wait_for(base .. "/run")
report("mod_magnet", function(k, code) return base .. "/run?key=iso%3A" .. k .. "&code=" .. urlenc(code) end,
  base .. "/run?key=iso%3Aping&code=0")
hosts.stop(magnet)

-- lighttpd in front of the service
local service = hosts.start("lua5.4 examples/lighttpd/service.lua 0", "listening on 127%.0%.0%.1:(%d+)")
port = hosts.free_port()
local front = hosts.start("WARMBOX_EXAMPLE_DIR=" .. q(dir) .. " PORT=" .. port .. " SERVICE_PORT=" .. service.port
  .. " LIGHTTPD_ERRORLOG=" .. q(errlog) .. " lighttpd -D -f examples/lighttpd/lighttpd-service.conf", "()", 5)
base = "http://127.0.0.1:" .. port
wait_for(base .. "/ping")
report("service", function(k, code) return base .. "/run?key=iso%3A" .. k .. "&code=" .. urlenc(code) end,
  base .. "/ping")
hosts.stop(front)
hosts.stop(service)
os.remove(errlog)
require("warmbox.server").stop_local()
local _ = env
