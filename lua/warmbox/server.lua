--- An embedded warmboxd: the local E2B-compatible server that `warmbox.new{}`
-- starts on a free loopback port when no E2B key is configured.
--
--   local server = require "warmbox.server"
--   local srv = assert(server.start{ args = { "--rtt-ms", "20" } })
--   -- srv.url, srv.api_key, srv.pid, srv:log()
--   srv:stop()          -- also on __close and __gc
--
-- The binary: `opts.bin`, else `$WARMBOXD_BIN`, else next to warmbox.core
-- (`<dir of core.so>/warmboxd`, then `<dir>/../warmboxd`, as in a build tree),
-- else `warmboxd` on PATH.
-- @module warmbox.server

local io_open, io_popen, os_getenv, os_execute, os_time, tostring, tonumber, type, ipairs, error =
  io.open, io.popen, os.getenv, os.execute, os.time, tostring, tonumber, type, ipairs, error
local setmetatable, pcall, string_format, table_concat = setmetatable, pcall, string.format, table.concat

local _M = {}

local function sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function is_executable(path)
  if type(path) ~= "string" or path == "" then return false end
  local f = io_open(path, "rb")
  if not f then return false end
  f:close()
  return os_execute("test -x " .. sh_quote(path) .. " -a ! -d " .. sh_quote(path)) == true
end

local function read_all(path)
  local f = io_open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function sleep(s)
  local ok, core = pcall(require, "warmbox.core")
  if ok and type(core) == "table" and core.sleep then return core.sleep(s) end
  os_execute("sleep " .. tostring(s))
end

--- Find the warmboxd binary.
-- @tparam[opt] string explicit a path given by the caller
-- @treturn[1] string path
-- @return[2] nil, message, "NOT_FOUND"
function _M.find_bin(explicit)
  if explicit then
    if is_executable(explicit) then return explicit end
    return nil, "warmboxd not found at '" .. explicit .. "'", "NOT_FOUND"
  end
  local env = os_getenv("WARMBOXD_BIN")
  if env and env ~= "" then
    if is_executable(env) then return env end
    return nil, "warmboxd not found at $WARMBOXD_BIN ('" .. env .. "')", "NOT_FOUND"
  end
  local ok, core = pcall(require, "warmbox.core")
  if ok and type(core) == "table" and type(core.module_path) == "function" then
    local mp = core.module_path()
    local dir = type(mp) == "string" and mp:match("^(.*)/[^/]*$")
    if dir then
      for _, cand in ipairs({ dir .. "/warmboxd", dir .. "/../warmboxd" }) do
        if is_executable(cand) then return cand end
      end
    end
  end
  local p = io_popen("command -v warmboxd 2>/dev/null")
  if p then
    local path = p:read("l")
    p:close()
    if path and path ~= "" and is_executable(path) then return path end
  end
  return nil, "warmboxd not found (pass warmboxd = path, set WARMBOXD_BIN, or install it next to "
    .. "warmbox/core.so or on PATH)", "NOT_FOUND"
end

local function random_hex(n)
  local f = io_open("/dev/urandom", "rb")
  local bytes = f and f:read(n) or tostring(os_time()) .. tostring({}) .. tostring(os.clock())
  if f then f:close() end
  return (bytes:sub(1, n):gsub(".", function(c) return string_format("%02x", c:byte()) end))
end

--- Whether a process is alive (a zombie is not: an exited child nobody reaped yet).
-- @tparam integer pid
-- @treturn boolean
function _M.alive(pid)
  local f = io_open("/proc/" .. tostring(pid) .. "/stat", "rb")
  if f then
    local stat = f:read("a") or ""
    f:close()
    local state = stat:match("^%d+ %b() (%a)")
    return state ~= nil and state ~= "Z" and state ~= "X"
  end
  if io_open("/proc/self/stat", "rb") then return false end
  return os_execute("kill -0 " .. tostring(pid) .. " 2>/dev/null") == true
end
local alive = _M.alive

local Server = {}
Server.__index = Server
Server.__name = "warmbox.Server"

--- Start warmboxd on a free loopback port.
-- @tparam[opt] table opts `bin`, `args` (extra arguments), `start_timeout` (seconds, 15),
--   `api_key` (default a fresh `e2b_<40 hex>`: its own team)
-- @treturn[1] warmbox.Server `{ url, port, pid, api_key, dir }`
-- @return[2] nil, message, code ("NOT_FOUND" | "TRANSPORT")
function _M.start(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("bad argument #1 to 'start' (table expected, got " .. type(opts) .. ")", 2) end
  local bin, err, code = _M.find_bin(opts.bin)
  if not bin then return nil, err, code end
  local p = io_popen("mktemp -d /tmp/warmboxd.XXXXXX")
  local dir = p and p:read("l")
  if p then p:close() end
  if not dir or dir == "" then return nil, "cannot make a temporary directory", "TRANSPORT" end
  local logf = dir .. "/warmboxd.log"
  local args = { "--port", "0", "--data-dir", dir .. "/data" }
  for _, a in ipairs(opts.args or {}) do args[#args + 1] = a end
  local parts = {}
  for i, a in ipairs(args) do parts[i] = sh_quote(a) end
  local cmd = string_format("%s %s >%s 2>&1 </dev/null & echo $!", sh_quote(bin), table_concat(parts, " "),
    sh_quote(logf))
  p = io_popen(cmd)
  local pid = p and tonumber(p:read("l"))
  if p then p:close() end
  if not pid then
    os_execute("rm -rf " .. sh_quote(dir))
    return nil, "cannot start warmboxd", "TRANSPORT"
  end
  local self = setmetatable({ pid = pid, dir = dir, log_path = logf, bin = bin,
    api_key = opts.api_key or ("e2b_" .. random_hex(20)) }, Server)
  local deadline = os_time() + (opts.start_timeout or 15)
  while true do
    local log = read_all(logf) or ""
    local url = log:match("warmboxd listening on (http://[%w%.%-%[%]:]+:%d+)")
    if url then
      self.url = url
      self.port = tonumber(url:match(":(%d+)$"))
      return self
    end
    if not alive(pid) then
      self.stopped = true
      os_execute("rm -rf " .. sh_quote(dir))
      return nil, "warmboxd exited at start: " .. log:gsub("%s+$", ""), "TRANSPORT"
    end
    if os_time() > deadline then
      self:stop()
      return nil, "warmboxd did not print its address in time", "TIMEOUT"
    end
    sleep(0.02)
  end
end

--- The server's log so far.
function Server:log()
  return read_all(self.log_path) or ""
end

--- Stop the server (SIGTERM, SIGKILL after 5 s) and remove its data. Idempotent.
function Server:stop()
  if self.stopped then return true end
  self.stopped = true
  os_execute("kill -TERM " .. self.pid .. " 2>/dev/null")
  local waited = 0
  while waited < 5 and alive(self.pid) do
    sleep(0.02)
    waited = waited + 0.02
  end
  if alive(self.pid) then
    os_execute("kill -KILL " .. self.pid .. " 2>/dev/null")
  end
  os_execute("rm -rf " .. sh_quote(self.dir))
  return true
end

function Server:__gc() pcall(self.stop, self) end
function Server:__close() pcall(self.stop, self) end
function Server:__tostring()
  return self.stopped and "warmbox.Server (stopped)" or ("warmbox.Server: " .. tostring(self.url))
end

return _M
