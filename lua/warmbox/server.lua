--- An embedded warmboxd: the local E2B-compatible server that `warmbox.new{}`
-- starts on a free loopback port when no E2B key is configured.
--
--   local server = require "warmbox.server"
--   local srv = assert(server.start{ args = { "--rtt-ms", "20" } })
--   -- srv.url, srv.api_key, srv.admin_token, srv.pid, srv:log()
--   -- the admin API (/_warmboxd/*) wants header X-Warmboxd-Token = srv.admin_token
--   srv:stop()          -- also on __close and __gc
--
-- The binary: `opts.bin`, else `$WARMBOXD_BIN`, else next to warmbox.core
-- (`<dir of core.so>/warmboxd`, then `<dir>/../warmboxd`, as in a build tree),
-- else `warmboxd` on PATH.
-- @module warmbox.server

local io_open, io_popen, os_getenv, os_execute, os_time, tostring, tonumber, type, ipairs, error =
  io.open, io.popen, os.getenv, os.execute, os.time, tostring, tonumber, type, ipairs, error
local setmetatable, pcall, pairs, string_format, table_concat =
  setmetatable, pcall, pairs, string.format, table.concat

local util = require "warmbox.util"
local sh_quote, read_file = util.sh_quote, util.read_file

local _M = {}

local function is_executable(path)
  if type(path) ~= "string" or path == "" then return false end
  local f = io_open(path, "rb")
  if not f then return false end
  f:close()
  return os_execute("test -x " .. sh_quote(path) .. " -a ! -d " .. sh_quote(path)) == true
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
  local hex = util.random_hex(n)
  if hex then return hex end
  local bytes = tostring(os_time()) .. tostring({}) .. tostring(os.clock())
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

-- A start-up failure names the first failing check of `warmbox doctor`.
local function with_check(msg)
  local ok, doctor = pcall(require, "warmbox.doctor")
  if not ok then return msg end
  local okc, failed = pcall(doctor.first_failure, "embedded", { find_bin = _M.find_bin })
  if not okc or not failed then return msg end
  return string_format("%s (failed check: %s: %s; fix: %s; see `warmbox doctor`)", msg, failed.name,
    failed.detail or "failed", failed.fix or "?")
end

--- Stop a process: SIGTERM, then SIGKILL after `grace` seconds (5). Idempotent.
-- @tparam integer pid
-- @tparam[opt] number grace
function _M.kill(pid, grace)
  pid = math.tointeger(pid)
  if not pid or pid <= 1 then error("bad argument #1 to 'kill' (pid expected)", 2) end
  os_execute("kill -TERM " .. pid .. " 2>/dev/null")
  local waited = 0
  grace = grace or 5
  while waited < grace and alive(pid) do
    sleep(0.02)
    waited = waited + 0.02
  end
  if alive(pid) then
    os_execute("kill -KILL " .. pid .. " 2>/dev/null")
    sleep(0.05)
  end
  return true
end

-- This process's pid (Linux: /proc/self is whoever opens it), or nil.
local function own_pid()
  local stat = read_file("/proc/self/stat")
  return stat and tonumber(stat:match("^(%d+)"))
end

-- The server's directory: `opts.dir` (made 0700), else a fresh one in /tmp;
-- returns it, or nil, message, "TRANSPORT".
local function server_dir(opts)
  local dir, p
  if opts.dir then
    dir = opts.dir
    if os_execute("mkdir -p -m 0700 " .. sh_quote(dir)) ~= true then
      return nil, "cannot make the directory " .. dir, "TRANSPORT"
    end
  else
    p = io_popen("mktemp -d /tmp/warmboxd.XXXXXX")
    dir = p and p:read("l")
    if p then p:close() end
    if not dir or dir == "" then return nil, "cannot make a temporary directory", "TRANSPORT" end
  end
  return dir
end

local function write_private(path, text)
  local p = io_popen("umask 077 && mktemp " .. sh_quote(path .. ".XXXXXX"))
  local tmp = p and p:read("l")
  if p then p:close() end
  if not tmp or tmp == "" then return nil, "cannot write " .. path end
  local f, err = io_open(tmp, "wb")
  if not f then return nil, err end
  f:write(text)
  f:close()
  if not os.rename(tmp, path) then
    os.remove(tmp)
    return nil, "cannot write " .. path
  end
  return true
end

-- The server's one API key (`opts.api_key`, else a fresh `e2b_<40 hex>`), in
-- `<dir>/api-key` (0600, in the server's private directory) for warmboxd's
-- `--api-key-file`, unless `opts.args` names a key itself. Returns the key and
-- the arguments to add, or nil, message.
local function key_args(opts, dir)
  local key = opts.api_key or ("e2b_" .. random_hex(20))
  for _, a in ipairs(opts.args or {}) do
    if a == "--api-key" or a == "--api-key-file" then return key, {} end
  end
  local ok, err = write_private(dir .. "/api-key", key .. "\n")
  if not ok then return nil, err end
  return key, { "--api-key-file", dir .. "/api-key" }
end

-- warmboxd's arguments for a server in dir, `extra`, then `opts.args` last;
-- returns them and the `--admin-token` given there, if any.
local function server_args(opts, dir, extra)
  -- warmbox's client sends a secure sandbox's token on every call: its own server asks for it
  -- everywhere (warmboxd's default checks what E2B checks) and gives every sandbox one.
  local args = { "--port", "0", "--data-dir", dir .. "/data", "--strict-tokens", "--secure-all" }
  -- An embedded server ends with this process, even one killed by SIGKILL
  -- (whose Server object never gets to stop it); a detached one outlives it.
  local host = not opts.detach and own_pid()
  if host then
    args[#args + 1] = "--exit-with"
    args[#args + 1] = tostring(host)
  end
  for _, a in ipairs(extra) do args[#args + 1] = a end
  local admin_token
  for i, a in ipairs(opts.args or {}) do
    args[#args + 1] = a
    if a == "--admin-token" then admin_token = opts.args[i + 1] end
  end
  return args, admin_token
end

local Server = {}
Server.__index = Server
Server.__name = "warmbox.Server"

--- Start warmboxd on a free loopback port.
-- warmboxd writes a random admin token to `<data dir>/admin-token` (mode 0600)
-- before it prints its address; it is read into `srv.admin_token` (the header
-- `X-Warmboxd-Token` of the admin API `/_warmboxd/*`). An `--admin-token` in
-- `opts.args` is used instead.
-- Unless `opts.detach`, warmboxd gets `--exit-with <this process's pid>`: it shuts
-- down when this process ends, however it ends.
-- warmboxd accepts one API key only, `srv.api_key`: it is written to
-- `<dir>/api-key` (0600) and passed as `--api-key-file`, so another local user
-- (or a web page) cannot drive the server with a key of their own.
-- It runs with `--strict-tokens`: a secure sandbox's code interpreter wants the
-- sandbox's token on `/contexts*` too, not only on `/execute` as E2B's does.
-- @tparam[opt] table opts `bin`, `args` (extra arguments), `start_timeout` (seconds, 15),
--   `api_key` (the server's only key; default a fresh `e2b_<40 hex>`), `detach` (outlive this process)
-- @treturn[1] warmbox.Server `{ url, port, pid, api_key, admin_token, dir }`
-- @return[2] nil, message, code ("NOT_FOUND" | "TRANSPORT")
function _M.start(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("bad argument #1 to 'start' (table expected, got " .. type(opts) .. ")", 2) end
  local bin, err, code = _M.find_bin(opts.bin)
  if not bin then return nil, err, code end
  local dir, derr, dcode = server_dir(opts)
  if not dir then return nil, derr, dcode end
  local logf = dir .. "/warmboxd.log"
  local api_key, kargs = key_args(opts, dir)
  if not api_key then
    os_execute("rm -rf " .. sh_quote(dir))
    return nil, kargs, "TRANSPORT"
  end
  local args, admin_token = server_args(opts, dir, kargs)
  local parts = {}
  for i, a in ipairs(args) do parts[i] = sh_quote(a) end
  -- detached: in a session of its own, so the terminal's hang-up or Ctrl-C does not reach it
  local cmd = string_format("%s%s %s >%s 2>&1 </dev/null & echo $!",
    opts.detach and "exec setsid " or "", sh_quote(bin), table_concat(parts, " "), sh_quote(logf))
  local p = io_popen(cmd)
  local pid = p and tonumber(p:read("l"))
  if p then p:close() end
  if not pid then
    os_execute("rm -rf " .. sh_quote(dir))
    return nil, "cannot start warmboxd", "TRANSPORT"
  end
  local self = setmetatable({ pid = pid, dir = dir, log_path = logf, bin = bin, api_key = api_key }, Server)
  local deadline = os_time() + (opts.start_timeout or 15)
  while true do
    local log = read_file(logf) or ""
    local url = log:match("warmboxd listening on (http://[%w%.%-%[%]:]+:%d+)")
    if url then
      self.url = url
      self.port = tonumber(url:match(":(%d+)$"))
      self.admin_token = admin_token or read_file(dir .. "/data/admin-token")
      return self
    end
    if not alive(pid) then
      self.stopped = true
      os_execute("rm -rf " .. sh_quote(dir))
      return nil, with_check("warmboxd exited at start: " .. log:gsub("%s+$", "")), "TRANSPORT"
    end
    if os_time() > deadline then
      self:stop()
      return nil, "warmboxd did not print its address in time", "TIMEOUT"
    end
    sleep(0.02)
  end
end

--- syntax: srv:log(): the server's log so far.
function Server:log()
  return read_file(self.log_path) or ""
end

--- syntax: srv:stop(): SIGTERM, SIGKILL after 5 s, and its data removed. Idempotent.
function Server:stop()
  if self.stopped then return true end
  self.stopped = true
  _M.kill(self.pid)
  os_execute("rm -rf " .. sh_quote(self.dir))
  return true
end

--- syntax: srv:detach(): the server outlives this object (`stop`, `__gc`, `__close` do nothing).
function Server:detach()
  self.stopped = true
  return self
end

-- ------------------------------------------------------------------
-- The per-user server of the command line (`warmbox server start|stop|status`)
-- ------------------------------------------------------------------

local function nonempty(v) return v ~= nil and v ~= "" and v or nil end

-- The user's home directory from the password database (for a process started
-- without HOME: a cron job, a service), or nil.
local function passwd_home()
  local ok, core = pcall(require, "warmbox.core")
  local uid = ok and type(core) == "table" and core.geteuid and math.tointeger(core.geteuid())
  local p = uid and io_popen("getent passwd " .. uid .. " 2>/dev/null")
  local line = p and p:read("l")
  if p then p:close() end
  local home = line and line:match("^[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:(/[^:]*):")
  return nonempty(home)
end

--- syntax: dir = server.state_dir(): the per-user server's state directory: `$XDG_RUNTIME_DIR/warmbox`, else
-- `$XDG_STATE_HOME/warmbox`, else `~/.local/state/warmbox` (`~`: `$HOME`, else the
-- user's home in the password database; never a shared directory such as /tmp).
-- @treturn[1] string
-- @return[2] nil, message
function _M.state_dir()
  local run = nonempty(os_getenv("XDG_RUNTIME_DIR"))
  if run then return run .. "/warmbox" end
  local st = nonempty(os_getenv("XDG_STATE_HOME"))
  if st then return st .. "/warmbox" end
  local home = nonempty(os_getenv("HOME")) or passwd_home()
  if not home then
    return nil, "no directory for the local server's state: set XDG_RUNTIME_DIR, XDG_STATE_HOME or HOME"
  end
  return home .. "/.local/state/warmbox"
end

--- syntax: path = server.state_path(): the state file (JSON, mode 0600): `{ url, pid, api_key,
-- admin_token, dir, bin, started_at, idle_exit }`; or nil, message.
function _M.state_path()
  local dir, err = _M.state_dir()
  if not dir then return nil, err end
  return dir .. "/server.json"
end

-- The state directory holds the server's API key and admin token: it is used
-- only when it is this user's and no one else may write to it (another local
-- user could otherwise plant a state file naming their own server, or a fifo
-- that blocks the reader).
local function private_state_dir(dir)
  local ok, core = pcall(require, "warmbox.core")
  if not ok or type(core) ~= "table" or not core.private_dir then return true end
  local fine, err = core.private_dir(dir)
  if fine then return true end
  return nil, "state directory: " .. err
end

-- Whether pid runs this user's shared warmboxd: a warmboxd (a pid reused by
-- another program is not our server) whose data directory is `data` (another
-- warmboxd, say an embedded server, is not either). "unknown" without /proc.
local function is_our_warmboxd(pid, data)
  if not alive(pid) then return false end
  local cmd = read_file("/proc/" .. tostring(pid) .. "/cmdline")
  if not cmd then return "unknown" end -- no /proc: trust kill -0 (and the HTTP check)
  local argv, i = {}, 0
  for a in cmd:gmatch("([^%z]*)%z") do
    i = i + 1
    argv[i] = a
  end
  if not (argv[1] or ""):match("warmboxd[^/]*$") then return false end
  for j = 2, i - 1 do
    if argv[j] == "--data-dir" then return argv[j + 1] == data end
  end
  return false
end

-- The server at st.url proves it is the one of the state file: its admin API
-- answers the state's admin token (a warmboxd of another data directory has
-- another token, and refuses it). → true | nil, why
local function answers_token(st)
  if type(st.admin_token) ~= "string" or st.admin_token == "" then return nil, "no admin token in the state" end
  local ok, core = pcall(require, "warmbox.core")
  if not ok or type(core) ~= "table" or not core.http then return true end
  local h = core.http{ timeout = 5, connect_timeout = 2 }
  if not h then return true end
  local res, err = h:request{ method = "GET", url = st.url .. "/_warmboxd/clock",
    headers = { ["X-Warmboxd-Token"] = st.admin_token }, retry = { attempts = 1 } }
  h:close()
  if not res then return nil, tostring(err) end
  if res.status ~= 200 then return nil, "it answered " .. tostring(res.status) .. " to its admin token" end
  return true
end

--- syntax: st, why = server.local_server(): the running per-user server (the CLI's, from its state file).
-- The state directory is checked (this user's, no one else may write to it)
-- before its state file is read; the server it names must be this user's
-- shared warmboxd (its data directory, and its admin API answering the
-- state's token), not a live process that merely has its pid.
-- @treturn[1] table its state `{ url, pid, api_key, admin_token, dir }`
-- @return[2] nil, why ("not running", "stale state file (...)", "state directory: ...")
-- @return[2] the stale state, when there is one
function _M.local_server()
  local sdir, derr = _M.state_dir()
  if not sdir then return nil, derr end
  local path = sdir .. "/server.json"
  local ex = io_open(sdir, "rb")
  if not ex then return nil, "not running" end
  ex:close()
  local private, perr = private_state_dir(sdir)
  if not private then return nil, perr end
  local text = read_file(path)
  if not text then return nil, "not running" end
  local st = require("warmbox.json").decode(text)
  if type(st) ~= "table" or type(st.url) ~= "string" or math.tointeger(st.pid) == nil
    or type(st.api_key) ~= "string" then
    return nil, "unreadable state file " .. path
  end
  st.pid = math.tointeger(st.pid)
  local ours = is_our_warmboxd(st.pid, type(st.dir) == "string" and st.dir .. "/data" or nil)
  if not ours then
    return nil, string_format("stale state file (pid %d is gone, or is not this user's shared warmboxd)", st.pid),
      st
  end
  local fine, why = answers_token(st)
  if not fine then
    if ours == "unknown" then
      return nil, string_format("stale state file (the server at %s: %s)", st.url, why), st
    end
    -- Our own server (its data directory) that does not answer: hung, or
    -- starting; never a second one on the same data directory.
    return nil, string_format("the local server (pid %d) does not answer at %s: %s", st.pid, st.url, why), st,
      "HUNG"
  end
  return st
end

--- The shared server's settings (docs/warmboxd.md's table): flag, environment, a
-- developer's default (not E2B Hobby's 20, nor warmboxd's ~10 by memoryMB).
_M.SETTINGS = {
  { name = "idle_exit", flag = "--idle-exit", env = "WARMBOX_SERVER_IDLE_EXIT", default = 3600,
    what = "seconds with no running sandbox before the server ends (paused sandboxes are kept); 0: never" },
  { name = "max_running", flag = "--max-running", env = "WARMBOX_SERVER_MAX_RUNNING", default = 100,
    what = "sandboxes running at once (a create beyond: RATE_LIMITED, naming this setting); 0: no limit" },
  { name = "max_memory_mb", flag = "--max-team-memory-mb", env = "WARMBOX_SERVER_MAX_MEMORY_MB", default = 0,
    what = "memoryMB of the sandboxes held in RAM (running or paused with memory); 0: no budget" },
}
_M.IDLE_EXIT, _M.MAX_RUNNING = 3600, 100

-- The settings of a server to start: opts[name], else $ENV, else the default
-- (integers >= 0, rounded up). → values, warmboxd arguments | nil, message
local function settings_of(opts)
  local values, args = {}, {}
  for _, set in ipairs(_M.SETTINGS) do
    local v, from = opts[set.name], set.name
    if v == nil then
      local e = os_getenv(set.env)
      if e and e ~= "" then
        v, from = tonumber(e), set.env
        if v == nil then return nil, string_format("%s: a number >= 0 expected, got '%s'", set.env, e) end
      end
    end
    if v == nil then v = set.default end
    if v == false then v = 0 end
    if type(v) ~= "number" or v ~= v or v < 0 or v > 2 ^ 30 then
      return nil, string_format("%s: a number in [0, 2^30] expected, got %s", from, tostring(v))
    end
    v = math.tointeger(math.ceil(v))
    values[set.name] = v
    if set.name ~= "idle_exit" or v > 0 then
      args[#args + 1] = set.flag
      args[#args + 1] = tostring(v)
    end
  end
  return values, args
end

-- Removes what a shared server in `dir` left but its data directory (the
-- paused sandboxes, kept for the next server) and its API key (their team).
local function prune_shared_dir(dir)
  os_execute("find " .. sh_quote(dir) .. " -mindepth 1 -maxdepth 1 ! -name data ! -name api-key "
    .. "-exec rm -rf {} + 2>/dev/null")
end

-- The API key a previous shared server in `dir` had (its sandboxes' team), if any.
local function reusable_key(dir)
  local s = read_file(dir .. "/api-key")
  return s and (s:match("^(e2b_%x+)\n") or s:match("^(e2b_%x+)$")) or nil
end

-- start_local's part under the start lock: another starter may have won.
local function start_locked(opts, sdir)
  local st, why, _, hung = _M.local_server()
  if st then return st, true end
  -- Our own server that does not answer keeps its data directory: never a second one on it.
  if hung then return nil, why, "TRANSPORT" end
  local dir = sdir .. "/warmboxd"
  -- The data directory (paused sandboxes) and the key their team is known by
  -- are kept for the next server; the rest of a dead server's files go.
  local values, args = settings_of(opts)
  if not values then return nil, args, "BAD_REQUEST" end
  local key = reusable_key(dir)
  prune_shared_dir(dir)
  for _, a in ipairs(opts.args or {}) do args[#args + 1] = a end
  local srv, err, code = _M.start{ bin = opts.bin, args = args, start_timeout = opts.start_timeout,
    dir = dir, detach = true, api_key = key }
  if not srv then return nil, err, code end
  st = { url = srv.url, pid = srv.pid, api_key = srv.api_key, admin_token = srv.admin_token, dir = dir,
    bin = srv.bin, log = srv.log_path, started_at = os_time(),
    idle_exit = values.idle_exit > 0 and values.idle_exit or nil, max_running = values.max_running }
  local ok, werr = write_private(sdir .. "/server.json", require("warmbox.json").encode(st))
  if not ok then
    srv:stop()
    return nil, werr, "TRANSPORT"
  end
  srv:detach()
  return st, false
end

-- The running server `st`, with `opts.max_running` (when given) set at run
-- time (warmboxd's admin config) and recorded in its state file.
-- → st, true | nil, message, code
local function running_with(st, opts)
  local want = opts.max_running
  if want == nil or want == st.max_running then return st, true end
  if math.type(want) ~= "integer" or want < 0 then
    return nil, "max_running: an integer >= 0 expected, got " .. tostring(want), "BAD_REQUEST"
  end
  local h = require("warmbox.core").http{ timeout = 10 }
  local res, err = h:request{ method = "POST", url = st.url .. "/_warmboxd/config",
    headers = { ["X-Warmboxd-Token"] = st.admin_token, ["Content-Type"] = "application/json" },
    body = '{"max_running":' .. want .. "}" }
  h:close()
  if not res or res.status ~= 204 then
    return nil, "cannot change the local server's max_running: " .. tostring(res and res.status or err), "TRANSPORT"
  end
  st.max_running = want
  local ok, werr = write_private(_M.state_dir() .. "/server.json", require("warmbox.json").encode(st))
  if not ok then return nil, werr, "TRANSPORT" end
  return st, true
end

--- Start the per-user server in the background (it outlives this process), or
-- find the running one. Race-free: starters take a flock on `<state dir>/start.lock`,
-- so of many processes starting at once (a host's workers) one starts it and
-- the others use that one.
-- @tparam[opt] table opts `bin`, `args`, `start_timeout`, and the settings of
--   `_M.SETTINGS`: `idle_exit` (seconds with no running sandbox before it shuts down;
--   default `$WARMBOX_SERVER_IDLE_EXIT`, else 3600; 0: never), `max_running` (default
--   `$WARMBOX_SERVER_MAX_RUNNING`, else 100; 0: no limit; given for a running server, it is
--   changed at once)
-- @treturn[1] table its state (as `local_server`), and true when it was already running
-- @return[2] nil, message, code
function _M.start_local(opts)
  opts = opts or {}
  local st = _M.local_server()
  if st then return running_with(st, opts) end
  local sdir, serr = _M.state_dir()
  if not sdir then return nil, serr, "TRANSPORT" end
  if os_execute("mkdir -p -m 0700 " .. sh_quote(sdir)) ~= true then
    return nil, "cannot make the directory " .. sdir, "TRANSPORT"
  end
  local private, perr = private_state_dir(sdir)
  if not private then return nil, perr, "TRANSPORT" end
  local fl, ferr = require("warmbox.core").flock_open(sdir .. "/start.lock")
  if not fl then return nil, "cannot open the start lock: " .. tostring(ferr), "TRANSPORT" end
  local got, lerr = fl:lock((opts.start_timeout or 15) + 30)
  if not got then
    fl:close()
    return nil, "another process is starting the local server and did not finish: " .. tostring(lerr), "TIMEOUT"
  end
  local ok, a, b, c = pcall(start_locked, opts, sdir)
  fl:unlock()
  fl:close()
  if not ok then error(a, 0) end
  if a and b then return running_with(a, opts) end
  return a, b, c
end

--- Stop the per-user server (SIGTERM: it pauses its running sandboxes) and remove its
-- state file; its data directory and key stay, so the next server has its paused sandboxes.
-- @treturn[1] table the state it had, or false when none was running
function _M.stop_local()
  local st, _, stale, hung = _M.local_server()
  if hung then st = stale end -- our own server, not answering: stopped all the same
  local running = st ~= nil
  -- SIGTERM: warmboxd pauses its running sandboxes into its data directory first.
  if running then _M.kill(st.pid, 30) end
  st = st or stale
  local sdir = _M.state_dir()
  if not sdir then return false end
  if st and type(st.dir) == "string" and st.dir:sub(1, #sdir + 1) == sdir .. "/" then
    prune_shared_dir(st.dir)
  end
  os.remove(sdir .. "/server.json")
  return running and st or false
end

-- ------------------------------------------------------------------
-- A client of the shared server across its restarts
-- ------------------------------------------------------------------

-- `url` with the origin of a server `srv` had before moved to its current one.
local function moved(srv, url)
  if type(url) ~= "string" then return url end
  for old in pairs(srv.urls) do
    if old ~= srv.url and url:sub(1, #old) == old and url:sub(#old + 1, #old + 1):match("^[/?]?$") then
      return srv.url .. url:sub(#old + 1)
    end
  end
  return url
end

-- A request as sent to the server's current address (and key): a copy when it changed.
local function readdressed(srv, req)
  local url = moved(srv, req.url)
  local h = req.headers
  local key = type(h) == "table" and h["X-API-Key"]
  local rekey = key and key ~= srv.api_key and srv.keys[key]
  if url == req.url and not rekey then return req end
  local r = {}
  for k, v in pairs(req) do r[k] = v end
  r.url = url
  if rekey then
    r.headers = {}
    for k, v in pairs(h) do r.headers[k] = v end
    r.headers["X-API-Key"] = srv.api_key
  end
  return r
end

-- The shared server `srv` refused a connection: when the server of the state
-- file is another one (restarted by another process), or none runs (it ended:
-- idle, `warmbox server stop`, a crash) and one is started now, `srv` follows
-- it. → true when it moved
local function relocate(srv, tried_url)
  if srv.url ~= tried_url then return true end -- another request moved it meanwhile
  local st, _, _, hung = _M.local_server()
  if hung then return false end
  if not st then
    local err
    st, err = _M.start_local{ bin = srv.bin }
    if not st then
      srv.follow_error = err
      return false
    end
  end
  if st.url == srv.url then return false end -- the same server: a refusal of its own
  srv.urls[st.url], srv.keys[st.api_key] = true, true
  srv.url, srv.pid, srv.api_key, srv.admin_token = st.url, st.pid, st.api_key, st.admin_token
  srv.restarts = (srv.restarts or 0) + 1
  return true
end

local function never_left(code, sent) return code == "TRANSPORT" and sent == false end -- (connection refused)

local Follow = {}
Follow.__index = Follow
Follow.__name = "warmbox.Follow"

function Follow:request(req)
  local srv = self.srv
  local tried = srv.url
  local res, msg, code, sent = self.inner:request(readdressed(srv, req))
  if res or not never_left(code, sent) or not relocate(srv, tried) then return res, msg, code, sent end
  -- Nothing of the request left: it goes to the server now running (at most once holds).
  return self.inner:request(readdressed(srv, req))
end

function Follow:batch(reqs, opts)
  local srv = self.srv
  local tried = srv.url
  local list = {}
  for i, r in ipairs(reqs) do list[i] = readdressed(srv, r) end
  local out = self.inner:batch(list, opts)
  local again, at = {}, {}
  for i, r in ipairs(out) do
    if r[1] == nil and never_left(r[3], r[4]) then
      again[#again + 1] = reqs[i]
      at[#at + 1] = i
    end
  end
  if #again == 0 or not relocate(srv, tried) then return out end
  for i, r in ipairs(again) do again[i] = readdressed(srv, r) end
  local more = self.inner:batch(again, opts)
  for j, i in ipairs(at) do out[i] = more[j] end
  return out
end

--- A transport for a client of the user's shared server that follows it
-- across its restarts: a request refused before anything of it left
-- (connection refused: the server ended, idle or stopped or killed) finds
-- the running shared server, or starts it, and goes there; requests that may
-- have left are never sent again (at most once). `srv` (`{ url, pid, api_key,
-- admin_token, bin }`, as `start_local` returns) is updated in place;
-- `inner` is a transport (`request`, `batch`).
-- @treturn table a transport
function _M.follow(srv, inner)
  if not srv.urls then
    srv.urls, srv.keys = { [srv.url] = true }, { [srv.api_key] = true }
  end
  return setmetatable({ srv = srv, inner = inner }, Follow)
end

function Server:__gc() pcall(self.stop, self) end
function Server:__close() pcall(self.stop, self) end
function Server:__tostring()
  return self.stopped and "warmbox.Server (stopped)" or ("warmbox.Server: " .. tostring(self.url))
end

return _M
