-- Starts a throw-away redis-server on a free loopback port for specs, and
-- stops it afterwards. Usage, in a describe block:
--
--   local redis_helper = require "spec.helpers.redis"
--   local srv
--   lazy_setup(function() srv = redis_helper.start() end)
--   lazy_teardown(function() if srv then srv:stop() end end)
--   -- srv.host, srv.port, srv.pid, srv:log()
--
-- redis-server refuses --port 0, so a random port in 20000..59999 is tried
-- until one binds (up to 20 attempts). No persistence, loopback only.
-- M.available() is false when redis-server is not installed (specs skip).
local M = {}

local wbd = require "spec.helpers.warmboxd"
local q, read_all, alive, sleep = wbd.sh_quote, wbd.read_all, wbd.alive, wbd.sleep

function M.bin()
  return os.getenv("REDIS_SERVER_BIN") or "redis-server"
end

function M.available()
  return os.execute("command -v " .. q(M.bin()) .. " >/dev/null 2>&1") == true
end

local Server = {}
Server.__index = Server

local function try_start(dir, port)
  local logf = dir .. "/redis-" .. port .. ".log"
  local cmd = string.format("env -u LD_PRELOAD %s --port %d --bind 127.0.0.1 --save '' --appendonly no --daemonize no "
    .. "--dir %s --logfile '' >%s 2>&1 & echo $!", q(M.bin()), port, q(dir), q(logf))
  local p = assert(io.popen(cmd))
  local pid = tonumber(p:read("l"))
  p:close()
  local waited = 0
  while waited < 10 do
    local log = read_all(logf) or ""
    if log:find("Ready to accept connections", 1, true) then
      return pid, logf
    end
    if not alive(pid) then return nil, log end
    sleep(0.05)
    waited = waited + 0.05
  end
  os.execute("kill -KILL " .. pid .. " 2>/dev/null")
  return nil, "redis-server did not become ready"
end

function M.start(opts)
  opts = opts or {}
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. q(dir)))
  local last
  for _ = 1, opts.attempts or 20 do
    local port = math.random(20000, 59999)
    local pid, logf = try_start(dir, port)
    if pid then
      return setmetatable({ host = "127.0.0.1", port = port, pid = pid, dir = dir, log_path = logf }, Server)
    end
    last = logf
  end
  os.execute("rm -rf " .. q(dir))
  error("could not start redis-server: " .. tostring(last))
end

function Server:log()
  return read_all(self.log_path) or ""
end

-- Restarts the server on its port with nothing kept (SIGKILL, then a new
-- redis-server): what a crash of a Redis without persistence loses.
function Server:restart()
  os.execute("kill -KILL " .. self.pid .. " 2>/dev/null")
  while alive(self.pid) do sleep(0.02) end
  os.remove(self.log_path) -- try_start waits for its "Ready" line
  local pid, logf
  for _ = 1, 100 do
    pid, logf = try_start(self.dir, self.port)
    if pid then break end
    sleep(0.05)
  end
  self.pid, self.log_path = assert(pid, logf), logf
end

-- Stops the server: SIGTERM, then SIGKILL after a grace period; removes its dir.
function Server:stop()
  if self.stopped then return true end
  self.stopped = true
  os.execute("kill -TERM " .. self.pid .. " 2>/dev/null")
  local waited = 0
  while alive(self.pid) and waited < 10 do
    sleep(0.05)
    waited = waited + 0.05
  end
  if alive(self.pid) then os.execute("kill -KILL " .. self.pid .. " 2>/dev/null") end
  if self.dir:match("^/tmp/") then os.execute("rm -rf " .. q(self.dir)) end
  return true
end

return M
