-- warmboxd's envd process RPCs over real HTTP: Connect (reattach
-- to a running process by pid or tag), pty processes (Start's `pty`, pty
-- input, Update's resize), SendInput / StreamInput, the per-sandbox bound,
-- and the containment a pty process keeps.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local envd = require "spec.helpers.envd"
local cjson = http.cjson

local RPC = { ["Connect-Protocol-Version"] = "1" }
local STREAM = envd.STREAM
local b64decode, b64encode, envelope, envelopes = envd.b64decode, envd.b64encode, envd.envelope, envd.envelopes

-- A stream body, decoded: { start, end_, trailer, stdout, stderr, pty, events }.
local function decode(body)
  local r = { stdout = "", stderr = "", pty = "", events = {} }
  for _, e in ipairs(envelopes(body or "")) do
    if e.flag == 2 then
      r.trailer = e.msg
    else
      local ev = e.msg.event or {}
      r.events[#r.events + 1] = ev
      if ev.start then r.start = ev.start end
      if ev["end"] then r.end_ = ev["end"] end
      if ev.data then
        for _, k in ipairs({ "stdout", "stderr", "pty" }) do
          if ev.data[k] then r[k] = r[k] .. b64decode(ev.data[k]) end
        end
      end
    end
  end
  return r
end

local function read_file(path) return wbd.read_all(path) or "" end

describe("warmboxd envd processes", function()
  local srv, sb
  local files = {}

  local function rpc(method, body, s)
    return http.sandbox(srv, s or sb, 49983, "POST", "/process.Process/" .. method, { json = body, headers = RPC })
  end

  -- A streaming call that returns when the stream ends.
  local function stream(method, msg, headers, s)
    local h = {}
    for k, v in pairs(STREAM) do h[k] = v end
    for k, v in pairs(headers or {}) do h[k] = v end
    local res = http.sandbox(srv, s or sb, 49983, "POST", "/process.Process/" .. method,
      { body = type(msg) == "string" and msg or envelope(0, msg), headers = h })
    local r = decode(res.body)
    r.status = res.status
    return r
  end

  -- A streaming call in the background (curl writing to a file); returns a
  -- function giving what has arrived so far, decoded.
  local function background(method, msg, s, headers, curl_extra)
    s = s or sb
    local out = os.tmpname()
    local req = out .. ".req"
    files[#files + 1] = out
    files[#files + 1] = req
    local f = assert(io.open(req, "wb"))
    f:write(envelope(0, msg))
    f:close()
    local q = wbd.sh_quote
    local cmd = { "curl -sS -N --max-time 60", curl_extra or "", "-o", q(out),
      "-H", q("E2b-Sandbox-Id: " .. s.sandboxID),
      "-H", q("E2b-Sandbox-Port: 49983"), "-H", q("Content-Type: application/connect+json") }
    if s.envdAccessToken then
      cmd[#cmd + 1] = "-H"
      cmd[#cmd + 1] = q("X-Access-Token: " .. s.envdAccessToken)
    end
    for k, v in pairs(headers or {}) do
      cmd[#cmd + 1] = "-H"
      cmd[#cmd + 1] = q(k .. ": " .. v)
    end
    cmd[#cmd + 1] = "--data-binary"
    cmd[#cmd + 1] = q("@" .. req)
    cmd[#cmd + 1] = q(srv.url .. "/process.Process/" .. method)
    cmd[#cmd + 1] = ">/dev/null 2>&1 &"
    os.execute(table.concat(cmd, " "))
    return function() return decode(read_file(out)) end
  end

  local function wait_for(fn, seconds)
    local deadline = os.time() + (seconds or 15)
    repeat
      local v = fn()
      if v then return v end
      wbd.sleep(0.05)
    until os.time() > deadline
    return fn()
  end

  local function pty_start(cmd, cols, rows, extra)
    local msg = { process = { cmd = "/bin/bash", args = { "-c", cmd }, envs = { TERM = "xterm-256color" } },
      pty = { size = { cols = cols or 80, rows = rows or 24 } } }
    for k, v in pairs(extra or {}) do msg[k] = v end
    return background("Start", msg)
  end

  local function started(poll)
    return assert(wait_for(function() return poll().start end), "no start event").pid
  end

  local function send_pty(pid, text)
    return rpc("SendInput", { process = { pid = pid }, input = { pty = b64encode(text) } })
  end

  lazy_setup(function()
    srv = wbd.start{}
    sb = http.create(srv, { templateID = "base", secure = true, timeout = 600 })
  end)

  lazy_teardown(function()
    for _, f in ipairs(files) do os.remove(f) end
    if srv then srv:stop() end
  end)

  describe("the tenant's environment", function()
    -- bubblewrap is not setuid, so ld.so would honour LD_PRELOAD & co. for
    -- bwrap itself, before any namespace or seccomp filter exists.
    it("refuses loader variables in a create's envVars (400) and in Start's envs (invalid_argument)", function()
      for _, name in ipairs({ "LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "GCONV_PATH", "GLIBC_TUNABLES" }) do
        local res = http.api(srv, "POST", "/sandboxes",
          { templateID = "base", envVars = { [name] = "/home/user/x.so" } })
        assert.are.equal(400, res.status, name)
        assert.matches("loader variable", res.json.message, 1, true)
        local r = stream("Start", { process = { cmd = "/bin/true", envs = { [name] = "/home/user/x.so" } } })
        assert.are.equal("invalid_argument", r.trailer and r.trailer.error and r.trailer.error.code, name)
        assert.is_nil(r.start, name)
      end
    end)

    it("reaches the jailed command, never bubblewrap's own environment", function()
      local box = http.create(srv, { templateID = "base", secure = true, timeout = 600,
        envVars = { WB_SBVAR = "from-create" } })
      local poll = background("Start", { process = { cmd = "/bin/sh",
        args = { "-c", "echo \"$WB_SBVAR $WB_PROBE\"; sleep 5" }, envs = { WB_PROBE = "from-start" } } }, box)
      assert(wait_for(function() return poll().stdout:find("from-create from-start", 1, true) end),
        "the command got its environment: " .. poll().stdout)
      -- The host's bwrap process of that command (its script names $WB_PROBE):
      -- its environ is the fixed one, and no value is on its command line,
      -- which every host user can read.
      local environ, cmdline
      local name = srv:runtime_name(box.sandboxID)
      local ls = io.popen("ls /proc")
      for pid in ls:read("a"):gmatch("%d+") do
        local c = wbd.read_all("/proc/" .. pid .. "/cmdline") or ""
        if c:find("^/usr/bin/bwrap%z") and c:find(name, 1, true) and c:find("$WB_PROBE", 1, true) then
          environ, cmdline = wbd.read_all("/proc/" .. pid .. "/environ"), c
          break
        end
      end
      ls:close()
      assert.is_string(environ, "found the bwrap process")
      assert.is_nil(cmdline:find("from-start", 1, true), cmdline)
      assert.is_nil(cmdline:find("from-create", 1, true), cmdline)
      assert.is_nil(environ:find("WB_", 1, true), environ)
      assert.is_nil(environ:find("E2B_", 1, true), environ)
      assert.matches("^PATH=[^%z]*%z$", environ)
      assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID).status)
    end)
  end)

  describe("a Start racing a pause", function()
    -- A Start that passed the router's RUNNING check while a pause froze the
    -- sandbox used to spawn into the frozen group and hang the one spawner:
    -- then every sandbox's Start, resume and kill waited forever.
    it("never hangs the server: the pause, the resume and other sandboxes go on", function()
      for round = 1, 5 do
        local box = http.create(srv, { templateID = "base", secure = true, timeout = 600 })
        for _ = 1, 4 do background("Start", { process = { cmd = "/bin/true" } }, box) end
        assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. box.sandboxID .. "/pause", {}).status)
        local res = http.api(srv, "POST", "/sandboxes/" .. box.sandboxID .. "/connect", { timeout = 60 })
        assert.are.equal(201, res.status, "round " .. round .. ": " .. tostring(res.body))
        -- (A racing Start either ran before the pause, was refused, or had its
        -- stream dropped by the pause, as E2B drops streams at a pause.)
        local r = stream("Start", { process = { cmd = "/bin/echo", args = { "after" } } }, nil, box)
        assert.are.equal("after\n", r.stdout, "round " .. round)
        local other = http.create(srv, { templateID = "base", timeout = 60 }, nil)
        assert.is_string(other.sandboxID)
        http.api(srv, "DELETE", "/sandboxes/" .. other.sandboxID)
        http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID)
      end
    end)
  end)

  describe("Connect", function()
    it("holds 100 streams waiting for output on a few threads, and ends each with the process", function()
      local pid = started(background("Start", { process = { cmd = "/bin/sleep", args = { "60" } } }))
      local conns = {}
      for i = 1, 100 do conns[i] = background("Connect", { process = { pid = pid } }) end
      for i = 1, 100 do assert.are.equal(pid, started(conns[i])) end
      -- every stream is attached and waits: a thread each would be 100 and more
      local threads = tonumber(read_file("/proc/" .. srv.pid .. "/status"):match("Threads:%s*(%d+)"))
      assert.is_true(threads < 64, threads .. " threads")
      rpc("SendSignal", { process = { pid = pid }, signal = "SIGNAL_SIGKILL" })
      for i = 1, 100 do
        local c = wait_for(function()
          local d = conns[i]()
          return d.trailer and d
        end)
        assert.is_table(c, "Connect stream " .. i .. " did not end")
        assert.is_table(c.end_)
      end
    end)

    it("reattaches by pid: the start event, then the further output and the end", function()
      local poll = background("Start", { process = { cmd = "/bin/bash",
        args = { "-c", "mkfifo -m 600 /home/user/go.fifo; echo first; read -t 20 x < /home/user/go.fifo;"
          .. " echo later; exit 7" } } })
      local pid = started(poll)
      -- the Start stream has seen "first"; the process waits on a FIFO
      assert.is_truthy(wait_for(function() return poll().stdout == "first\n" end))
      local conn = background("Connect", { process = { pid = pid } })
      assert.are.equal(pid, started(conn))
      local r = stream("Start", { process = { cmd = "/bin/bash", args = { "-c", "echo go > /home/user/go.fifo" } } })
      assert.are.equal("exit status 0", r.end_ and r.end_.status, r.trailer and cjson.encode(r.trailer))
      local c = wait_for(function()
        local d = conn()
        return d.trailer and d
      end)
      assert.is_table(c, "the Connect stream did not end")
      assert.are.equal("later\n", c.stdout)   -- only what came after it attached
      assert.are.equal(7, c.end_.exitCode)
      assert.are.equal("exit status 7", c.end_.status)
      assert.are.same({}, c.trailer)
      -- the Start stream got the same end
      local s = wait_for(function()
        local d = poll()
        return d.trailer and d
      end)
      assert.are.equal("first\nlater\n", s.stdout)
      assert.are.equal(7, s.end_.exitCode)
    end)

    it("reattaches by tag, and two streams get the same output", function()
      -- The process prints once both streams are attached (their start event
      -- came), when it reads a line: a Connect sees output from then on.
      local poll = background("Start", { tag = "ticker", stdin = true, process = { cmd = "/bin/bash",
        args = { "-c", "read go; for i in 1 2 3; do echo tick$i; sleep 0.2; done" } } })
      local pid = started(poll)
      local a = background("Connect", { process = { tag = "ticker" } })
      local b = background("Connect", { process = { tag = "ticker" } })
      assert.are.equal(pid, started(a))
      assert.are.equal(pid, started(b))
      assert.are.equal(200, rpc("SendInput", { process = { pid = pid }, input = { stdin = b64encode("go\n") } }).status)
      local da = wait_for(function() local d = a() return d.trailer and d end)
      local db = wait_for(function() local d = b() return d.trailer and d end)
      assert.are.equal("tick1\ntick2\ntick3\n", da.stdout)
      assert.are.equal(da.stdout, db.stdout)
      assert.are.same({ exited = true, status = "exit status 0" }, da.end_)
    end)

    it("answers a process that ended a moment ago with its start and end", function()
      local r = stream("Start", { tag = "short", process = { cmd = "/bin/bash", args = { "-c", "exit 5" } } })
      assert.are.equal(5, r.end_.exitCode)
      local c = stream("Connect", { process = { pid = r.start.pid } })
      assert.are.equal(200, c.status)
      assert.are.equal(r.start.pid, c.start.pid)
      assert.are.same(r.end_, c.end_)
      assert.are.same({}, c.trailer)
      c = stream("Connect", { process = { tag = "short" } })
      assert.are.equal(5, c.end_.exitCode)
      -- but it is not listed as running, nor can it be signalled
      local l = rpc("List", {})
      for _, p in ipairs(l.json.processes or {}) do assert.are_not.equal(r.start.pid, p.pid) end
      assert.are.equal(404, rpc("SendSignal", { process = { pid = r.start.pid }, signal = "SIGNAL_SIGKILL" }).status)
    end)

    it("is not_found for an unknown pid or tag, in the trailer", function()
      local c = stream("Connect", { process = { pid = 999999 } })
      assert.are.equal(200, c.status)
      assert.is_nil(c.start)
      assert.are.equal("not_found", c.trailer.error.code)
      assert.matches("999999", c.trailer.error.message)
      c = stream("Connect", { process = { tag = "nope" } })
      assert.are.equal("not_found", c.trailer.error.code)
    end)

    it("does not reach another sandbox's process", function()
      local res = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 })
      assert.are.equal(201, res.status, res.body)
      local other = res.json
      local poll = background("Start", { tag = "theirs", process = { cmd = "/bin/sleep", args = { "5" } } }, other)
      local pid = started(poll)
      assert.are.equal("not_found", stream("Connect", { process = { pid = pid } }).trailer.error.code)
      assert.are.equal("not_found", stream("Connect", { process = { tag = "theirs" } }).trailer.error.code)
      assert.are.equal(404, rpc("SendInput", { process = { pid = pid }, input = { stdin = "eA==" } }).status)
      http.api(srv, "DELETE", "/sandboxes/" .. other.sandboxID)
    end)

    it("ends with deadline_exceeded after its own Connect-Timeout-Ms; the process goes on", function()
      local poll = background("Start", { tag = "long", process = { cmd = "/bin/bash",
        args = { "-c", "sleep 2; echo still" } } })
      local pid = started(poll)
      local c = stream("Connect", { process = { pid = pid } }, { ["Connect-Timeout-Ms"] = "300" })
      assert.are.equal(pid, c.start.pid)
      assert.are.equal("deadline_exceeded", c.trailer.error.code)
      local s = wait_for(function() local d = poll() return d.trailer and d end)
      assert.are.equal("still\n", s.stdout)
      assert.are.equal("exit status 0", s.end_.status)
    end)

    it("refuses a non-streaming content type with 415", function()
      local res = rpc("Connect", { process = { pid = 1 } })
      assert.are.equal(415, res.status)
    end)
  end)

  describe("pty", function()
    it("runs the process on a terminal of the requested size, its output as pty data", function()
      local poll = pty_start("tty -s && echo is-a-tty; stty size; read -r line; echo got:$line", 91, 33)
      local pid = started(poll)
      assert.is_truthy(wait_for(function() return poll().pty:find("33 91", 1, true) end))
      local res = send_pty(pid, "hello\n")
      assert.are.equal(200, res.status, res.body)
      local d = wait_for(function() local x = poll() return x.trailer and x end)
      assert.matches("is%-a%-tty", d.pty)
      assert.matches("got:hello", d.pty)
      assert.are.equal("", d.stdout)
      assert.are.equal("", d.stderr)
      assert.are.same({ exited = true, status = "exit status 0" }, d.end_)
    end)

    it("is the controlling terminal: Update resizes it and the process gets SIGWINCH", function()
      local poll = pty_start("trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.1; done")
      local pid = started(poll)
      assert.is_truthy(wait_for(function() return poll().pty:find("ready", 1, true) end))
      local res = rpc("Update", { process = { pid = pid }, pty = { size = { cols = 100, rows = 30 } } })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("{}", res.body)
      local d = wait_for(function() local x = poll() return x.trailer and x end)
      assert.matches("30 100", d.pty)
      assert.are.equal("exit status 0", d.end_.status)
    end)

    it("runs an interactive login bash that exits on `exit`", function()
      local poll = background("Start", { process = { cmd = "/bin/bash", args = { "-i", "-l" },
        envs = { TERM = "xterm-256color", ABC = "1" .. "23" } }, pty = { size = { cols = 80, rows = 24 } } })
      local pid = started(poll)
      assert.are.equal(200, send_pty(pid, "echo value=$ABC\nexit\n").status)
      local d = wait_for(function() local x = poll() return x.trailer and x end)
      assert.matches("value=123", d.pty)
      assert.are.equal("exit status 0", d.end_.status)
    end)

    it("delivers ^C to the foreground program", function()
      local poll = pty_start("echo ready; sleep 30; echo not-interrupted")
      local pid = started(poll)
      assert.is_truthy(wait_for(function() return poll().pty:find("ready", 1, true) end))
      assert.are.equal(200, send_pty(pid, "\3").status)
      local d = wait_for(function() local x = poll() return x.trailer and x end, 10)
      assert.is_table(d.end_)
      assert.are_not.equal("exit status 0", d.end_.status)
      assert.is_nil(d.pty:find("not-interrupted", 1, true))
    end)

    it("reconnects: output after a Connect goes to the new stream", function()
      local poll = pty_start("read -r a; echo one:$a; read -r b; echo two:$b")
      local pid = started(poll)
      send_pty(pid, "x\n")
      assert.is_truthy(wait_for(function() return poll().pty:find("one:x", 1, true) end))
      local conn = background("Connect", { process = { pid = pid } })
      started(conn)
      send_pty(pid, "y\n")
      local d = wait_for(function() local x = conn() return x.trailer and x end)
      assert.matches("two:y", d.pty)
      assert.is_nil(d.pty:find("one:x", 1, true))
      assert.are.equal("exit status 0", d.end_.status)
    end)

    it("keeps stdin and pty input apart, as envd does", function()
      local poll = pty_start("sleep 20")
      local pid = started(poll)
      local res = rpc("SendInput", { process = { pid = pid }, input = { stdin = b64encode("x") } })
      assert.are.equal(500, res.status)
      assert.are.equal("internal", res.json.code)
      res = rpc("CloseStdin", { process = { pid = pid } })
      assert.are_not.equal(200, res.status)
      assert.matches("Ctrl%+D", res.json.message)
      rpc("SendSignal", { process = { pid = pid }, signal = "SIGNAL_SIGKILL" })
      local d = wait_for(function() local x = poll() return x.trailer and x end)
      assert.are.equal("signal: killed", d.end_.status)
      -- and the other way round
      local p2 = background("Start", { stdin = true, process = { cmd = "/bin/cat" } })
      local pid2 = started(p2)
      res = rpc("SendInput", { process = { pid = pid2 }, input = { pty = b64encode("x") } })
      assert.are.equal("internal", res.json.code)
      res = rpc("Update", { process = { pid = pid2 }, pty = { size = { cols = 10, rows = 10 } } })
      assert.are.equal("internal", res.json.code)
      assert.are.equal(200, rpc("Update", { process = { pid = pid2 } }).status)   -- nothing to change
      assert.are.equal(200, rpc("CloseStdin", { process = { pid = pid2 } }).status)
      assert.are.equal("exit status 0", wait_for(function() return p2().end_ end).status)
      assert.are.equal(404, rpc("Update", { process = { pid = 999999 }, pty = { size = { cols = 1, rows = 1 } } })
        .status)
    end)

    it("keeps the jail's protections: netns, groups, seccomp, uid, no other descriptors", function()
      local probe = "echo uid=$(id -u); echo net=$(readlink /proc/self/ns/net);"
        .. " echo cg=$(cat /proc/self/cgroup | sort | tr '\\n' ' ');"
        .. " echo sc=$(awk '/^Seccomp:/{print $2}' /proc/self/status);"
        .. " echo fds=$(ls /proc/self/fd | tr '\\n' ' ')"
      local poll = pty_start(probe)
      local pid = started(poll)
      local d = wait_for(function() local x = poll() return x.trailer and x end)
      local plain = stream("Start", { process = { cmd = "/bin/bash", args = { "-c", probe } } })
      local function field(s, k) return s:match(k .. "=([^\r\n]*)") end
      assert.are.equal("1000", field(d.pty, "uid"))
      assert.are.equal(field(plain.stdout, "net"), field(d.pty, "net"))   -- the sandbox's own netns
      local host_net = io.popen("readlink /proc/self/ns/net"):read("l")
      assert.are_not.equal(host_net, field(d.pty, "net"))
      assert.are.equal(field(plain.stdout, "cg"), field(d.pty, "cg"))     -- the sandbox's groups
      assert.are.equal("2", field(d.pty, "sc"))                           -- a seccomp filter
      assert.are.equal("0 1 2 3", field(d.pty, "fds"):gsub("%s+$", ""))   -- 3: ls's own directory
      -- its host uid is the sandbox's, as for any of its processes
      local function host_uid(p)
        return read_file(string.format("/proc/%d/status", p)):match("\nUid:%s+(%d+)")
      end
      local p2 = background("Start", { process = { cmd = "/bin/sleep", args = { "3" } } })
      local pid2 = started(p2)
      local p3 = pty_start("sleep 3")
      local pid3 = started(p3)
      assert.is_string(host_uid(pid3))
      assert.are.equal(host_uid(pid2), host_uid(pid3))
      assert.are_not.equal(pid, pid3)
    end)
  end)

  describe("SendInput and StreamInput", function()
    it("StreamInput applies start, data and keepalive envelopes in order", function()
      local poll = background("Start", { stdin = true, tag = "cat-si", process = { cmd = "/bin/cat" } })
      local pid = started(poll)
      local body = envelope(0, { start = { process = { pid = pid } } })
        .. envelope(0, { data = { input = { stdin = b64encode("one ") } } })
        .. envelope(0, { keepalive = {} })
        .. envelope(0, { data = { input = { stdin = b64encode("two\n") } } })
      local r = stream("StreamInput", body)
      assert.are.equal(200, r.status)
      assert.are.equal(1, #r.events)
      assert.are.same({}, r.trailer)
      -- a second stream selecting by tag
      r = stream("StreamInput", envelope(0, { start = { process = { tag = "cat-si" } } })
        .. envelope(0, { data = { input = { stdin = b64encode("three\n") } } }))
      assert.are.same({}, r.trailer)
      assert.are.equal(200, rpc("CloseStdin", { process = { pid = pid } }).status)
      local d = wait_for(function() local x = poll() return x.trailer and x end)
      assert.are.equal("one two\nthree\n", d.stdout)
    end)

    it("StreamInput reports a bad stream in its trailer", function()
      local r = stream("StreamInput", envelope(0, { data = { input = { stdin = "eA==" } } }))
      assert.are.equal("failed_precondition", r.trailer.error.code)
      r = stream("StreamInput", envelope(0, { start = { process = { pid = 999999 } } }))
      assert.are.equal("not_found", r.trailer.error.code)
      r = stream("StreamInput", envelope(0, { start = { process = { pid = 1 } } }):sub(1, 9))
      assert.are.equal("invalid_argument", r.trailer.error.code)
      r = stream("StreamInput", string.pack(">I1I4", 0, 3) .. "[1]")
      assert.are.equal("invalid_argument", r.trailer.error.code)
      r = stream("StreamInput", envelope(0, { bogus = {} }))
      assert.are.equal("unimplemented", r.trailer.error.code)
      assert.are.equal(415, rpc("StreamInput", {}).status)
    end)

    it("SendInput of nothing is fine; to a process without stdin it fails", function()
      local poll = background("Start", { stdin = true, process = { cmd = "/bin/cat" } })
      local pid = started(poll)
      assert.are.equal(200, rpc("SendInput", { process = { pid = pid }, input = { stdin = "" } }).status)
      rpc("SendSignal", { process = { pid = pid }, signal = "SIGNAL_SIGKILL" })
      local p2 = background("Start", { stdin = false, process = { cmd = "/bin/sleep", args = { "3" } } })
      local pid2 = started(p2)
      local res = rpc("SendInput", { process = { pid = pid2 }, input = { stdin = "eA==" } })
      assert.are.equal("internal", res.json.code)
      assert.matches("stdin not enabled", res.json.message)
      res = rpc("SendInput", { process = { pid = pid2 }, input = {} })
      assert.are.equal("unimplemented", res.json.code)
    end)
  end)

  describe("bounds and lifetime", function()
    -- The bounds read warmboxd's live heap, not its RSS (see Server:heap_kb).

    it("a process printing forever to slow readers keeps warmboxd's memory bounded", function()
      local before = srv:heap_kb()
      local poll = background("Start", { tag = "flood", process = { cmd = "/bin/bash",
        args = { "-c", "while :; do printf 'y%.0s' {1..4000}; echo; done" } } }, nil, nil, "--limit-rate 20k")
      local pid = started(poll)
      local conn = background("Connect", { process = { pid = pid } }, nil, nil, "--limit-rate 20k")
      local peak = before
      for _ = 1, 25 do
        wbd.sleep(0.2)
        local r = srv:heap_kb()
        if r > peak then peak = r end
      end
      assert.is_truthy(conn().stdout:find("yyyy", 1, true))
      assert.are.equal(200, rpc("SendSignal", { process = { pid = pid }, signal = "SIGNAL_SIGKILL" }).status)
      assert.is_true(peak - before < 48 * 1024, string.format("the heap grew by %d kB", peak - before))
    end)

    it("drops the output of a process no stream is attached to, without stopping it", function()
      -- 64 MB of output after its client left: the process is neither blocked
      -- nor is its output kept
      local before = srv:heap_kb()
      http.sandbox(srv, sb, 49983, "POST", "/process.Process/Start", {
        body = envelope(0, { process = { cmd = "/bin/bash",
          args = { "-c", "sleep 1; head -c 64000000 /dev/zero; echo done > /home/user/dropped.flag" } } }),
        headers = STREAM, timeout = 0.5 })
      local home = srv:sandbox_home(sb.sandboxID)
      assert.is_truthy(wait_for(function() return read_file(home .. "/dropped.flag") == "done\n" end, 30))
      local grew = srv:heap_kb() - before
      assert.is_true(grew < 32 * 1024, string.format("the heap grew by %d kB", grew))
    end)

    it("a pause with memory keeps a process for Connect; a pause without memory ends it", function()
      local s2 = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 }).json
      local poll = background("Start", { process = { cmd = "/bin/bash",
        args = { "-c", "echo begun; sleep 5; echo done" } } }, s2)   -- (past the pause's settle, on a loaded machine)
      local pid = started(poll)
      assert.is_truthy(wait_for(function() return poll().stdout == "begun\n" end))
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. s2.sandboxID .. "/pause", {}).status)
      assert.are.equal(201, http.api(srv, "POST", "/sandboxes/" .. s2.sandboxID .. "/connect",
        { timeout = 120 }).status)
      local c = stream("Connect", { process = { pid = pid } }, nil, s2)
      assert.are.equal(pid, c.start.pid)
      assert.are.equal("done\n", c.stdout)
      assert.are.equal("exit status 0", c.end_.status)
      -- without memory: a cold boot, the process is gone
      poll = background("Start", { process = { cmd = "/bin/sleep", args = { "30" } } }, s2)
      pid = started(poll)
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. s2.sandboxID .. "/pause", { memory = false }).status)
      assert.are.equal(201, http.api(srv, "POST", "/sandboxes/" .. s2.sandboxID .. "/connect",
        { timeout = 120 }).status)
      assert.are.equal("not_found", stream("Connect", { process = { pid = pid } }, nil, s2).trailer.error.code)
      local l = rpc("List", {}, s2)
      assert.are.same({}, l.json.processes or {})
      http.api(srv, "DELETE", "/sandboxes/" .. s2.sandboxID)
    end)

    it("refuses a tag over 4096 bytes", function()
      local r = stream("Start", { tag = string.rep("t", 4097), process = { cmd = "/bin/true" } })
      assert.are.equal("invalid_argument", r.trailer.error.code)
      r = stream("Start", { tag = string.rep("t", 4096), process = { cmd = "/bin/true" } })
      assert.are.same({}, r.trailer)
    end)

    it("a killed sandbox drops its Connect streams", function()
      local res = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 })
      local s2 = res.json
      local poll = background("Start", { process = { cmd = "/bin/sleep", args = { "30" } } }, s2)
      local pid = started(poll)
      local conn = background("Connect", { process = { pid = pid } }, s2)
      started(conn)
      assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. s2.sandboxID).status)
      wbd.sleep(1)
      local c, s = conn(), poll()
      assert.is_nil(c.end_)
      assert.is_nil(c.trailer)
      assert.is_nil(s.end_)
    end)
  end)
end)

describe("warmboxd envd processes, bounded per sandbox", function()
  it("refuses a Start beyond WARMBOXD_PROCS_MAX running processes", function()
    local srv = wbd.start{ wrapper = "WARMBOXD_PROCS_MAX=2" }
    local ok, err = pcall(function()
      local res = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 })
      local sb = res.json
      local outs = {}
      for i = 1, 2 do
        outs[i] = os.tmpname()
        local f = assert(io.open(outs[i] .. ".req", "wb"))
        f:write(envelope(0, { process = { cmd = "/bin/sleep", args = { "20" } } }))
        f:close()
        local q = wbd.sh_quote
        os.execute(table.concat({ "curl -sS -N --max-time 30 -o", q(outs[i]),
          "-H", q("E2b-Sandbox-Id: " .. sb.sandboxID), "-H", q("E2b-Sandbox-Port: 49983"),
          "-H", q("Content-Type: application/connect+json"),
          "--data-binary", q("@" .. outs[i] .. ".req"), q(srv.url .. "/process.Process/Start"), ">/dev/null 2>&1 &" },
          " "))
      end
      local listed = wbd.eventually(function()
        local l = http.sandbox(srv, sb, 49983, "POST", "/process.Process/List", { json = {}, headers = RPC })
        return #(l.json.processes or {}) == 2
      end, 15)
      assert.is_truthy(listed)
      local res3 = http.sandbox(srv, sb, 49983, "POST", "/process.Process/Start",
        { body = envelope(0, { process = { cmd = "/bin/true" } }), headers = STREAM })
      local e = envelopes(res3.body)
      assert.are.equal("resource_exhausted", e[#e].msg.error.code)
      -- another sandbox has its own bound
      local other = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 }).json
      res3 = http.sandbox(srv, other, 49983, "POST", "/process.Process/Start",
        { body = envelope(0, { process = { cmd = "/bin/true" } }), headers = STREAM })
      e = envelopes(res3.body)
      assert.are.same({}, e[#e].msg)
      http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID)
      for _, o in ipairs(outs) do
        os.remove(o)
        os.remove(o .. ".req")
      end
    end)
    srv:stop()
    assert(ok, err)
  end)
end)
