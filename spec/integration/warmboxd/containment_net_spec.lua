-- What sandbox code cannot do to the host, to warmboxd or to other sandboxes
-- over real HTTP against a real warmboxd: reach the host's
-- loopback, run code without the access token, read warmboxd's descriptors,
-- own files as host root, exhaust processes, memory or disk, outlive its
-- execute timeout, or grow warmboxd's memory with output nobody reads.
-- Traffic goes only to loopback addresses or into namespaces warmboxd made.
-- This file: the part 'net' of them; shared helpers in spec/helpers/warmboxd_containment.lua.
local shared = require "spec.helpers.warmboxd_containment"
local wbd = shared.wbd
local http = shared.http
local cjson = shared.cjson
local q = shared.q
local main_text = shared.main_text
local error_of = shared.error_of
local sh = shared.sh
local listener = shared.listener
local IFACES = shared.IFACES

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

  describe("network", function()
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

  describe("one network per sandbox", function()
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

  describe("the code interpreter's access token", function()
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

  describe("descriptors", function()
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

  describe("seccomp", function()
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

  describe("identity", function()
    it("files a cell makes belong to an unprivileged host uid; writable mounts are nosuid,nodev", function()
      local sb = create()
      py(sb, "import os\nopen('/home/user/mine', 'w').write('x')\nos.chmod('/home/user/mine', 0o4755)\n"
        .. "open('/tmp/t', 'w').write('x')\nNone")
      local dir = srv:ns_path(srv:sandbox_dir(sb.sandboxID))
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

end)
