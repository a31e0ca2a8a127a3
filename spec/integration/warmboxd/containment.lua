-- What sandbox code cannot do to the host, to warmboxd or to other sandboxes
-- over real HTTP against a real warmboxd: reach the host's
-- loopback, run code without the access token, read warmboxd's descriptors,
-- own files as host root, exhaust processes, memory or disk, outlive its
-- execute timeout, or grow warmboxd's memory with output nobody reads.
-- Traffic goes only to loopback addresses or into namespaces warmboxd made.

-- Run in parts (spec.helpers.parts), one spec file a group: warmboxd_containment_<group>_spec.lua.
local part = (...)({
  net = {
    "network",
    "one network per sandbox",
    "the code interpreter's access token",
    "descriptors",
    "seccomp",
    "identity",
  },
  limits = {
    "limits",
    "limits without cgroups (the rlimit fallback)",
  },
  output = {
    "timeouts",
    "output",
  },
})
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local nd = require "spec.helpers.ndjson"

local cjson = http.cjson
local q = wbd.sh_quote

local main_text, error_of = nd.main_text, nd.error_in

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>/dev/null"))
  local s = p:read("a")
  p:close()
  return s
end

local function rss_kb(pid, field)
  local s = wbd.read_all("/proc/" .. pid .. "/status") or ""
  return tonumber(s:match((field or "VmRSS") .. ":%s*(%d+)")) or 0
end

-- A TCP listener on the host that accepts forever; returns its port and pid.
local function listener(host)
  local tmp = os.tmpname()
  local code = "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    .. "s.bind((" .. string.format("%q", host) .. ", 0))\ns.listen(64)\n"
    .. "open(" .. string.format("%q", tmp) .. ", 'w').write(str(s.getsockname()[1]))\n"
    .. "while True:\n    s.accept()[0].close()\n"
  -- env -u LD_PRELOAD: the sanitizer run preloads ASan into lua5.4 only.
  local pid = tonumber(sh("env -u LD_PRELOAD python3 -c " .. q(code) .. " >/dev/null 2>&1 & echo $!"))
  local port = wbd.eventually(function() return tonumber(wbd.read_all(tmp) or "") end, 60)
  os.remove(tmp)
  return assert(port), pid
end

-- The cell's network interfaces, from /proc/net/dev.
local IFACES = "' '.join(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))"

describe("warmboxd containment", function()
  local srv

  local function create(extra) return http.create_interp(srv, extra) end

  local function run(box, code, o)
    o = o or {}
    local res = http.sandbox(srv, box, 49999, "POST", "/execute",
      { json = { code = code, timeout = o.timeout }, timeout = o.max_time or 120 })
    assert.are.equal(200, res.status, res.body)
    return res.body
  end

  local function py(box, code, o)
    local body = run(box, code, o)
    assert.is_nil(error_of(body), body)
    return main_text(body)
  end

  local function kill(box)
    http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID)
  end

  lazy_setup(function()
    srv = wbd.start{ wrapper = "env WARMBOXD_INTERRUPT_GRACE_MS=1500 " .. (os.getenv("WARMBOXD_WRAPPER") or "") }
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  part("network", function()
    local p1, pid1, p2, pid2
    lazy_setup(function()
      p1, pid1 = listener("127.0.0.1")
      p2, pid2 = listener("0.0.0.0")
    end)
    lazy_teardown(function()
      if pid1 then os.execute("kill " .. pid1) end
      if pid2 then os.execute("kill " .. pid2) end
    end)

    local function try(box, targets)
      local code = { "import socket", "r = []" }
      for _, t in ipairs(targets) do
        code[#code + 1] = "try:\n    socket.create_connection((" .. string.format("%q", t[1]) .. ", " .. t[2]
          .. "), timeout=3).close()\n    r.append('connected')\nexcept OSError as e:\n    r.append(type(e).__name__)"
      end
      code[#code + 1] = "' '.join(r)"
      local out = {}
      for w in py(box, table.concat(code, "\n")):gmatch("%S+") do out[#out + 1] = w end
      return out
    end

    local function targets()
      return {
        { "127.0.0.1", srv.port }, { "127.0.0.1", p1 }, { "127.0.0.2", p2 },
        -- slirp4netns's gateway, which leads to the host's loopback unless disabled
        { "10.0.2.2", srv.port }, { "10.0.2.2", p1 }, { "10.0.2.2", p2 },
      }
    end

    it("the host's listeners answer the host (the control for the cases below)", function()
      assert.are.equal("connected connected connected", sh("python3 -c " .. q(
        "import socket\nr = []\nfor h, p in [('127.0.0.1', " .. srv.port .. "), ('127.0.0.1', " .. p1 .. "), "
        .. "('127.0.0.2', " .. p2 .. ")]:\n    socket.create_connection((h, p), timeout=3).close()\n"
        .. "    r.append('connected')\nprint(' '.join(r))")):gsub("%s+$", ""))
    end)

    it("with internet access: an interface of its own, and never the host's loopback or warmboxd", function()
      local sb = create{ allow_internet_access = true }
      for i, r in ipairs(try(sb, targets())) do
        assert.are_not.equal("connected", r, "target " .. i)
      end
      assert.are.equal("lo tap0", py(sb, IFACES))
      -- DNS through slirp4netns's forwarder: the host's resolver may be on its loopback
      assert.are.equal("nameserver 10.0.2.3", py(sb, "open('/etc/resolv.conf').read().strip()"))
      kill(sb)
    end)

    it("without internet access: loopback only", function()
      local sb = create{ allow_internet_access = false }
      assert.are.equal("lo", py(sb, IFACES))
      for i, r in ipairs(try(sb, targets())) do
        assert.are_not.equal("connected", r, "target " .. i)
      end
      kill(sb)
    end)
  end)

  part("one network per sandbox", function()
    -- envd's Process.Start (its own jail), synchronously; returns the exit code.
    local function proc(box, code)
      local json = cjson.encode({ process = { cmd = "/usr/bin/python3", args = { "-c", code } } })
      local res = http.sandbox(srv, box, 49983, "POST", "/process.Process/Start", {
        body = string.pack(">I1I4", 0, #json) .. json,
        headers = { ["Content-Type"] = "application/connect+json", ["Connect-Protocol-Version"] = "1" } })
      assert.are.equal(200, res.status, res.body)
      local pos = 1
      while pos <= #res.body do
        local _, len = string.unpack(">I1I4", res.body, pos)
        local m = cjson.decode(res.body:sub(pos + 5, pos + 4 + len))
        local e = m.event and m.event["end"]
        if e then return e.exitCode or 0 end
        pos = pos + 5 + len
      end
    end

    it("a kernel's server answers the sandbox's other processes, not another sandbox", function()
      local a, b = create{ allow_internet_access = false }, create{ allow_internet_access = false }
      py(a, "import subprocess\nsrv = subprocess.Popen(['python3', '-c', 'import socket\\ns = socket.socket()\\n"
        .. "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\\ns.bind((\"127.0.0.1\", 8123))\\ns.listen()\\n"
        .. "while True: s.accept()[0].close()'])\nimport time\ntime.sleep(1)\nNone")
      local probe = "import socket, sys\ntry:\n    socket.create_connection(('127.0.0.1', 8123), timeout=3).close()\n"
        .. "except OSError:\n    sys.exit(3)"
      assert.are.equal(0, proc(a, probe))
      assert.are.equal(3, proc(b, probe))
      kill(a)
      kill(b)
    end)
  end)

  part("the code interpreter's access token", function()
    it("is required on /execute of a secure sandbox (401 without or wrong), as E2B's", function()
      local sb = create()
      local anon = { sandboxID = sb.sandboxID }
      local wrong = { sandboxID = sb.sandboxID, envdAccessToken = "nope" }
      for _, who in ipairs({ anon, wrong }) do
        assert.are.equal(401, http.sandbox(srv, who, 49999, "POST", "/execute", { json = { code = "1" } }).status)
      end
      assert.are.equal(200, http.sandbox(srv, anon, 49999, "GET", "/health").status)
      assert.are.equal("2", py(sb, "1 + 1"))
      kill(sb)
    end)

    it("is not needed by a sandbox that has none", function()
      local sb = create{ secure = false }
      assert.is_nil(sb.envdAccessToken)
      assert.are.equal("2", py(sb, "1 + 1"))
      kill(sb)
    end)
  end)

  part("descriptors", function()
    -- A kernel holds its own pipes (requests, events, captured fds 1 and 2),
    -- /dev/null and IPython's history under /tmp/.ipython; nothing of
    -- warmboxd's: no socket, not its log.
    it("a cell sees only the kernel's own pipes and /dev/null, a child process only 0, 1, 2", function()
      local sb = create()
      local kinds = py(sb, table.concat({
        "import os",
        "k = set()",
        "for fd in os.listdir('/proc/self/fd'):",
        "    try:",
        "        t = os.readlink('/proc/self/fd/' + fd)",
        "    except OSError:",
        "        continue",
        "    own = t.startswith(('pipe:', '/tmp/.ipython/', '/proc/')) or t == '/dev/null'",
        "    k.add('own' if own else t)",
        "' '.join(sorted(k))",
      }, "\n"))
      assert.are.equal("own", kinds)
      local log_target = sh("readlink /proc/" .. srv.pid .. "/fd/2"):gsub("%s+$", "")
      assert.is_truthy(log_target:find("warmboxd.log", 1, true), log_target)
      assert.are.equal("0 1 2 3", py(sb, "import subprocess\n' '.join(sorted(subprocess.run(['ls', '/proc/self/fd'], "
        .. "close_fds=False, capture_output=True, text=True).stdout.split()))"))
      local bash = run(sb, "ls /proc/self/fd | sort | tr '\\n' ' '", {})
      assert.is_nil(error_of(bash), bash)
      kill(sb)
    end)
  end)

  part("seccomp", function()
    it("keyrings, eBPF, perf, userfaultfd, io_uring and namespaces are refused with EPERM", function()
      local sb = create()
      local out = py(sb, table.concat({
        "import ctypes",
        "libc = ctypes.CDLL(None, use_errno=True)",
        "r = []",
        -- keyctl(GET_KEYRING_ID, session), bpf(MAP_CREATE, NULL, 0), perf_event_open(NULL, ...),
        -- userfaultfd(0), io_uring_setup(1, NULL), unshare(CLONE_NEWNET), setns(0, 0)
        "for nr, args in [(250, (0, -3, 0)), (321, (0, 0, 0)), (298, (0, 0, -1, -1, 0)), (323, (0,)),",
        "                 (425, (1, 0)), (272, (0x40000000,)), (308, (0, 0))]:",
        "    ctypes.set_errno(0)",
        "    rc = libc.syscall(nr, *args)",
        "    e = ctypes.get_errno()",
        "    r.append('%d:%s' % (nr, 'EPERM' if rc == -1 and e == 1 else 'rc=%d errno=%d' % (rc, e)))",
        "' '.join(r)",
      }, "\n"))
      assert.are.equal("250:EPERM 321:EPERM 298:EPERM 323:EPERM 425:EPERM 272:EPERM 308:EPERM", out)
      -- and ordinary work is not
      assert.are.equal("6", py(sb, "import numpy, subprocess\nsubprocess.run(['true'], check=True)\n"
        .. "int(numpy.arange(4).sum())"))
      kill(sb)
    end)
  end)

  part("identity", function()
    it("files a cell makes belong to an unprivileged host uid; writable mounts are nosuid,nodev", function()
      local sb = create()
      py(sb, "import os\nopen('/home/user/mine', 'w').write('x')\nos.chmod('/home/user/mine', 0o4755)\n"
        .. "open('/tmp/t', 'w').write('x')\nNone")
      local dir = srv:ns_path(srv.dir .. "/data/" .. sb.sandboxID)
      local st = sh("stat -c '%u %a' " .. q(dir .. "/home/mine")):gsub("%s+$", "")
      local uid, mode = st:match("^(%d+) (%d+)$")
      assert.is_truthy(uid, st)
      if sh("id -u"):match("^0") then assert.are_not.equal("0", uid) end
      assert.are.equal("4755", mode)
      assert.are.equal(uid, (sh("stat -c %u " .. q(dir .. "/tmp/t")):gsub("%s+$", "")))
      local opts = py(sb, table.concat({
        "r = []",
        "for line in open('/proc/self/mountinfo'):",
        "    f = line.split()",
        "    if f[4] in ('/home/user', '/tmp'):",
        "        o = f[5].split(',')",
        "        r.append(f[4] + '=' + ('nosuid' in o and 'nodev' in o and 'ok' or f[5]))",
        "' '.join(sorted(r))",
      }, "\n"))
      assert.are.equal("/home/user=ok /tmp=ok", opts)
      kill(sb)
    end)

    it("the data directory is 0700 even when it existed with a wider mode", function()
      local dir = os.tmpname()
      os.remove(dir)
      os.execute("mkdir -m 0755 " .. q(dir))
      local s2 = wbd.start{ args = { "--data-dir", dir } }
      local mode = sh("stat -c %a " .. q(dir)):gsub("%s+$", "")
      s2:stop()
      os.execute("rm -rf " .. q(dir))
      assert.are.equal("700", mode)
    end)
  end)

  -- Shared by the cgroup and the rlimit cases below.
  local function fork_bomb()
    local sb, other = create(), create()
    py(other, "1")
    local out = py(sb, table.concat({
      "import os, signal, time",
      "kids, err = [], None",
      "for _ in range(2000):",
      "    try:",
      "        pid = os.fork()",
      "    except OSError as e:",
      "        err = type(e).__name__",
      "        break",
      "    if pid == 0:",
      "        time.sleep(30)",
      "        os._exit(0)",
      "    kids.append(pid)",
      "n = len(kids)",
      "for p in kids:",
      "    os.kill(p, signal.SIGKILL)",
      "for p in kids:",
      "    os.waitpid(p, 0)",
      "f'{err} {n}'",
    }, "\n"))
    local err, n = out:match("^(%S+) (%d+)$")
    assert.are.equal("BlockingIOError", err, out)
    assert.is_true(tonumber(n) < 2000)
    assert.are.equal("2", py(other, "1 + 1"))
    assert.are.equal(200, http.request{ url = srv.url .. "/health" }.status)
    kill(sb)
    kill(other)
  end

  -- A 512 MB sandbox (templates other than code-interpreter-v1 get E2B's
  -- default size) for the 1 GiB allocation to overflow.
  local function memory_hog(expect)
    local sb, other = create{ templateID = "base" }, create()
    py(other, "1")
    local before = rss_kb(srv.pid)
    local body = run(sb, "x = b'x' * (1 << 30)\nlen(x)")
    local e = error_of(body)
    assert.is_truthy(e, body)
    assert.are.equal(expect, e.name, body)
    if e.name == "OutOfMemoryError" then assert.is_truthy(e.value:find("state was lost", 1, true)) end
    assert.is_nil(main_text(body))
    assert.are.equal("2", py(other, "1 + 1"))
    assert.are.equal("2", py(sb, "1 + 1"))
    assert.is_true(rss_kb(srv.pid) - before < 64 * 1024)
    kill(sb)
    kill(other)
  end

  part("limits", function()
    it("each sandbox has its memory, pids and cpu groups (cgroup v1) with the template's limits", function()
      -- code-interpreter-v1 as E2B builds it: 2 vCPU, 2048 MB, listed and enforced
      local sb = create()
      local info = http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json
      assert.are.same({ 2, 2048 }, { info.cpuCount, info.memoryMB })
      py(sb, "1")
      local function read(ctrl, file)
        local v = wbd.read_all(string.format("/sys/fs/cgroup/%s/warmboxd-%d/%s/%s", ctrl, srv.pid, sb.sandboxID, file))
        return v and v:gsub("%s+$", "")
      end
      if not read("memory", "memory.limit_in_bytes") then
        -- no cgroup v1 here (e.g. a cgroup v2 host): the rlimit fallback holds
        local limits = py(sb, "open('/proc/self/limits').read()")
        assert.is_truthy(limits:find("Max processes%s+256%s"), limits)
        assert.is_truthy(limits:find("Max data size%s+2147483648%s"), limits)
        kill(sb)
        return
      end
      assert.are.equal(tostring(2048 * 1024 * 1024), read("memory", "memory.limit_in_bytes"))
      assert.are.equal("256", read("pids", "pids.max"))
      assert.are.equal("200000", read("cpu", "cpu.cfs_quota_us"))
      assert.are.equal("512", read("cpu", "cpu.shares"))
      -- the kernel is in them
      local procs = read("memory", "cgroup.procs")
      assert.is_truthy(procs and procs:match("%d"))
      kill(sb)
      assert.is_nil(read("memory", "memory.limit_in_bytes"))
    end)

    it("a bounded fork bomb fails inside its sandbox; warmboxd and another sandbox keep answering", fork_bomb)

    it("a 1 GiB allocation fails inside a 512 MB sandbox (OOM kill in its memory group); warmboxd and another "
      .. "sandbox keep answering", function()
      local v1 = os.execute("test -d /sys/fs/cgroup/memory/warmboxd-" .. srv.pid) == true
      memory_hog(v1 and "OutOfMemoryError" or "MemoryError")
    end)

    it("the writable home is size-limited (1 GiB): a disk filler fails inside its sandbox", function()
      local sb = create()
      local body = run(sb, table.concat({
        "chunk = b'z' * (1 << 20)",
        "with open('/home/user/fill', 'wb') as f:",
        "    for _ in range(1600):",
        "        f.write(chunk)",
        "'filled'",
      }, "\n"))
      assert.is_truthy(error_of(body), body)
      assert.is_nil(main_text(body))
      local size = tonumber(sh("stat -c %s " .. q(srv:sandbox_home(sb.sandboxID) .. "/fill"))) or 0
      assert.is_true(size <= 1024 * 1024 * 1024)
      assert.are.equal(200, http.request{ url = srv.url .. "/health" }.status)
      kill(sb)
    end)
  end)

  part("limits without cgroups (the rlimit fallback)", function()
    local main
    lazy_setup(function()
      main = srv
      srv = wbd.start{ wrapper = "env WARMBOXD_NO_LIMIT_CGROUPS=1 " .. (os.getenv("WARMBOXD_WRAPPER") or "") }
    end)
    lazy_teardown(function()
      srv:stop()
      srv = main
    end)

    it("RLIMIT_NPROC stops a fork bomb", fork_bomb)
    it("RLIMIT_DATA turns a 1 GiB allocation into MemoryError", function() memory_hog("MemoryError") end)
  end)

  part("timeouts", function()
    it("a cell that catches KeyboardInterrupt is ended by a kernel restart; the error says state was lost", function()
      local sb = create()
      py(sb, "kept = 'before'")
      local t0 = os.time()
      local body = run(sb, "import time\nwhile True:\n    try:\n        time.sleep(30)\n    except KeyboardInterrupt:\n"
        .. "        pass", { timeout = 1, max_time = 60 })
      local e = error_of(body)
      assert.is_truthy(e, body)
      assert.are.equal("TimeoutError", e.name)
      assert.is_truthy(e.value:find("state was lost", 1, true), e.value)
      assert.is_true(os.time() - t0 < 20)
      assert.are.equal("False", py(sb, "str('kept' in globals())"))
      kill(sb)
    end)

    it("a run whose client left while it waited for the context never starts", function()
      local sb = create()
      py(sb, "1")
      local bg = os.tmpname()
      -- the first run holds the context for 3 s
      os.execute(string.format("curl -sS -N --max-time 60 -X POST -H %s -H %s -H %s --data-binary %s %s >%s 2>&1 &",
        q("E2b-Sandbox-Id: " .. sb.sandboxID), q("E2b-Sandbox-Port: 49999"),
        q("X-Access-Token: " .. sb.envdAccessToken),
        q(cjson.encode({ code = "import time\ntime.sleep(3)\n'first'" })), q(srv.url .. "/execute"), q(bg)))
      wbd.sleep(0.5)
      -- the second gives up after 1 s, while it still waits
      local res = http.sandbox(srv, sb, 49999, "POST", "/execute",
        { json = { code = "open('/home/user/ran', 'w').write('x')" }, timeout = 1 })
      assert.are_not.equal(200, res.status)
      assert.is_truthy(wbd.eventually(function() return (wbd.read_all(bg) or ""):find("first", 1, true) end, 20))
      os.remove(bg)
      assert.are.equal("False", py(sb, "import os\nstr(os.path.exists('/home/user/ran'))"))
      kill(sb)
    end)
  end)

  part("output", function()
    it("a 200 MB kernel line without a newline is dropped past 16 MiB, in linear time", function()
      local sb = create()
      py(sb, "1")
      local before = rss_kb(srv.pid, "VmHWM")
      -- fd 4 is the kernel's event pipe (kernel.py: CTL, EVT, DIAG = dup(0), dup(1), dup(2))
      local body = run(sb, table.concat({
        "import os",
        "chunk = b'z' * (1 << 20)",
        "for _ in range(200):",
        "    os.write(4, chunk)",
        "os.write(4, b'\\n')",
        "print('after')",
      }, "\n"), { max_time = 60 })
      local out = ""
      for _, l in ipairs((nd.lines(body, true))) do
        if l.type == "stdout" then out = out .. l.text end
      end
      assert.are.equal("after\n", out)
      -- ~16 MiB of buffer (ASan's quarantine of the grown buffers adds ~40 MB);
      -- a reader keeping the whole line grows by its 200 MB and more
      local grew = rss_kb(srv.pid, "VmHWM") - before
      assert.is_true(grew < 96 * 1024, string.format("peak RSS grew by %d kB", grew))
      kill(sb)
    end)

    it("a cell printing forever to a slow reader keeps warmboxd's memory bounded", function()
      local sb = create()
      py(sb, "1")
      local before = srv:heap_kb() -- the live heap, not RSS (see Server:heap_kb)
      local out = os.tmpname()
      local pid = tonumber(sh(string.format("curl -sS -N --limit-rate 20k --max-time 60 -X POST -H %s -H %s -H %s "
        .. "--data-binary %s %s >%s 2>&1 & echo $!", q("E2b-Sandbox-Id: " .. sb.sandboxID),
        q("E2b-Sandbox-Port: 49999"),
        q("X-Access-Token: " .. sb.envdAccessToken),
        q(cjson.encode({ code = "while True:\n    print('y' * 4000)" })), q(srv.url .. "/execute"), q(out))))
      local peak = before
      for _ = 1, 30 do
        wbd.sleep(0.2)
        local r = srv:heap_kb()
        if r > peak then peak = r end
      end
      os.execute("kill " .. pid)
      assert.is_truthy((wbd.read_all(out) or ""):find("yyyy", 1, true))
      os.remove(out)
      assert.is_true(peak - before < 48 * 1024, string.format("the heap grew by %d kB", peak - before))
      -- the context is usable again once the interrupted cell ended
      assert.are.equal("2", py(sb, "1 + 1"))
      kill(sb)
    end)
  end)
end)
