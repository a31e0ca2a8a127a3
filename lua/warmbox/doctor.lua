--- `warmbox doctor`: what this machine lacks for the embedded warmboxd, and what an
-- E2B setup lacks.
--
--   local doctor = require "warmbox.doctor"
--   local checks = doctor.embedded{ find_bin = require("warmbox.server").find_bin }
--   for _, c in ipairs(checks) do print(c.status, c.name, c.detail, c.fix) end
--   local failed = doctor.first_failure("embedded", { find_bin = ... })   -- nil when every required check passes
--
-- A check is `{ name, status = "ok" | "fail" | "warn", detail, fix }`: "fail" when the
-- setup cannot work without it, "warn" when a feature is missing (e.g. JavaScript).
-- Programs are looked up on PATH, as a user would; warmboxd itself runs
-- /usr/bin/bwrap and /usr/bin/python3, so those are checked there too.
-- @module warmbox.doctor

local io_open, io_popen, os_execute, os_getenv, tostring, type, ipairs, pcall =
  io.open, io.popen, os.execute, os.getenv, tostring, type, ipairs, pcall
local string_format = string.format

local sh_quote = require("warmbox.util").sh_quote

local _M = {}

-- Runs a shell command; returns ok and its first line of output (stdout and stderr).
local function run(cmd)
  local p = io_popen("(" .. cmd .. ") 2>&1")
  if not p then return false, "cannot run a shell" end
  local out = p:read("a") or ""
  local ok = p:close()
  return ok == true, (out:gsub("%s+$", ""):match("[^\n]*$") or "")
end

local function which(prog)
  local p = io_popen("command -v " .. sh_quote(prog) .. " 2>/dev/null")
  if not p then return nil end
  local path = p:read("l")
  p:close()
  return path ~= "" and path or nil
end

local function read_line(path)
  local f = io_open(path, "rb")
  if not f then return nil end
  local s = f:read("l")
  f:close()
  return s
end

local function check(name, status, detail, fix)
  return { name = name, status = status, detail = detail, fix = fix }
end

-- "ok" with `ok_detail` when test(1) passes `expr`, else "warn".
local function test_check(name, expr, ok_detail, warn_detail, fix)
  if os_execute("test " .. expr) then return check(name, "ok", ok_detail) end
  return check(name, "warn", warn_detail, fix)
end

-- A program warmboxd runs at a fixed path: nil when it is on PATH and at
-- `path`, else a check of `status` saying which is missing (`what`: the
-- consequence, appended).
local function missing(name, prog, path, status, what, fix)
  local found = which(prog)
  if not found then return check(name, status, prog .. " not found on PATH" .. what, fix) end
  if not os_execute("test -x " .. path) then
    return check(name, status, prog .. " is " .. found .. " but warmboxd runs " .. path .. what, fix)
  end
  return nil
end

-- python3 at /usr/bin/python3 (the kernel's) and the packages it imports there,
-- whatever python3 PATH finds first.
local function add_python_checks(add)
  local m = missing("python3", "python3", "/usr/bin/python3", "fail", "", "apt-get install python3")
  if m then
    add(m)
  else
    add(check("python3", "ok", "/usr/bin/python3 (the kernel's)"))
    -- the packages of the python the kernel runs, whatever python3 PATH finds first
    local python = "/usr/bin/python3"
    local ok, why = run(sh_quote(python) .. " -c 'import IPython; print(IPython.__version__)'")
    add(ok and check("IPython", "ok", "IPython " .. why)
      or check("IPython", "fail", "the python kernel needs IPython: " .. why, "apt-get install python3-ipython"))
    ok, why = run(sh_quote(python) .. " -c 'import matplotlib; print(matplotlib.__version__)'")
    add(ok and check("matplotlib", "ok", "matplotlib " .. why)
      or check("matplotlib", "warn", "charts (plt.show, savefig) need matplotlib: " .. why,
        "apt-get install python3-matplotlib"))
    ok, why = run(sh_quote(python) .. " -c 'import pandas; print(pandas.__version__)'")
    add(ok and check("pandas", "ok", "pandas " .. why .. " (DataFrames come back as e2b/data)")
      or check("pandas", "warn", "cells cannot import pandas: " .. why, "apt-get install python3-pandas"))
  end
end

-- node and the TypeScript package, which warmboxd's javascript and typescript
-- kernel (embed/kernel.js) runs as /usr/bin/node and looks for where Debian puts it.
local function add_node_checks(add)
  local m = missing("node", "node", "/usr/bin/node", "warn", ": no javascript or typescript cells "
    .. "(python and bash run)", "apt-get install nodejs")
  if m then return add(m) end
  add(check("node", "ok", "/usr/bin/node (javascript and typescript cells)"))
  add(test_check("typescript", "-d /usr/share/nodejs/typescript -o -d /usr/lib/nodejs/typescript",
    "the typescript package (the kernel parses every javascript and typescript cell)",
    "no typescript package: javascript and typescript cells fail (the kernel parses them with it)",
    "apt-get install node-typescript"))
end

-- The per-user server of `warmbox server start`, through `opts.local_server`
-- (warmbox.server.local_server): the one every command uses when it runs.
local function local_server_check(local_server)
  local ok, st, why = pcall(local_server)
  if ok and st then
    return check("local server", "ok", string_format("running at %s (pid %s): commands without an E2B key use it",
      tostring(st.url), tostring(st.pid)))
  end
  why = tostring(ok and why or st)
  return check("local server", "warn", (why == "not running" and why or "not running (" .. why .. ")")
    .. ": each command starts an embedded warmboxd whose sandboxes end with it", "warmbox server start")
end

-- A cgroup v2 subtree this user may manage (systemd's user slice delegates
-- one): its directory when it has the memory controller, or nil.
local function delegated_cgroup2()
  local f = io_open("/proc/self/cgroup", "rb")
  local own = f and f:read("a"):match("\n?0::(/[^\n]*)")
  if f then f:close() end
  if not own then return nil end
  for _, mnt in ipairs({ "/sys/fs/cgroup", "/sys/fs/cgroup/unified" }) do
    local controllers = read_line(mnt .. "/cgroup.controllers")
    if controllers then
      local dir = (mnt .. own):gsub("/$", "")
      local mine = read_line(dir .. "/cgroup.controllers") or ""
      if mine:find("memory", 1, true) and os_execute("test -w " .. sh_quote(dir .. "/cgroup.subtree_control")) then
        return dir
      end
      return nil
    end
  end
  return nil
end

--- Which per-sandbox limits a warmboxd run by this user gets (docs/warmboxd.md,
-- "Per-sandbox limits"). "ok" as root with cgroup v1's memory controller,
-- else "warn" naming what holds and what does not.
local function limits_check()
  local _, uid = run("id -u")
  if uid == "0" and os_execute("test -w /sys/fs/cgroup/memory -a -w /sys/fs/cgroup/pids") then
    return check("sandbox limits", "ok", "as root: per sandbox a memory cgroup (memoryMB, its files included), "
      .. "pids (256) and cpu (2 cores) cgroups, one tmpfs of diskSizeMB for home and /tmp, /dev/shm of half "
      .. "memoryMB, a host uid of its own (processes and inotify counted per sandbox)")
  end
  local cg = delegated_cgroup2()
  return check("sandbox limits", "warn", (uid == "0" and "as root without cgroup v1 memory and pids" or
    "without root") .. ": per sandbox one tmpfs of diskSizeMB for home and /tmp (in warmboxd's own user "
    .. "and mount namespaces), 256 processes (counted in its user namespace), 16 inotify instances and "
    .. "8192 watches; per process RLIMIT_DATA = memoryMB and /dev/shm of half memoryMB; NO limit on a "
    .. "sandbox's total memory (its processes together) or cpu; "
    .. (cg and ("a delegated cgroup v2 subtree (" .. cg .. ") is there, but warmboxd does not use one yet")
      or "no delegated cgroup v2 subtree with the memory controller"),
    "run warmboxd as root (with /sys/fs/cgroup/memory and pids) for per-sandbox memory and cpu limits")
end

--- The checks of the embedded server (warmboxd on this machine).
-- @tparam table opts `find_bin` (`warmbox.server.find_bin`: given by the caller, so
--   doctor and server do not require each other), `warmboxd` (the binary),
--   `local_server` (optional: `warmbox.server.local_server`, adds the "local server" check)
-- @treturn table a list of checks
function _M.embedded(opts)
  opts = opts or {}
  local list = {}
  local function add(c) list[#list + 1] = c end

  if type(opts.find_bin) ~= "function" then
    require("warmbox.errors").bad_option(1, "embedded", "find_bin", "a function expected (warmbox.server.find_bin)")
  end
  local bin, berr = opts.find_bin(opts.warmboxd)
  add(bin and check("warmboxd", "ok", bin)
    or check("warmboxd", "fail", berr, "build it (scripts/setup), or set WARMBOXD_BIN to its path"))

  local bwrap = which("bwrap")
  local m = missing("bubblewrap", "bwrap", "/usr/bin/bwrap", "fail", "",
    "apt-get install bubblewrap (Debian's package installs /usr/bin/bwrap)")
  if m then
    add(m)
  else
    add(check("bubblewrap", "ok", bwrap))
    local ok, why = run(sh_quote(bwrap) .. " --unshare-all --die-with-parent --ro-bind / / --dev /dev "
      .. "--proc /proc /bin/true")
    if ok then
      add(check("user namespaces", "ok", "bwrap --unshare-all runs"))
    else
      local fix = "let unprivileged users make user namespaces"
      if read_line("/proc/sys/kernel/unprivileged_userns_clone") == "0" then
        fix = "sysctl -w kernel.unprivileged_userns_clone=1"
      elseif read_line("/proc/sys/user/max_user_namespaces") == "0" then
        fix = "sysctl -w user.max_user_namespaces=15000"
      elseif read_line("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1" then
        fix = "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile for bwrap)"
      elseif os_execute("test -f /.dockerenv") then
        fix = "run the container with --security-opt seccomp=unconfined (or --privileged)"
      end
      add(check("user namespaces", "fail", "bwrap cannot make a jail: " .. why, fix
        .. "; or start warmboxd with --unisolated (unsafe)"))
    end
  end

  add_python_checks(add)

  add_node_checks(add)

  add(missing("slirp4netns", "slirp4netns", "/usr/bin/slirp4netns", "warn", ": sandboxes get no internet access",
    "apt-get install slirp4netns")
    or check("slirp4netns", "ok", "/usr/bin/slirp4netns: sandboxes that allow it reach the internet"))

  add(test_check("cgroup freezer", "-d /sys/fs/cgroup/freezer -a -w /sys/fs/cgroup/freezer",
    "/sys/fs/cgroup/freezer is writable: a pause freezes the sandbox",
    "no writable cgroup-v1 freezer: a pause stops the sandbox with SIGSTOP (memory kept, no cgroup limits)",
    "run warmboxd as root with /sys/fs/cgroup/freezer mounted"))
  if type(opts.local_server) == "function" then add(local_server_check(opts.local_server)) end
  add(limits_check())
  return list
end

-- Looks template up among the team's templates (GET /templates, by id or
-- alias); returns whether it is there, whether they were listed, the response.
local function find_template(client, key, template)
  local http = client.http
  local res = http and http:request{ method = "GET", url = client.api_url .. "/templates",
    headers = { ["X-API-Key"] = key }, timeout = 10 }
  local found, listed = false, false
  if res and res.status == 200 then
    local t = require("warmbox.json").decode(res.body)
    if type(t) == "table" then
      listed = true
      for _, tp in ipairs(t) do
        if type(tp) == "table" then
          if tp.templateID == template then found = true end
          for _, a in ipairs(type(tp.aliases) == "table" and tp.aliases or {}) do
            if a == template then found = true end
          end
        end
      end
    end
  end
  return found, listed, res
end

--- The checks of an E2B setup.
-- @tparam[opt] table opts `api_key` (default $E2B_API_KEY), `api_url`, `template`
--   (default code-interpreter-v1)
-- @treturn table a list of checks
function _M.e2b(opts)
  opts = opts or {}
  local list = {}
  local function add(c) list[#list + 1] = c end
  local key = opts.api_key or os_getenv("E2B_API_KEY")
  if key == "" then key = nil end
  if not key then
    add(check("E2B key", "fail", "no API key: E2B_API_KEY is not set (without one warmbox runs a local warmboxd)",
      "export E2B_API_KEY=e2b_... (from the E2B dashboard), or pass --api-key"))
    return list
  end
  add(check("E2B key", "ok", key:sub(1, 8) .. "..."))
  local e2b = require "warmbox.e2b"
  local ok, client = pcall(e2b.new, { api_key = key, api_url = opts.api_url, request_timeout = 10 })
  if not ok then
    add(check("E2B API", "fail", tostring(client), "check --api-url / E2B_API_URL"))
    return list
  end
  local first, err, code = client:list{ limit = 1 }()
  if first == false then
    local fix = code == "AUTH"
      and "the key was refused: check E2B_API_KEY" or "check the network and --api-url / E2B_API_URL"
    add(check("E2B API", "fail", string_format("%s answered: %s (%s)", tostring(client.api_url), tostring(err),
      tostring(code)), fix))
    client:close()
    return list
  end
  add(check("E2B API", "ok", tostring(client.api_url) .. " answers and accepts the key"))
  local template = opts.template or "code-interpreter-v1"
  local found, listed, res = find_template(client, key, template)
  local public = { ["code-interpreter-v1"] = true, base = true, desktop = true }
  if found then
    add(check("template", "ok", template .. " is one of the team's templates"))
  elseif public[template] then
    add(check("template", "ok", template .. " is a public E2B template"))
  elseif listed then
    add(check("template", "fail", template .. " is not among the team's templates",
      "build it (e2b template build) or pass --template NAME"))
  else
    add(check("template", "warn", string_format("cannot list templates (%s): %s not checked",
      res and ("HTTP " .. tostring(res.status)) or "no answer", template), "pass --template NAME if it is wrong"))
  end
  client:close()
  return list
end

-- ---------------------------------------------------------------------------
-- the Redis lock: one node, Sentinel or Cluster
-- ---------------------------------------------------------------------------

-- A connection to "host:port" with the lock's auth (no database for a cluster node).
local function redis_node(r, addr, db)
  local core = require "warmbox.core"
  if not core.redis then return nil, "warmbox.core was built without hiredis" end
  local host, port = addr:match("^%[?(.-)%]?:(%d+)$")
  return core.redis{ host = host, port = tonumber(port), timeout = r.timeout or 2, username = r.username,
    password = r.password, db = db }
end

-- The fields of a flat Redis reply { k1, v1, k2, v2, ... }.
local function fields(list)
  local kv = {}
  for i = 1, type(list) == "table" and #list or 0, 2 do kv[list[i]] = list[i + 1] end
  return kv
end

local function sentinel_checks(r, add)
  local agree, primary = 0, nil
  for _, a in ipairs(r.sentinels) do
    local host, port = a:match("^%[?(.-)%]?:(%d+)$")
    local c, err = require("warmbox.core").redis{ host = host, port = tonumber(port), timeout = r.timeout or 2 }
    local m = c and c:command("SENTINEL", "MASTER", r.master)
    if not c then
      add(check("sentinel " .. a, "warn", "unreachable: " .. tostring(err), "start it, or drop it from the list"))
    elseif type(m) ~= "table" then
      add(check("sentinel " .. a, "fail", "does not monitor '" .. r.master .. "'",
        "sentinel monitor " .. r.master .. " <host> <port> <quorum>"))
    else
      local kv = fields(m)
      agree = agree + 1
      primary = primary or (kv.ip .. ":" .. kv.port)
      local flags = tostring(kv.flags)
      add(check("sentinel " .. a, flags == "master" and "ok" or "warn", string_format(
        "primary %s:%s (%s), %s replica(s), %s other sentinel(s), quorum %s", kv.ip, kv.port, flags,
        tostring(kv["num-slaves"]), tostring(kv["num-other-sentinels"]), tostring(kv.quorum)),
        "a primary is failed over only while a quorum of sentinels sees it down"))
    end
    if c then c:close() end
  end
  if agree == 0 then
    add(check("Redis primary", "fail", "no sentinel answered for '" .. r.master .. "'", "check sentinels and master"))
  end
  return primary
end

-- The write test: a key with the lock's prefix set and read back (PX 10 s).
local function write_check(name, c, r, key)
  local k = (r.prefix or "warmbox:") .. "doctor:" .. key
  local ok, err = c:command("SET", k, "1", "PX", 10000)
  if ok and c:command("GET", k) == "1" then
    c:command("DEL", k)
    return check(name, "ok", "writes and reads back")
  end
  return check(name, "fail", "cannot write: " .. tostring(err), "check the ACL user's rights on the lock's prefix")
end

local function cluster_checks(r, add)
  local rc = require "warmbox.lock.redis_client"
  for _, a in ipairs(r.nodes) do
    local c, err = redis_node(r, a)
    local info = c and c:command("CLUSTER", "INFO")
    if not c then
      add(check("cluster node " .. a, "warn", "unreachable: " .. tostring(err), "another seed answers meanwhile"))
    elseif type(info) ~= "string" then
      add(check("cluster node " .. a, "fail", "not a cluster node", "use redis:// for a single Redis"))
    else
      local state = info:match("cluster_state:(%w+)") or "?"
      local slots = info:match("cluster_slots_ok:(%d+)") or "?"
      local reps, prim = 0, 0
      for _, range in ipairs(c:command("CLUSTER", "SLOTS") or {}) do
        prim = prim + 1
        if range[4] then reps = reps + 1 end
      end
      add(check("cluster node " .. a, state == "ok" and slots == "16384" and "ok" or "fail",
        string_format("state %s, %s of 16384 slots ok, %d slot range(s), %d with a replica", state, slots, prim, reps),
        "every slot must be served: redis-cli --cluster fix"))
      if reps < prim then
        add(check("cluster replicas", "warn", "a slot range has no replica: its primary's loss stops its sessions",
          "add a replica to each primary"))
      end
    end
    if c then c:close() end
  end
  -- the lock's scripts touch five keys of one hash tag: run one such script
  local cl = rc.client(r)
  local lname, tag = rc.name(r, "lock", "doctor")
  local res, err = cl:call(tag, "EVAL", "redis.call('set', KEYS[1], 1, 'PX', 10000) "
    .. "redis.call('set', KEYS[2], 1, 'PX', 10000) return redis.call('del', KEYS[1], KEYS[2])", 2, lname,
    (rc.name(r, "fence", "doctor")))
  add(check("cluster scripts", res == 2 and "ok" or "fail", res == 2 and "a script over one hash tag's keys runs"
    or "a script over one hash tag's keys failed: " .. tostring(err), "check the ACL user's rights (EVAL)"))
end

--- The checks of a Redis lock: `r` its redis options (warmbox.lock's: host,
-- port | sentinels, master | nodes; username, password, db, prefix, timeout).
-- @treturn table a list of checks
function _M.redis(r)
  local list = {}
  local function add(c) list[#list + 1] = c end
  local rc = require "warmbox.lock.redis_client"
  add(check("Redis topology", "ok", rc.topology(r) .. (r.username and (" as user " .. r.username) or "")
    .. (r.password and ", with a password" or "") .. "; no TLS (Debian's hiredis has no TLS)"))
  if r.nodes then
    cluster_checks(r, add)
    return list
  end
  local addr = r.sentinels and sentinel_checks(r, add) or ((r.host or "127.0.0.1") .. ":" .. (r.port or 6379))
  if not addr then return list end
  local c, err = redis_node(r, addr, r.db)
  if not c then
    add(check("Redis primary", "fail", addr .. ": " .. tostring(err), "check the address, the user and the password"))
    return list
  end
  local role = c:command("ROLE")
  local is_primary = type(role) == "table" and role[1] == "master"
  add(check("Redis primary", is_primary and "ok" or "fail", addr .. (is_primary
    and string_format(" is a primary with %d replica(s)", type(role[3]) == "table" and #role[3] or 0)
    or " is not a primary"), "point the lock at the primary (or use Sentinel)"))
  if is_primary then add(write_check("Redis writes", c, r, "check")) end
  c:close()
  return list
end

--- The first failing check of a set ("embedded" or "e2b"), or nil.
function _M.first_failure(which_set, opts)
  local list = (which_set == "e2b" and _M.e2b or _M.embedded)(opts)
  for _, c in ipairs(list) do
    if c.status == "fail" then return c end
  end
  return nil
end

--- Print the checks; returns the number that failed.
function _M.print(out, title, list)
  local failed = 0
  out:write(title, "\n")
  for _, c in ipairs(list) do
    local mark = c.status == "ok" and "ok  " or c.status == "warn" and "warn" or "FAIL"
    if c.status == "fail" then failed = failed + 1 end
    out:write(string_format("  %s  %-16s %s\n", mark, c.name, tostring(c.detail or "")))
    if c.status ~= "ok" and c.fix then out:write(string_format("        %-16s fix: %s\n", "", c.fix)) end
  end
  return failed
end

return _M
