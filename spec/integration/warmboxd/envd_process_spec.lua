-- warmboxd's envd (port 49983) over real HTTP: auth, /files, the Filesystem
-- and Process Connect-RPC services, and path confinement.
-- This file: the part 'process' of them; shared helpers in spec/helpers/warmboxd_envd.lua.
local shared = require "spec.helpers.warmboxd_envd"
local wbd = shared.wbd
local http = shared.http
local RPC = shared.RPC
local b64decode = shared.b64decode
local envelope = shared.envelope
local envelopes = shared.envelopes

describe("warmboxd envd", function()
  local srv, sb, open

  local function rpc(s, method, body, headers)
    local h = {}
    for k, v in pairs(RPC) do h[k] = v end
    for k, v in pairs(headers or {}) do h[k] = v end
    return http.sandbox(srv, s or sb, 49983, "POST", "/" .. method, { json = body, headers = h })
  end

  -- Process.Start: returns { status, envelopes, stdout, stderr, start, end_, trailer }.
  local function start(s, process, headers, raw_body)
    local h = { ["Content-Type"] = "application/connect+json", ["Connect-Protocol-Version"] = "1" }
    for k, v in pairs(headers or {}) do h[k] = v end
    local res = http.sandbox(srv, s or sb, 49983, "POST", "/process.Process/Start",
      { body = raw_body or envelope(0, { process = process }), headers = h })
    local r = { status = res.status, headers = res.headers, body = res.body, stdout = "", stderr = "", events = {} }
    if res.status ~= 200 then return r end
    r.envelopes = envelopes(res.body)
    for _, e in ipairs(r.envelopes) do
      if e.flag == 2 then
        r.trailer = e.msg
      else
        local ev = e.msg.event
        r.events[#r.events + 1] = ev
        if ev.start then r.start = ev.start end
        if ev["end"] then r.end_ = ev["end"] end
        if ev.data and ev.data.stdout then r.stdout = r.stdout .. b64decode(ev.data.stdout) end
        if ev.data and ev.data.stderr then r.stderr = r.stderr .. b64decode(ev.data.stderr) end
      end
    end
    return r
  end

  local function sh(cmd, s, extra)
    local p = { cmd = "/bin/bash", args = { "-l", "-c", cmd } }
    for k, v in pairs(extra or {}) do p[k] = v end
    return start(s, p)
  end

  lazy_setup(function()
    srv = wbd.start{}
    local res = http.api(srv, "POST", "/sandboxes",
      { templateID = "base", secure = true, timeout = 600, envVars = { GREETING = "hello", SHARED = "sandbox" } })
    assert.are.equal(201, res.status, res.body)
    sb = res.json
    assert.is_string(sb.envdAccessToken)
    res = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 })
    assert.are.equal(201, res.status, res.body)
    open = res.json
    assert.is_nil(open.envdAccessToken)
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  describe("process.Process/Start", function()
    it("streams start, base64 stdout/stderr, end and the {} trailer", function()
      local r = sh("echo out; echo err >&2")
      assert.are.equal(200, r.status)
      assert.matches("^application/connect%+json", r.headers["content-type"])
      assert.is_number(r.events[1].start.pid)
      assert.are.equal("out\n", r.stdout)
      assert.are.equal("err\n", r.stderr)
      assert.are.same({ exited = true, status = "exit status 0" }, r.end_)
      assert.are.same({}, r.trailer)
      assert.are.equal(2, r.envelopes[#r.envelopes].flag)
    end)

    it("reports a non-zero exit code", function()
      local r = sh("exit 3")
      assert.are.equal(3, r.end_.exitCode)
      assert.are.equal("exit status 3", r.end_.status)
      assert.is_true(r.end_.exited)
      assert.are.same({}, r.trailer)
    end)

    it("passes binary output through base64 intact", function()
      local r = sh("printf 'a\\000b\\377c'")
      assert.are.equal("a\0b\255c", r.stdout)
    end)

    it("applies envs over the sandbox's env vars, and cwd", function()
      assert.is_nil(sh("mkdir -p /home/user/fs/sub").end_.exitCode) -- its own dirs (the part may run alone)
      local r = sh("echo $GREETING $SHARED $EXTRA", nil, { envs = { SHARED = "request", EXTRA = "x" } })
      assert.are.equal("hello request x\n", r.stdout)
      r = sh("pwd", nil, { cwd = "/home/user/fs/sub" })
      assert.are.equal("/home/user/fs/sub\n", r.stdout)
      r = sh("pwd", nil, { cwd = "fs" })
      assert.are.equal("/home/user/fs\n", r.stdout)
      r = sh("pwd")
      assert.are.equal("/home/user\n", r.stdout)
    end)

    it("runs args without a shell", function()
      local r = start(nil, { cmd = "/bin/echo", args = { "a b", "$HOME" } })
      assert.are.equal("a b $HOME\n", r.stdout)
    end)

    it("kills the process and fails with deadline_exceeded after Connect-Timeout-Ms", function()
      local r = start(nil, { cmd = "/bin/bash", args = { "-c", "echo begun; sleep 60" } },
        { ["Connect-Timeout-Ms"] = "1000" })
      assert.are.equal(200, r.status)
      assert.are.equal("begun\n", r.stdout)
      assert.is_nil(r.end_)
      assert.are.equal("deadline_exceeded", r.trailer.error.code)
    end)

    it("waits for the exit of a process that closed its output, within the deadline", function()
      local r = sh("exec >&- 2>&-; sleep 0.2; exit 4")
      assert.are.equal(4, r.end_.exitCode)
      r = start(nil, { cmd = "/bin/bash", args = { "-c", "echo bye; exec >&- 2>&-; sleep 60" } },
        { ["Connect-Timeout-Ms"] = "1000" })
      assert.are.equal("bye\n", r.stdout)
      assert.are.equal("deadline_exceeded", r.trailer.error.code)
    end)

    -- Keepalive-Ping-Interval * 10^6 overflowed into a negative
    -- interval (a keepalive on every loop, forever), and a huge
    -- Connect-Timeout-Ms overflowed the deadline (UBSan aborts the server).
    it("saturates huge Keepalive-Ping-Interval and Connect-Timeout-Ms", function()
      local huge = "99999999999999999999999"
      local r = start(nil, { cmd = "/bin/bash", args = { "-c", "sleep 0.5; echo done" } },
        { ["Keepalive-Ping-Interval"] = huge, ["Connect-Timeout-Ms"] = huge })
      assert.are.equal(200, r.status)
      assert.are.equal("done\n", r.stdout)
      assert.are.same({ exited = true, status = "exit status 0" }, r.end_)
      local keepalives = 0
      for _, ev in ipairs(r.events) do
        if ev.keepalive then keepalives = keepalives + 1 end
      end
      assert.are.equal(0, keepalives)
      r = start(nil, { cmd = "/bin/echo", args = { "ok" } },
        { ["Keepalive-Ping-Interval"] = "9223372036854775807", ["Connect-Timeout-Ms"] = "9223372036854775807" })
      assert.are.equal("ok\n", r.stdout)
      assert.is_true(wbd.alive(srv.pid))
    end)

    it("answers other streaming RPCs with an unimplemented trailer", function()
      local res = http.sandbox(srv, sb, 49983, "POST", "/process.Process/NoSuchStream", {
        body = envelope(0, { process = { pid = 1 } }),
        headers = { ["Content-Type"] = "application/connect+json" } })
      assert.are.equal(200, res.status)
      local e = envelopes(res.body)
      assert.are.equal(1, #e)
      assert.are.equal(2, e[1].flag)
      assert.are.equal("unimplemented", e[1].msg.error.code)
    end)

    it("reports handler errors only in the trailer, with HTTP 200", function()
      local r = start(nil, { args = { "x" } })
      assert.are.equal(200, r.status)
      assert.are.same({}, r.events)
      assert.are.equal("invalid_argument", r.trailer.error.code)
      r = start(nil, nil, nil, "\0\0\0")
      assert.are.equal(200, r.status)
      assert.are.equal("invalid_argument", r.trailer.error.code)
      r = start(nil, nil, { Authorization = "Basic bWFsbG9yeTo=" })
      assert.are.equal("unauthenticated", r.trailer.error.code)
    end)

    it("refuses a non-streaming content type with 415", function()
      local res = http.sandbox(srv, sb, 49983, "POST", "/process.Process/Start",
        { json = { process = { cmd = "/bin/true" } }, headers = RPC })
      assert.are.equal(415, res.status)
    end)
  end)

  describe("process.Process/List and SendSignal", function()
    local function background_start(cmd, out, tag, stdin)
      local body = envelope(0, { process = { cmd = "/bin/bash", args = { "-c", cmd } }, tag = tag or "bg",
        stdin = stdin or false })
      local bf = out .. ".req"
      local f = assert(io.open(bf, "wb"))
      f:write(body)
      f:close()
      local q = wbd.sh_quote
      os.execute(table.concat({ "curl -sS --max-time 60 -o", q(out), "-H", q("E2b-Sandbox-Id: " .. sb.sandboxID),
        "-H", q("E2b-Sandbox-Port: 49983"), "-H", q("X-Access-Token: " .. sb.envdAccessToken),
        "-H", q("Content-Type: application/connect+json"), "--data-binary", q("@" .. bf),
        q(srv.url .. "/process.Process/Start"), "&" }, " "))
    end

    local function wait_for(fn)
      for _ = 1, 200 do
        local v = fn()
        if v then return v end
        wbd.sleep(0.05)
      end
      return fn()
    end

    it("lists a running process and kills it with SIGNAL_SIGKILL", function()
      local out = os.tmpname()
      background_start("sleep 60", out)
      local proc = wait_for(function()
        local res = rpc(sb, "process.Process/List", {})
        for _, p in ipairs(res.json and res.json.processes or {}) do
          if p.tag == "bg" then return p end
        end
      end)
      assert.is_table(proc)
      assert.are.equal("/bin/bash", proc.config.cmd)
      local res = rpc(sb, "process.Process/SendSignal", { process = { pid = proc.pid }, signal = "SIGNAL_SIGKILL" })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("{}", res.body)
      local body = wait_for(function()
        local f = io.open(out, "rb")
        local s = f and f:read("a")
        if f then f:close() end
        local ok, envs = pcall(envelopes, s or "")
        return ok and #envs > 0 and envs[#envs].flag == 2 and s
      end)
      local ended
      for _, e in ipairs(envelopes(body)) do
        if e.flag == 0 and e.msg.event["end"] then ended = e.msg.event["end"] end
      end
      assert.are.equal("signal: killed", ended.status)
      os.remove(out)
      os.remove(out .. ".req")
      assert.is_true(wait_for(function()
        local l = rpc(sb, "process.Process/List", {})
        for _, p in ipairs(l.json.processes or {}) do
          if p.pid == proc.pid then return nil end
        end
        return true
      end))
    end)

    it("feeds stdin with SendInput and ends it with CloseStdin", function()
      local out = os.tmpname()
      background_start("cat; echo done", out, "cat", true)
      local proc = wait_for(function()
        local res = rpc(sb, "process.Process/List", {})
        for _, p in ipairs(res.json and res.json.processes or {}) do
          if p.tag == "cat" then return p end
        end
      end)
      assert.is_table(proc)
      local res = rpc(sb, "process.Process/SendInput", { process = { pid = proc.pid }, input = { stdin = "aGVsbG8K" } })
      assert.are.equal(200, res.status, res.body)
      res = rpc(sb, "process.Process/CloseStdin", { process = { tag = "cat" } })
      assert.are.equal(200, res.status, res.body)
      local body = wait_for(function()
        local f = io.open(out, "rb")
        local s = f and f:read("a")
        if f then f:close() end
        local ok, envs = pcall(envelopes, s or "")
        return ok and #envs > 0 and envs[#envs].flag == 2 and envs
      end)
      local stdout = ""
      for _, e in ipairs(body) do
        if e.flag == 0 and e.msg.event.data then stdout = stdout .. b64decode(e.msg.event.data.stdout or "") end
      end
      assert.are.equal("hello\ndone\n", stdout)
      os.remove(out)
      os.remove(out .. ".req")
      res = rpc(sb, "process.Process/SendInput", { process = { pid = 999999 }, input = { stdin = "eA==" } })
      assert.are.equal(404, res.status)
    end)

    it("SendSignal to an unknown pid is not_found", function()
      local res = rpc(sb, "process.Process/SendSignal", { process = { pid = 999999 }, signal = "SIGNAL_SIGTERM" })
      assert.are.equal(404, res.status)
      assert.are.equal("not_found", res.json.code)
    end)

    it("keeps the process when the client goes away, as envd does", function()
      -- The client gives up after 1 s; the process goes on (a client may come
      -- back with Connect: warmboxd_process_spec), until it ends on its own.
      http.sandbox(srv, sb, 49983, "POST", "/process.Process/Start", {
        body = envelope(0, { process = { cmd = "/bin/bash", args = { "-c", "echo up; sleep 3" } }, tag = "gone" }),
        headers = { ["Content-Type"] = "application/connect+json" }, timeout = 1 })
      local function listed()
        local l = rpc(sb, "process.Process/List", {})
        for _, p in ipairs(l.json.processes or {}) do
          if p.tag == "gone" then return true end
        end
        return false
      end
      wbd.sleep(0.5)
      assert.is_true(listed())
      assert.is_true(wait_for(function() return not listed() end))
    end)
  end)
end)
