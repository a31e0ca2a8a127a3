-- The jail runtime against the containment audit,
-- over real HTTP against real warmboxd servers: no vsock socket in a jail, a
-- uid range of each root instance's own, bounded watchers on one inotify
-- instance per sandbox, a skeleton the root-run envd cannot break, a spawn
-- that never waits forever, and the size limits a non-root warmboxd sets.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local nd = require "spec.helpers.ndjson"
local envd = require "spec.helpers.envd"

local main_text, error_of = nd.main_text, nd.error_in

local function execute(srv, box, code)
  local res = http.sandbox(srv, box, 49999, "POST", "/execute", { json = { code = code }, timeout = 120 })
  assert.are.equal(200, res.status, res.body)
  return res.body
end

local function py(srv, box, code)
  local body = execute(srv, box, code)
  assert.is_nil(error_of(body), body)
  return main_text(body)
end

local function kill(srv, box) http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID) end

describe("warmboxd jail audit", function()
  local srv
  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function() if srv then srv:stop() end end)

  describe("seccomp", function()
    it("refuses AF_VSOCK sockets in cells and their processes (EAFNOSUPPORT); other families work", function()
      local box = http.create_interp(srv)
      local probe = table.concat({
        "import socket",
        "def vs(t):",
        "    try:",
        "        socket.socket(socket.AF_VSOCK, t).close()",
        "        return 'created'",
        "    except OSError as e:",
        "        return 'errno=%d' % e.errno",
        "print(vs(socket.SOCK_STREAM), vs(socket.SOCK_DGRAM))",
      }, "\n")
      local body = execute(srv, box, probe)
      assert.is_nil(error_of(body), body)
      local out = table.concat(nd.texts(nd.lines(body), "stdout"))
      assert.are.equal("errno=97 errno=97\n", out)
      -- a process the cell starts is under the same filter
      local sub = py(srv, box, "import subprocess, sys\nsubprocess.run([sys.executable, '-'], input="
        .. "'''" .. probe .. "''', capture_output=True, text=True).stdout.split()")
      assert.are.equal("['errno=97', 'errno=97']", sub)
      assert.are.equal("ok", py(srv, box, "import socket\na, b = socket.socketpair()\na.send(b'ok')\n"
        .. "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.close()\nb.recv(2).decode()"))
      kill(srv, box)
    end)
  end)

  describe("host uids (as root)", function()
    local function home_uid(server, box)
      -- the first sandbox of a server runs in slot 0: the range's first uid
      assert.are.equal("", py(server, box, "open('/home/user/.probe', 'w').close()\n''"))
      local p = assert(io.popen("stat -c %u " .. wbd.sh_quote(server:sandbox_home(box.sandboxID) .. "/.probe")))
      local uid = tonumber(p:read("a"))
      p:close()
      return assert(uid)
    end

    it("gives a second instance a range of its own, and refuses one another instance holds", function()
      local other = wbd.start{}
      local a, b = http.create_interp(srv), http.create_interp(other)
      local ua, ub = home_uid(srv, a), home_uid(other, b)
      assert.is_true(math.abs(ua - ub) >= 4096, ua .. " and " .. ub .. " are in one range")
      kill(other, b)
      other:stop()
      -- an explicit base inside a range that is taken: the server does not start
      local ok, err = pcall(wbd.start, { wrapper = "env WARMBOXD_JAIL_UID_BASE=" .. ua })
      assert.is_false(ok)
      assert.matches("no host uid range for the jails: uids " .. ua .. "%-%d+ are ", err)
      kill(srv, a)
    end)
  end)

  describe("directory watchers", function()
    local function watcher(box, path, recursive)
      return http.sandbox(srv, box, 49983, "POST", "/filesystem.Filesystem/CreateWatcher",
        { json = { path = path, recursive = recursive }, headers = envd.RPC })
    end

    local function inotify_fds(pid)
      local p = assert(io.popen("ls -l /proc/" .. pid .. "/fd 2>/dev/null | grep -c inotify"))
      local n = tonumber(p:read("a"))
      p:close()
      return n
    end

    it("share one inotify instance for every sandbox (the host allows a uid 128)", function()
      local boxes = {}
      for i = 1, 3 do
        boxes[i] = http.create_interp(srv)
        for _ = 1, 4 do
          local res = watcher(boxes[i], "/home/user", false)
          assert.are.equal(200, res.status, res.body)
        end
      end
      assert.are.equal(1, inotify_fds(srv.pid))
      -- and each still sees its own sandbox's events only
      local res = watcher(boxes[1], "/home/user", false)
      local id = res.json.watcherId
      assert.are.equal("", py(srv, boxes[1], "open('/home/user/mine.txt', 'w').close()\n''"))
      assert.are.equal("", py(srv, boxes[2], "open('/home/user/theirs.txt', 'w').close()\n''"))
      local names = {}
      wbd.eventually(function()
        local ev = http.sandbox(srv, boxes[1], 49983, "POST", "/filesystem.Filesystem/GetWatcherEvents",
          { json = { watcherId = id }, headers = envd.RPC })
        for _, e in ipairs(ev.json.events or {}) do names[e.name] = true end
        return names["mine.txt"]
      end)
      assert.is_true(names["mine.txt"])
      assert.is_nil(names["theirs.txt"])
      for _, b in ipairs(boxes) do kill(srv, b) end
    end)

    it("bound the directories all of a sandbox's watchers hold, with a clear error", function()
      local box = http.create_interp(srv)
      assert.are.equal("3000", py(srv, box, "import os\nfor i in range(3000):\n"
        .. "    os.makedirs('/home/user/t/%d' % i)\nstr(len(os.listdir('/home/user/t')))"))
      assert.are.equal(200, watcher(box, "/home/user/t", true).status)
      assert.are.equal(200, watcher(box, "/home/user/t", true).status)
      local res = watcher(box, "/home/user/t", true)
      assert.are.equal(429, res.status, res.body)
      assert.are.equal("resource_exhausted", res.json.code)
      assert.matches("8192 for all of a sandbox's watchers", res.json.message, 1, true)
      -- a watcher of a plain directory still fits
      assert.are.equal(200, watcher(box, "/tmp", false).status)
      kill(srv, box)
    end)
  end)

  describe("spawning", function()
    local stalled
    lazy_setup(function()
      stalled = wbd.start{ wrapper = "env WARMBOXD_TEST_SPAWN_STALL=/wbd-stall WARMBOXD_SPAWN_TIMEOUT_MS=15000 "
        .. (os.getenv("WARMBOXD_WRAPPER") or "") }
    end)
    lazy_teardown(function() if stalled then stalled:stop() end end)

    local function start_body(cmd)
      local json = assert(http.cjson.encode({ process = { cmd = cmd, args = {} } }))
      return string.pack(">I1I4", 0, #json) .. json
    end

    local function start(box, cmd)
      return http.sandbox(stalled, box, 49983, "POST", "/process.Process/Start",
        { body = start_body(cmd), headers = envd.STREAM, timeout = 60 })
    end

    -- Children of the server that are still warmboxd (forked, not exec'd):
    -- one pgrep (a shell reading every /proc/PID/stat forks a cat a process,
    -- seconds on a loaded host, past the stalled child's life).
    local function unexeced()
      local p = assert(io.popen("pgrep -x -P " .. stalled.pid .. " warmboxd"))
      local out = p:read("a")
      p:close()
      return out:match("%d+")
    end

    it("a child that never execs holds up its own request only, and is killed at the spawn timeout", function()
      local a = http.create(stalled, { templateID = "base", timeout = 600 })
      local b = http.create(stalled, { templateID = "base", timeout = 600 })
      -- b's jail is made before the stall, so its Start below is one spawn, well inside the timeout
      assert.are.equal(200, start(b, "/bin/true").status)
      local out, done = os.tmpname(), os.tmpname() .. ".rc"
      local body = os.tmpname()
      local f = assert(io.open(body, "wb"))
      f:write(start_body("/wbd-stall"))
      f:close()
      local cmd = table.concat({ "env -u LD_PRELOAD curl -sS --max-time 60 -o", wbd.sh_quote(out),
        "-H", wbd.sh_quote("E2b-Sandbox-Id: " .. a.sandboxID), "-H", wbd.sh_quote("E2b-Sandbox-Port: 49983"),
        "-H", wbd.sh_quote("Content-Type: application/connect+json"),
        a.envdAccessToken and ("-H " .. wbd.sh_quote("X-Access-Token: " .. a.envdAccessToken)) or "",
        "--data-binary", wbd.sh_quote("@" .. body), wbd.sh_quote(stalled.url .. "/process.Process/Start") }, " ")
      os.execute("( " .. cmd .. " 2>/dev/null; echo $? > " .. wbd.sh_quote(done) .. " ) &")
      local child = wbd.eventually(unexeced, 30)
      assert.is_truthy(child, "the stalled child never appeared")
      -- another sandbox starts a process meanwhile
      local res = start(b, "/bin/true")
      assert.are.equal(200, res.status, res.body)
      assert.matches('"exited":true', res.body)
      assert.is_nil(wbd.read_all(done), "the stalled request ended before the other sandbox's")
      assert.are.equal(child, unexeced())
      -- the stalled one fails cleanly, its child killed and reaped
      assert.is_truthy(wbd.eventually(function() return wbd.read_all(done) end, 60))
      local got = wbd.read_all(out) or ""
      assert.matches("timed out", got)
      assert.is_nil(unexeced())
      os.remove(out)
      os.remove(done)
      os.remove(body)
      -- and its sandbox starts processes again
      res = start(a, "/bin/true")
      assert.are.equal(200, res.status, res.body)
      assert.matches('"exited":true', res.body)
    end)
  end)

  describe("the jail's skeleton", function()
    local ROOT = { ["Connect-Protocol-Version"] = "1", Authorization = "Basic cm9vdDo=" }   -- root:

    local function fs(box, method, body)
      return http.sandbox(srv, box, 49983, "POST", "/filesystem.Filesystem/" .. method,
        { json = body, headers = ROOT })
    end

    it("is never removed, renamed or replaced through envd, even as root", function()
      local box = http.create_interp(srv)
      assert.are.equal("", py(srv, box, "open('/home/user/f', 'w').close()\n''"))
      local refused = {
        { "Remove", { path = "/bin" } }, { "Remove", { path = "/proc" } }, { "Remove", { path = "/home" } },
        { "Remove", { path = "/etc" } }, { "Remove", { path = "/var" } }, { "Remove", { path = "/var/tmp" } },
        { "Remove", { path = "/run" } }, { "Remove", { path = "/etc/ssl" } }, { "Remove", { path = "/" } },
        { "Move", { source = "/dev", destination = "/home/user/dev" } },
        { "Move", { source = "/lib64", destination = "/opt/lib64" } },
        { "Move", { source = "/home/user/f", destination = "/proc" } },
        { "Move", { source = "/etc", destination = "/etc2" } },
      }
      for _, c in ipairs(refused) do
        local res = fs(box, c[1], c[2])
        assert.are.equal(403, res.status, c[1] .. " " .. http.cjson.encode(c[2]) .. ": " .. res.body)
        assert.are.equal("permission_denied", res.json.code)
        -- /proc and /dev are not served at all; the rest names the skeleton
        if not res.json.message:find("not served", 1, true) then assert.matches("skeleton", res.json.message) end
      end
      -- nothing changed: the jail still starts processes through its /bin, /proc and /dev
      assert.are.equal("ok", py(srv, box, "import subprocess\nsubprocess.run(['/bin/sh', '-c', "
        .. "'test -d /proc/self && test -c /dev/null && test -d /var/tmp && test -d /run && test -f /home/user/f "
        .. "&& echo ok'], capture_output=True, text=True).stdout.strip()"))
      -- the rest of the sandbox's own root is root's to change
      assert.are.equal(200, fs(box, "MakeDir", { path = "/opt/a" }).status)
      assert.are.equal(200, fs(box, "Move", { source = "/opt/a", destination = "/opt/b" }).status)
      assert.are.equal(200, fs(box, "Remove", { path = "/opt/b" }).status)
      assert.are.equal(200, fs(box, "Remove", { path = "/run/x" }).status)
      kill(srv, box)
    end)
  end)

  describe("limits", function()
    local SHM = "import os\nv = os.statvfs('/dev/shm')\nstr(v.f_blocks * v.f_frsize // 1048576)"

    -- half of code-interpreter-v1's memoryMB (2048, as E2B builds the template)
    it("/dev/shm is a tmpfs of half the memory limit (root)", function()
      local box = http.create_interp(srv)
      assert.are.equal("1024", py(srv, box, SHM))
      kill(srv, box)
    end)

    describe("without root", function()
      local nr, data
      lazy_setup(function()
        -- as user nobody, with a data directory of its own
        data = os.tmpname()
        os.remove(data)
        assert(os.execute("mkdir -m 0700 " .. wbd.sh_quote(data) .. " && chown nobody " .. wbd.sh_quote(data)))
        nr = wbd.start{ wrapper = "setpriv --reuid=65534 --regid=65534 --clear-groups env WARMBOXD_PIDS_MAX=40 "
          .. (os.getenv("WARMBOXD_WRAPPER") or ""), args = { "--data-dir", data .. "/d" } }
      end)
      lazy_teardown(function()
        if nr then nr:stop() end
        if data then os.execute("rm -rf " .. wbd.sh_quote(data)) end
      end)

      it("runs as that user, /dev/shm limited as with root", function()
        local box = http.create_interp(nr)
        assert.are.equal("1024", py(nr, box, SHM))
        kill(nr, box)
      end)

      it("home and /tmp share one tmpfs of min(diskSizeMB, memoryMB), as with root; writes beyond it fail", function()
        local box = http.create_interp(nr)
        local info = http.api(nr, "GET", "/sandboxes/" .. box.sandboxID).json
        local mb = math.tointeger(math.min(info.diskSizeMB, info.memoryMB))
        local size = "import os\nv = os.statvfs('%s')\nstr(v.f_blocks * v.f_frsize // 1048576)"
        assert.are.equal(tostring(mb), py(nr, box, size:format("/home/user")))
        assert.are.equal(tostring(mb), py(nr, box, size:format("/tmp")))
        -- 100 MB more than that into home: ENOSPC before the end, and the space comes back
        assert.are.equal("28", py(nr, box, table.concat({
          "import errno, os",
          "chunk = b'x' * (1 << 20)",
          "try:",
          "    with open('/home/user/big', 'wb') as f:",
          "        for _ in range(" .. (mb + 100) .. "):",
          "            f.write(chunk)",
          "    r = 'written'",
          "except OSError as e:",
          "    r = str(e.errno)",
          "os.remove('/home/user/big')",
          "r",
        }, "\n")))
        -- warmboxd's own files stay outside: the data directory on the host is empty of them
        local p = assert(io.popen("ls -A " .. wbd.sh_quote(nr:sandbox_dir(box.sandboxID)) .. " 2>&1"))
        local listed = p:read("a")
        p:close()
        assert.are.equal("", listed)
        kill(nr, box)
      end)

      it("counts processes per sandbox (WARMBOXD_PIDS_MAX), not for all sandboxes of the user", function()
        local fork = table.concat({
          "import os, time",
          "kids = []",
          "while len(kids) < 100:",
          "    try:",
          "        pid = os.fork()",
          "    except OSError:",
          "        break",
          "    if pid == 0:",
          "        time.sleep(30)",
          "        os._exit(0)",
          "    kids.append(pid)",
          "n = len(kids)",
          "for k in kids:",
          "    os.kill(k, 9)",
          "    os.waitpid(k, 0)",
          "str(n >= 30 and n < 40)",
        }, "\n")
        local a, b = http.create_interp(nr), http.create_interp(nr)
        -- a's kernel holds its children while b forks
        local hold = "import os, time\nkids = []\nfor _ in range(30):\n    pid = os.fork()\n"
          .. "    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n    kids.append(pid)\nstr(len(kids))"
        assert.are.equal("30", py(nr, a, hold))
        assert.are.equal("True", py(nr, b, fork))
        kill(nr, a)
        kill(nr, b)
      end)

      it("gives each sandbox a share of the user's inotify instances", function()
        local probe = table.concat({
          "import ctypes",
          "libc = ctypes.CDLL(None, use_errno=True)",
          "fds = []",
          "while len(fds) < 200:",
          "    fd = libc.inotify_init1(0)",
          "    if fd < 0:",
          "        break",
          "    fds.append(fd)",
          "str(len(fds))",
        }, "\n")
        local a, b = http.create_interp(nr), http.create_interp(nr)
        -- a keeps its instances (its kernel holds them) while b asks for its own
        assert.are.equal("16", py(nr, a, probe))
        assert.are.equal("16", py(nr, b, probe))
        kill(nr, a)
        kill(nr, b)
      end)
    end)
  end)
end)
