-- warmboxd's sandboxes as processes, over real HTTP: each sandbox is a
-- directory seen as /home/user in a bubblewrap jail (no host files, a network
-- namespace of its own), pause freezes its process tree, kill and exit leave nothing
-- behind.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local nd = require "spec.helpers.ndjson"

local cjson = http.cjson
local q = wbd.sh_quote

local main_text = nd.main_text

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>/dev/null"))
  local s = p:read("a")
  p:close()
  return s
end

-- Host processes whose command line mentions `s` (bwrap's arguments name the
-- sandbox's runtime, srv:runtime_name(id), so this finds a sandbox's jails).
local function procs_mentioning(s)
  local out = {}
  for line in sh("ps -eo pid=,args="):gmatch("[^\n]+") do
    if line:find(s, 1, true) and not line:find("ps -eo", 1, true) then out[#out + 1] = line end
  end
  return out
end

local function exists(path)
  return os.execute("test -e " .. q(path)) == true
end

local function file_size(path)
  local f = io.open(path, "rb")
  if not f then return 0 end
  local n = f:seek("end")
  f:close()
  return n
end

-- A path of warmboxd's mount namespace (as root it has its own: the homes
-- are tmpfs mounts the host does not see), seen from the host.
local function in_ns(srv, path) return srv:ns_path(path) end

describe("warmboxd runtime", function()
  local srv, data

  local function create(extra) return http.create_interp(srv, extra) end

  local function py(box, code)
    local res = http.sandbox(srv, box, 49999, "POST", "/execute", { json = { code = code }, timeout = 60 })
    assert.are.equal(200, res.status, res.body)
    assert.is_truthy(res.body:find('{"type": "end_of_execution"}', 1, true), res.body)
    return main_text(res.body), res.body
  end

  local function kill(box)
    return http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID)
  end

  lazy_setup(function()
    data = os.tmpname()
    os.remove(data)
    srv = wbd.start{ args = { "--data-dir", data } }
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
    os.execute("rm -rf " .. q(data))
  end)

  describe("directories", function()
    it("makes <data-dir>/<runtime name>/home and tmp at create, seen as /home/user and /tmp", function()
      local sb = create()
      local dir = in_ns(srv, srv:sandbox_dir(sb.sandboxID))
      assert.is_true(exists(dir .. "/home"))
      assert.is_true(exists(dir .. "/tmp"))
      py(sb, "open('/home/user/h.txt', 'w').write('home')\nopen('/tmp/t.txt', 'w').write('tmp')")
      local f = assert(io.open(dir .. "/home/h.txt"))
      assert.are.equal("home", f:read("a"))
      f:close()
      assert.is_true(exists(dir .. "/tmp/t.txt"))
      kill(sb)
    end)

    it("runs code as `user` with HOME=/home/user", function()
      local sb = create()
      assert.are.equal("user /home/user /home/user",
        py(sb, "import os, pwd\n' '.join([pwd.getpwuid(os.getuid()).pw_name, os.environ['HOME'], os.getcwd()])"))
      kill(sb)
    end)
  end)

  describe("isolation", function()
    it("hides the host's files: /root, warmboxd's data directory, secrets in /etc", function()
      local sb = create()
      assert.is_true(exists("/root"))
      -- the jail's /root is the sandbox's own (E2B's root home), empty at first
      assert.are.equal("[]", py(sb, "import os\nstr(os.listdir('/root'))"))
      assert.are.equal("False", py(sb, "str(os.path.exists(" .. string.format("%q", data) .. "))"))
      assert.are.equal("False", py(sb, "str(os.path.exists('/etc/shadow'))"))
      assert.are.equal("False", py(sb, "str(os.path.exists('/etc/ssl/private'))"))
      assert.are.equal("True", py(sb, "str(os.path.exists('/etc/ssl/certs'))"))
      assert.are.equal("False", py(sb, "str(os.path.exists('/work'))"))
      kill(sb)
    end)

    it("keeps sandboxes apart", function()
      local a, b = create(), create()
      py(a, "open('/home/user/only-a', 'w').write('a')\nopen('/tmp/only-a', 'w').write('a')")
      assert.are.equal("False False",
        py(b, "import os\nf'{os.path.exists(\"/home/user/only-a\")} {os.path.exists(\"/tmp/only-a\")}'"))
      kill(a)
      kill(b)
    end)

    it("has read-only system directories", function()
      local sb = create()
      local text = py(sb, table.concat({
        "try:",
        "    open('/usr/warmbox-probe', 'w')",
        "    r = 'writable'",
        "except OSError as e:",
        "    r = type(e).__name__",
        "r",
      }, "\n"))
      assert.is_not.equal("writable", text)
      kill(sb)
    end)

    local connect_code = function(port)
      return table.concat({
        "import socket",
        "try:",
        "    socket.create_connection(('127.0.0.1', " .. port .. "), timeout=5).close()",
        "    r = 'connected'",
        "except OSError as e:",
        "    r = type(e).__name__",
        "r",
      }, "\n")
    end

    it("has no network without allow_internet_access", function()
      local sb = create{ allow_internet_access = false }
      assert.are_not.equal("connected", py(sb, connect_code(srv.port)))
      kill(sb)
    end)

    it("does not reach warmboxd with allow_internet_access either (more in warmboxd/containment.lua)", function()
      local sb = create{ allow_internet_access = true }
      assert.are_not.equal("connected", py(sb, connect_code(srv.port)))
      kill(sb)
    end)
  end)

  describe("pause", function()
    it("stops the whole process tree and resume continues it", function()
      local sb = create()
      py(sb, "import subprocess\nsubprocess.Popen(['bash', '-c', 'while true; do echo x >> /home/user/tick; "
        .. "sleep 0.05; done'])\nNone")
      local tick = in_ns(srv, srv:sandbox_dir(sb.sandboxID) .. "/home/tick")
      for _ = 1, 200 do
        if file_size(tick) > 0 then break end
        wbd.sleep(0.05)
      end
      assert.is_true(file_size(tick) > 0)
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {}).status)
      local frozen = file_size(tick)
      wbd.sleep(0.5)
      assert.are.equal(frozen, file_size(tick))
      -- the processes are still there, only stopped
      assert.is_true(#procs_mentioning(srv:runtime_name(sb.sandboxID)) > 0)
      assert.are.equal(201, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 60 }).status)
      for _ = 1, 200 do
        if file_size(tick) > frozen then break end
        wbd.sleep(0.05)
      end
      assert.is_true(file_size(tick) > frozen)
      kill(sb)
    end)

    it("without memory ends the processes and keeps the files, on disk only (the runtime is given up)", function()
      local sb = create()
      py(sb, "import subprocess\nsubprocess.Popen(['sleep', '600'])\nopen('/home/user/f', 'w').write('kept')")
      local dir = in_ns(srv, srv:sandbox_dir(sb.sandboxID))
      assert.is_true(#procs_mentioning(srv:runtime_name(sb.sandboxID)) > 0)
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", { memory = false }).status)
      assert.are.same({}, procs_mentioning(srv:runtime_name(sb.sandboxID)))
      assert.is_false(exists(dir))
      assert.is_true(exists(data .. "/.state/paused/" .. sb.sandboxID .. "/files/home/f"))
      assert.are.equal(201, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 60 }).status)
      assert.are.equal("kept", py(sb, "open('/home/user/f').read()"))
      kill(sb)
    end)
  end)

  describe("kill", function()
    it("ends every process and removes the directory", function()
      local sb = create()
      py(sb, "import subprocess\nsubprocess.Popen(['sleep', '600'])\nNone")
      local res = http.sandbox(srv, sb, 49999, "POST", "/execute", { json = { code = "B=1", language = "bash" } })
      assert.are.equal(200, res.status)
      local dir = srv:sandbox_dir(sb.sandboxID)
      assert.is_true(#procs_mentioning(srv:runtime_name(sb.sandboxID)) >= 2)
      assert.are.equal(204, kill(sb).status)
      assert.are.same({}, procs_mentioning(srv:runtime_name(sb.sandboxID)))
      assert.is_false(exists(dir))
      assert.is_false(exists(in_ns(srv, dir)))
    end)

    it("ends a run in flight", function()
      local sb = create()
      py(sb, "1")
      local tmp = os.tmpname()
      os.execute(string.format("(curl -sS -N --max-time 60 -X POST -H %s -H %s -H %s --data-binary %s %s > %s 2>&1;"
        .. " echo done >> %s) &", q("E2b-Sandbox-Id: " .. sb.sandboxID), q("E2b-Sandbox-Port: 49999"),
        q("X-Access-Token: " .. sb.envdAccessToken), q(cjson.encode({ code = "import time\ntime.sleep(600)" })),
        q(srv.url .. "/execute"), q(tmp), q(tmp)))
      wbd.sleep(0.5)
      assert.are.equal(204, kill(sb).status)
      local out = ""
      for _ = 1, 200 do
        local f = io.open(tmp)
        out = f and f:read("a") or ""
        if f then f:close() end
        if out:find("done", 1, true) then break end
        wbd.sleep(0.05)
      end
      os.remove(tmp)
      assert.is_truthy(out:find("done", 1, true))
      assert.are.same({}, procs_mentioning(srv:runtime_name(sb.sandboxID)))
    end)
  end)

  describe("kill, without the tmpfs home (--unisolated)", function()
    it("removes a tree deeper than PATH_MAX, unreadable directories included", function()
      local s3 = wbd.start{ args = { "--unisolated" } }
      local ok, err = pcall(function()
        local sb = http.api(s3, "POST", "/sandboxes", { templateID = "base" }).json
        local res = http.sandbox(s3, sb, 49999, "POST", "/execute", { timeout = 120, json = { code = table.concat({
          "import os",
          "os.chdir(os.environ['HOME'])",
          "for i in range(2500):",
          "    os.mkdir('dd')",
          "    os.chdir('dd')",
          "open('leaf', 'w').write('x')",
          "os.chmod('.', 0)",
          "len(os.getcwd())" }, "\n") } })
        assert.are.equal(200, res.status)
        assert.is_true(tonumber(main_text(res.body)) > 4096, res.body)
        local dir = s3:sandbox_dir(sb.sandboxID)
        assert.is_true(exists(dir .. "/home/dd/dd"))
        assert.are.equal(204, http.api(s3, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
        assert.is_false(exists(dir))
      end)
      s3:stop()
      assert(ok, err)
    end)
  end)

  describe("exit", function()
    it("leaves no processes behind, and in its data directory only the paused sandbox's state", function()
      local dir = os.tmpname()
      os.remove(dir)
      local s2 = wbd.start{ args = { "--data-dir", dir } }
      local res = http.api(s2, "POST", "/sandboxes", { templateID = "code-interpreter-v1", timeout = 600 })
      assert.are.equal(201, res.status)
      local sb = res.json
      res = http.sandbox(s2, sb, 49999, "POST", "/execute",
        { json = { code = "import subprocess\nsubprocess.Popen(['sleep', '600'])\n1" } })
      assert.are.equal(200, res.status)
      http.sandbox(s2, sb, 49999, "POST", "/execute", { json = { code = "true", language = "bash" } })
      local paused = http.api(s2, "POST", "/sandboxes", { templateID = "code-interpreter-v1", timeout = 600 }).json
      http.sandbox(s2, paused, 49999, "POST", "/execute", { json = { code = "1" } })
      assert.are.equal(204, http.api(s2, "POST", "/sandboxes/" .. paused.sandboxID .. "/pause", {}).status)
      local ids = { s2:runtime_name(sb.sandboxID), s2:runtime_name(paused.sandboxID) }
      assert.is_true(#procs_mentioning(ids[1]) + #procs_mentioning(ids[2]) >= 3)
      s2:stop()
      for _, id in ipairs(ids) do assert.are.same({}, procs_mentioning(id)) end
      -- the paused one comes back after a restart (warmboxd_restart_spec); the running one is gone
      assert.are.equal(".state\n", sh("ls -A " .. q(dir)))
      -- (events: the lifecycle events E2B keeps, kept across a restart too)
      assert.are.equal("events\nlock\npaused\nsnapshots\n", sh("ls -A " .. q(dir .. "/.state")))
      assert.are.equal(paused.sandboxID .. "\n", sh("ls -A " .. q(dir .. "/.state/paused")))
      os.execute("rm -rf " .. q(dir))
    end)
  end)

  describe("without the cgroup freezer", function()
    it("pauses with SIGSTOP, resumes, and kills the whole tree", function()
      local dir = os.tmpname()
      os.remove(dir)
      local s4 = wbd.start{ args = { "--data-dir", dir }, wrapper = "env WARMBOXD_NO_FREEZER=1" }
      local ok, err = pcall(function()
        local sb = http.api(s4, "POST", "/sandboxes", { templateID = "code-interpreter-v1", timeout = 600 }).json
        local res = http.sandbox(s4, sb, 49999, "POST", "/execute", { json = { code = table.concat({
          "import subprocess",
          "subprocess.Popen(['bash', '-c', 'while true; do echo x >> /home/user/tick; sleep 0.05; done'])",
          "state = 'kept'" }, "\n") } })
        assert.are.equal(200, res.status)
        local tick = in_ns(s4, s4:sandbox_dir(sb.sandboxID) .. "/home/tick")
        for _ = 1, 200 do
          if file_size(tick) > 0 then break end
          wbd.sleep(0.05)
        end
        assert.are.equal(204, http.api(s4, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {}).status)
        local frozen = file_size(tick)
        wbd.sleep(0.5)
        assert.are.equal(frozen, file_size(tick))
        res = http.api(s4, "POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 60 })
        assert.are.equal(201, res.status)
        res = http.sandbox(s4, sb, 49999, "POST", "/execute", { json = { code = "state" } })
        assert.are.equal("kept", main_text(res.body))
        for _ = 1, 200 do
          if file_size(tick) > frozen then break end
          wbd.sleep(0.05)
        end
        assert.is_true(file_size(tick) > frozen)
        assert.are.equal(204, http.api(s4, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
        assert.are.same({}, procs_mentioning(s4:runtime_name(sb.sandboxID)))
      end)
      s4:stop()
      os.execute("rm -rf " .. q(dir))
      assert(ok, err)
    end)
  end)

  describe("--unisolated", function()
    it("warns loudly, runs sandboxes as plain processes, and still ends them all", function()
      -- without the freezer too: the hardest case for finding every process
      local s3 = wbd.start{ args = { "--unisolated" }, wrapper = "env WARMBOXD_NO_FREEZER=1" }
      local marker = "sleep " .. tostring(600 + math.random(1, 399)) .. ".5"
      local ok, err = pcall(function()
        assert.is_truthy(s3:log():find("WARNING", 1, true))
        local res = http.api(s3, "POST", "/sandboxes", { templateID = "code-interpreter-v1", timeout = 600 })
        assert.are.equal(201, res.status)
        local sb = res.json
        res = http.sandbox(s3, sb, 49999, "POST", "/execute",
          { json = { code = "import os\nx = 2\nos.environ['HOME'].endswith('/home')" } })
        assert.are.equal("True", main_text(res.body), res.body)
        -- a process that leaves its parent: setsid and a double fork
        res = http.sandbox(s3, sb, 49999, "POST", "/execute", { json = { code = table.concat({
          "import subprocess",
          "subprocess.run(['bash', '-c', '(setsid " .. marker .. " >/dev/null 2>&1 &)'])",
          "x * 21" }, "\n") } })
        assert.are.equal("42", main_text(res.body))
        for _ = 1, 100 do
          if #procs_mentioning(marker) > 0 then break end
          wbd.sleep(0.05)
        end
        assert.are.equal(1, #procs_mentioning(marker))
        assert.are.equal(204, http.api(s3, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
        assert.are.same({}, procs_mentioning(marker))
      end)
      s3:stop()
      assert(ok, err)
    end)
  end)
end)
