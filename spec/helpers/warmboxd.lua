-- Starts a real warmboxd on a free loopback port for integration specs, and
-- stops it afterwards. Usage, in a describe block:
--
--   local wbd = require "spec.helpers.warmboxd"
--   local srv
--   lazy_setup(function() srv = wbd.start{ args = { "--rtt-ms", "0" } } end)
--   lazy_teardown(function() srv:stop() end)
--   -- srv.url, srv.port, srv.pid, srv.api_key, srv.admin_token, srv:log()
--
-- Every server gets an admin token (--admin-token, unless opts.args gives
-- one); spec.helpers.http adds it to each request to that server's admin API
-- (/_warmboxd/*), so specs call the admin API as before.
--
-- A spec file is one team that leaves its sandboxes running (600 s leases), many
-- more than warmboxd's default per-team cap (--max-running 20): servers started
-- here get --max-running 0 (no cap) unless opts.args gives one or
-- opts.default_max_running keeps warmboxd's default; the same for the team's
-- other budgets (--max-streams, --max-team-memory-mb).
--
-- WARMBOXD_WRAPPER (e.g. "valgrind --error-exitcode=99 --leak-check=full")
-- runs the server under a wrapper; WARMBOXD_BIN overrides the binary.
--
-- This file is the one way to warmboxd's admin API, so an admin token lands in
-- one place: srv:admin(method, path, json) and the methods over it
-- (srv:fault{...}, srv:clear_faults(), srv:config{...}, srv:stats(),
-- srv:reset_stats(), srv:count(route), srv:advance(seconds)), wbd.admin(srv,
-- method, path, body, as_team), wbd.seed(srv, {...}) (raises unless all were
-- created), wbd.stats(srv). srv:runtime_name(id) and srv:sandbox_dir(id) name
-- a sandbox's runtime on the host (which never carries its id);
-- srv:sandbox_home(id) is the host directory that is /home/user in it (specs
-- count a cell's executions by a line it appends there first).
local M = {}

local function sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
M.sh_quote = sh_quote

local function root()
  local src = debug.getinfo(1, "S").source:sub(2)
  local dir = src:match("^(.*)/spec/helpers/[^/]*$")
  if dir then return dir end
  return "."
end
M.root = root

function M.bin()
  return os.getenv("WARMBOXD_BIN") or (root() .. "/build/warmboxd")
end

local function sleep(s) os.execute("sleep " .. tostring(s)) end
M.sleep = sleep

--- Unix seconds (a float with the fraction) of an RFC 3339 UTC time as warmboxd
-- writes it ("2026-08-21T20:00:00.123456789Z"); independent of the local TZ.
function M.utc(s)
  local y, mo, d, h, mi, sec, frac = tostring(s):match("^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)%.?(%d*)Z$")
  assert(y, "not an RFC 3339 UTC time: " .. tostring(s))
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  if mo <= 2 then y, mo = y - 1, mo + 12 end
  local days = 365 * y + y // 4 - y // 100 + y // 400 + (153 * (mo - 3) + 2) // 5 + d - 719469
  return days * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(sec)
    + (frac ~= "" and tonumber("0." .. frac) or 0)
end

--- Polls `fn` every 0.1 s until it returns a truthy value or `seconds` (15)
-- pass (lease expiry and the like are asynchronous); returns fn's last value.
function M.eventually(fn, seconds)
  local deadline = os.time() + (seconds or 15)
  repeat
    local v = fn()
    if v then return v end
    sleep(0.1)
  until os.time() > deadline
  return fn()
end

-- A file's bytes, or nil (warmbox.util's reader, without its error message).
local function read_all(path) return (require("warmbox.util").read_file(path)) end
M.read_all = read_all

-- warmbox.server's check: a zombie (exited, not yet reaped) is not alive, where
-- `kill -0` would say it is until its parent reaps it.
local alive = require("warmbox.server").alive
M.alive = alive

local counter = 0
-- A fresh E2B-shaped API key (e2b_ + 40 hex), so each spec file is its own team.
function M.new_key()
  counter = counter + 1
  local t = {}
  local seed = tostring(os.time()) .. tostring(os.clock()) .. tostring({}) .. counter
  local h = 0
  for i = 1, 40 do
    h = (h * 31 + seed:byte((i - 1) % #seed + 1) + i * 7 + counter) % 16
    t[i] = string.format("%x", (h + math.random(0, 15)) % 16)
  end
  return "e2b_" .. table.concat(t)
end

-- Admin tokens of the servers started here (and any registered), by base URL.
M.admin_tokens = {}

--- The admin token to send with a request to `url`, or nil.
function M.admin_token_for(url)
  local base = tostring(url):match("^(https?://[^/]+)/_warmboxd")
  return base and M.admin_tokens[base] or nil
end

--- Makes spec.helpers.http send `token` on admin calls to the server at `url`
-- (for a server started another way, e.g. warmbox.server's srv.admin_token).
function M.register_admin(url, token)
  M.admin_tokens[url] = token
end

local function random_token()
  local f = assert(io.open("/dev/urandom", "rb"))
  local raw = f:read(24)
  f:close()
  return (raw:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local Server = {}
Server.__index = Server

function M.start(opts)
  opts = opts or {}
  -- opts.dir: the directory of a server stopped with srv:kill (a restart on its data)
  local dir = opts.dir
  if not dir then
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. sh_quote(dir)))
  end
  local logf = dir .. "/warmboxd.log"
  os.remove(logf)  -- a restart must not read the last server's address
  local args = { "--port", "0", "--data-dir", dir .. "/data" }
  -- It ends with this busted process, even one killed before its teardown.
  local me = tonumber((read_all("/proc/self/stat") or ""):match("^(%d+)"))
  if me and opts.exit_with ~= false then
    args[#args + 1] = "--exit-with"
    args[#args + 1] = tostring(me)
  end
  local admin_token, max_running = nil, opts.default_max_running
  -- the per-team budgets that default to a figure, off unless a spec gives them
  local budgets = { ["--max-streams"] = false, ["--max-team-memory-mb"] = false }
  for i, a in ipairs(opts.args or {}) do
    args[#args + 1] = a
    if a == "--admin-token" then admin_token = opts.args[i + 1] end
    if a == "--max-running" then max_running = true end
    if budgets[a] == false then budgets[a] = true end
  end
  if not max_running then
    args[#args + 1] = "--max-running"
    args[#args + 1] = "0"
  end
  for _, flag in ipairs({ "--max-streams", "--max-team-memory-mb" }) do
    if not budgets[flag] and not opts.default_max_running then
      args[#args + 1] = flag
      args[#args + 1] = "0"
    end
  end
  if not admin_token then
    admin_token = random_token()
    args[#args + 1] = "--admin-token"
    args[#args + 1] = admin_token
  end
  local parts = {}
  for i, a in ipairs(args) do parts[i] = sh_quote(a) end
  local wrapper = opts.wrapper or os.getenv("WARMBOXD_WRAPPER") or ""
  -- The sanitizer run preloads ASan into lua5.4; warmboxd links its own (or runs under valgrind).
  local cmd = string.format("env -u LD_PRELOAD %s %s %s >%s 2>&1 & echo $!", wrapper, sh_quote(opts.bin or M.bin()),
    table.concat(parts, " "), sh_quote(logf))
  local p = assert(io.popen(cmd))
  local pid = tonumber(p:read("l"))
  p:close()
  assert(pid, "could not start warmboxd")
  local deadline = os.time() + (opts.start_timeout or (wrapper ~= "" and 60 or 15))
  local url
  repeat
    local log = read_all(logf) or ""
    url = log:match("warmboxd listening on (http://[%d%.]+:%d+)")
    if not url then
      if not alive(pid) then
        error("warmboxd exited at start:\n" .. log)
      end
      sleep(0.05)
    end
  until url or os.time() > deadline
  assert(url, "warmboxd did not print its address in time:\n" .. (read_all(logf) or ""))
  local self = setmetatable({
    url = url, port = tonumber(url:match(":(%d+)$")), pid = pid, dir = dir,
    log_path = logf, api_key = opts.api_key or M.new_key(), admin_token = admin_token,
  }, Server)
  M.admin_tokens[url] = admin_token
  return self
end

--- A call to warmboxd's admin API (`/_warmboxd/<path>`), the one place that
-- knows how to reach it (specs and benches go through here, so a change of how
-- it is reached, e.g. the admin token spec.helpers.http adds, lands here alone).
-- `as_team` also sends the server's API key (the seed knob creates records for
-- that team).
-- @return `{ status, headers, body, json }` (spec.helpers.http)
function Server:admin(method, path, json, as_team)
  local http = require "spec.helpers.http"
  local headers = {}
  if as_team then headers["X-API-Key"] = self.api_key end
  return http.request{ method = method, url = self.url .. "/_warmboxd/" .. path:gsub("^/", ""),
    headers = headers, json = json }
end

local function expect_204(res, what)
  if res.status ~= 204 then error(what .. ": http " .. tostring(res.status) .. ": " .. tostring(res.body), 3) end
end

--- Injects a fault: `t` as `POST /_warmboxd/faults` takes it (route, count, status, headers, delay_ms, drop).
function Server:fault(t) expect_204(self:admin("POST", "/faults", t), "fault") end
function Server:clear_faults() expect_204(self:admin("DELETE", "/faults"), "clear faults") end
function Server:config(t) expect_204(self:admin("POST", "/config", t), "config") end
function Server:reset_stats() expect_204(self:admin("POST", "/stats/reset"), "reset stats") end
function Server:stats() return assert(self:admin("GET", "/stats").json, "stats") end
--- Moves the server's clock `seconds` forward (leases, auto-pause, endAt);
-- what that makes due is paused or killed before it returns. Returns the
-- server's total offset in seconds.
function Server:advance(seconds)
  local res = self:admin("POST", "/clock", { advance_ms = math.floor(seconds * 1000 + 0.5) })
  if res.status ~= 200 then error("clock: http " .. tostring(res.status) .. ": " .. tostring(res.body), 2) end
  return res.json.offset_ms / 1000
end
--- warmboxd's heap in live allocations, in kB (its stats' heap_bytes). A
-- memory bound reads this, not RSS: under ASan freed blocks stay mapped in
-- its quarantine (up to 256 MB), so RSS grows with all the output that
-- passed through, bounded or not.
function Server:heap_kb() return self:stats().heap_bytes // 1024 end
--- How many requests `route` got since the last reset.
function Server:count(route) return (self:stats().requests or {})[route] or 0 end

--- The host path of `path` as warmboxd sees it. Sandbox data (homes are a
-- tmpfs) lives in warmboxd's own mount namespace, so the host reaches it only
-- through /proc/<pid>/root.
function Server:ns_path(path)
  return "/proc/" .. self.pid .. "/root" .. path
end

--- The name of sandbox `id`'s runtime on the host (`r` + 20 hex, never the
-- id): its directory under the data directory, its cgroups, and what names
-- it on its jails' bubblewrap command lines (the admin API's /runtime).
local function runtime(self, id)
  local res = self:admin("GET", "/runtime?id=" .. id)
  if res.status ~= 200 then error("runtime: http " .. tostring(res.status) .. ": " .. tostring(res.body), 3) end
  return res.json
end
function Server:runtime_name(id) return runtime(self, id).name end

--- The directory (as warmboxd sees it) holding sandbox `id`'s home, tmp and root.
function Server:sandbox_dir(id) return runtime(self, id).dir end

--- The host path of the directory that is /home/user inside sandbox `id`.
function Server:sandbox_home(id)
  return self:ns_path(self:sandbox_dir(id) .. "/home")
end

function Server:log()
  return read_all(self.log_path) or ""
end

-- Stops the server (SIGTERM, then SIGKILL after a grace period) and returns
-- its exit status as the shell saw it (nil when it had to be killed).
function Server:stop()
  if self.stopped then return self.status end
  self.stopped = true
  os.execute("kill -TERM " .. self.pid .. " 2>/dev/null")
  local waited = 0
  while alive(self.pid) and waited < 30 do
    sleep(0.02)
    waited = waited + 0.02
  end
  if alive(self.pid) then
    os.execute("kill -KILL " .. self.pid .. " 2>/dev/null")
  end
  os.execute("rm -rf " .. sh_quote(self.dir))
  return true
end

--- Ends the server with `sig` ("TERM" or "KILL") and waits for it to exit,
-- keeping its directory: `wbd.start{ dir = srv.dir }` restarts on its data
-- (then stop that one; this one's stop only marks it stopped).
function Server:kill(sig)
  self.stopped = true
  os.execute("kill -" .. sig .. " " .. self.pid .. " 2>/dev/null")
  local waited = 0
  while alive(self.pid) and waited < 30 do
    sleep(0.02)
    waited = waited + 0.02
  end
  return not alive(self.pid)
end

--- Bulk-creates cheap sandbox records for the server's team (the seed knob):
-- `o = { count, state = "paused"|"running", metadata, started_ago_s, paused_ago_s, timeout }`.
-- Raises unless warmboxd created them all; returns the count.
function Server:seed(o)
  local res = self:admin("POST", "seed", o, true)
  assert(res.status == 200, "seed failed: " .. tostring(res.status) .. " " .. tostring(res.body))
  assert(res.json and res.json.created == o.count, "seed created " .. tostring(res.json and res.json.created))
  return o.count
end

-- Module-level spellings of the methods, for callers that hold a server table.
function M.admin(srv, ...) return Server.admin(srv, ...) end
function M.seed(srv, o) return Server.seed(srv, o) end
function M.stats(srv) return Server.stats(srv) end

return M
