-- warmboxd's envd (port 49983) over real HTTP: auth, /files, the Filesystem
-- and Process Connect-RPC services, and path confinement.
-- This file: the part 'files' of them; shared helpers in spec/helpers/warmboxd_envd.lua.
local shared = require "spec.helpers.warmboxd_envd"
local wbd = shared.wbd
local http = shared.http
local cjson = shared.cjson
local RPC = shared.RPC
local UNAUTHORIZED = shared.UNAUTHORIZED
local b64decode = shared.b64decode
local sign = shared.sign
local urlencode = shared.urlencode
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

  local function upload(path, data, s)
    return http.sandbox(srv, s or sb, 49983, "POST", "/files?path=" .. urlencode(path),
      { body = data, headers = { ["Content-Type"] = "application/octet-stream" } })
  end

  local function download(path, s)
    return http.sandbox(srv, s or sb, 49983, "GET", "/files?path=" .. urlencode(path))
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

  describe("auth on a secure sandbox", function()
    it("answers 401 with envd's plain JSON body without X-Access-Token", function()
      local res = http.sandbox(srv, { sandboxID = sb.sandboxID }, 49983, "POST", "/filesystem.Filesystem/Stat",
        { json = { path = "/home/user" }, headers = RPC })
      assert.are.equal(401, res.status)
      assert.are.same({ code = 401, message = UNAUTHORIZED }, res.json)
    end)

    it("answers 401 for a wrong token, on streaming routes too", function()
      local bad = { sandboxID = sb.sandboxID, envdAccessToken = "nope" }
      local res = rpc(bad, "filesystem.Filesystem/Stat", { path = "/home/user" })
      assert.are.equal(401, res.status)
      assert.are.same({ code = 401, message = UNAUTHORIZED }, res.json)
      local r = start(bad, { cmd = "/bin/true" })
      assert.are.equal(401, r.status)
      assert.are.equal(UNAUTHORIZED, cjson.decode(r.body).message)
    end)

    it("accepts the right token", function()
      local res = rpc(sb, "filesystem.Filesystem/Stat", { path = "/home/user" })
      assert.are.equal(200, res.status, res.body)
    end)

    it("leaves GET /health open", function()
      local res = http.sandbox(srv, { sandboxID = sb.sandboxID }, 49983, "GET", "/health")
      assert.are.equal(204, res.status)
      assert.are.equal("", res.body)
    end)

    it("needs no token on a sandbox created without secure", function()
      local res = rpc(open, "filesystem.Filesystem/Stat", { path = "/home/user" })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal(200, upload("open.txt", "x", open).status)
      assert.are.equal("x", download("open.txt", open).body)
    end)

    it("keeps the control plane's internal envd routes closed (404)", function()
      for _, p in ipairs({ "/init", "/freeze", "/unfreeze", "/fsfreeze", "/fsthaw", "/collapse" }) do
        local res = http.sandbox(srv, sb, 49983, "POST", p, { json = {} })
        assert.are.equal(404, res.status, p)
        assert.matches("reserved for the E2B control plane", res.json.message, 1, true)
      end
    end)

    it("answers the proxy's 502 for a port nothing listens on", function()
      local res = http.sandbox(srv, sb, 8080, "GET", "/")
      assert.are.equal(502, res.status)
      assert.are.same({ sandboxId = sb.sandboxID, message = "The sandbox is running but port is not open",
        code = 502, port = 8080 }, res.json)
    end)
  end)

  describe("signed /files URLs", function()
    local noauth
    lazy_setup(function()
      noauth = { sandboxID = sb.sandboxID }
      assert.are.equal(200, upload("signed.txt", "signed data").status)
    end)

    local function get(query)
      return http.sandbox(srv, noauth, 49983, "GET", "/files?" .. query)
    end

    it("401 without token or signature", function()
      local res = get("path=signed.txt")
      assert.are.equal(401, res.status)
      assert.are.equal(401, res.json.code)
    end)

    it("serves a read with a valid signature", function()
      local sig = sign("signed.txt:read::" .. sb.envdAccessToken)
      local res = get("path=signed.txt&signature=" .. urlencode(sig))
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("signed data", res.body)
    end)

    it("checks the expiration and signs it", function()
      local exp = tostring(os.time() + 3600)
      local sig = sign("signed.txt:read::" .. sb.envdAccessToken .. ":" .. exp)
      local res = get("path=signed.txt&signature=" .. urlencode(sig) .. "&signature_expiration=" .. exp)
      assert.are.equal(200, res.status, res.body)
      local old = tostring(os.time() - 10)
      sig = sign("signed.txt:read::" .. sb.envdAccessToken .. ":" .. old)
      res = get("path=signed.txt&signature=" .. urlencode(sig) .. "&signature_expiration=" .. old)
      assert.are.equal(401, res.status)
      assert.matches("expired", res.json.message)
    end)

    it("signs the username when one is given", function()
      local sig = sign("signed.txt:read:user:" .. sb.envdAccessToken)
      local res = get("path=signed.txt&username=user&signature=" .. urlencode(sig))
      assert.are.equal(200, res.status, res.body)
      res = get("path=signed.txt&signature=" .. urlencode(sig))
      assert.are.equal(401, res.status)
    end)

    it("refuses a signature for another path, operation or user", function()
      for _, raw in ipairs({ "other.txt:read::", "signed.txt:write::", "signed.txt:read:root:" }) do
        local res = get("path=signed.txt&signature=" .. urlencode(sign(raw .. sb.envdAccessToken)))
        assert.are.equal(401, res.status, raw)
      end
    end)

    it("accepts a signed upload", function()
      local sig = sign("up/signed.bin:write::" .. sb.envdAccessToken)
      local res = http.sandbox(srv, noauth, 49983, "POST", "/files?path=up%2Fsigned.bin&signature=" .. urlencode(sig),
        { body = "up", headers = { ["Content-Type"] = "application/octet-stream" } })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("up", download("up/signed.bin").body)
    end)

    it("checks a token that is sent instead of the signature", function()
      local sig = sign("signed.txt:read::" .. sb.envdAccessToken)
      local res = http.sandbox(srv, { sandboxID = sb.sandboxID, envdAccessToken = "wrong" }, 49983, "GET",
        "/files?path=signed.txt&signature=" .. urlencode(sig))
      assert.are.equal(401, res.status)
    end)
  end)

  describe("GET /health and /envs", function()
    it("/envs returns the sandbox's env vars", function()
      local res = http.sandbox(srv, sb, 49983, "GET", "/envs")
      assert.are.equal(200, res.status)
      assert.are.same({ GREETING = "hello", SHARED = "sandbox" }, res.json)
    end)
  end)

  describe("/files", function()
    it("round-trips bytes with an octet-stream upload", function()
      local data = "bin\0ary\255data\n"
      local res = upload("/home/user/data/raw.bin", data)
      assert.are.equal(200, res.status, res.body)
      assert.are.same({ { path = "/home/user/data/raw.bin", name = "raw.bin", type = "file" } }, res.json)
      res = download("/home/user/data/raw.bin")
      assert.are.equal(200, res.status)
      assert.are.equal(data, res.body)
      assert.are.equal('inline; filename="raw.bin"', res.headers["content-disposition"])
    end)

    it("round-trips a large file (streamed download)", function()
      local parts = {}
      for i = 1, 6 * 1024 do parts[i] = string.format("%99d", i):rep(10) .. ("x"):rep(33) .. "\n" end
      local data = table.concat(parts)
      local res = upload("big.bin", data)
      assert.are.equal(200, res.status, res.body)
      res = download("big.bin")
      assert.are.equal(200, res.status)
      assert.are.equal(#data, #res.body)
      assert.is_true(data == res.body)
      assert.are.equal("6291456", rpc(sb, "filesystem.Filesystem/Stat", { path = "big.bin" }).json.entry.size)
    end)

    -- a download read until EOF while the sandbox grew the file, so
    -- one request never ended (941 MB). It now sends the size seen at open.
    do
      -- More than the loopback socket buffers take, so that the old server
      -- could not reach the end before the writer starts.
      local size = 16 << 20
      it("sends at most the size a file had when opened, while the sandbox grows it", function()
        local name = "grow-" .. size .. ".bin"
        assert.are.equal(200, upload(name, ("g"):rep(size)).status)
        -- A bounded writer, running while the download does (a process ends
        -- with its Process.Start stream, so that stream runs in the
        -- background): the file grows faster than the client reads (sparse: no
        -- disk), for 6 s at most.
        local body = os.tmpname()
        local f = assert(io.open(body, "wb"))
        f:write(envelope(0, { process = { cmd = "/bin/bash", args = { "-c",
          "timeout 6 sh -c 'while :; do truncate -s +1M " .. name .. "; sleep 0.01; done'" } } }))
        f:close()
        local q = wbd.sh_quote
        os.execute(table.concat({ "env -u LD_PRELOAD curl -s -o /dev/null --max-time 10",
          "-H", q("E2b-Sandbox-Id: " .. sb.sandboxID), "-H", q("E2b-Sandbox-Port: 49983"),
          "-H", q("X-Access-Token: " .. sb.envdAccessToken), "-H", q("Content-Type: application/connect+json"),
          "--data-binary", q("@" .. body), q(srv.url .. "/process.Process/Start"), "&" }, " "))
        assert.is_true(wbd.eventually(function()
          local st = rpc(sb, "filesystem.Filesystem/Stat", { path = name }).json
          return st and st.entry and tonumber(st.entry.size) > size
        end, 5))
        local res = http.sandbox(srv, sb, 49983, "GET", "/files?path=" .. name,
          { curl_args = { "--limit-rate", "16M" }, timeout = 10 })
        os.remove(body)
        assert.are.equal(200, res.status)
        assert.are.equal("", res.error)
        assert.is_true(#res.body >= size, #res.body)
        assert.is_true(#res.body < size + (64 << 20), #res.body)
        assert.are.equal(("g"):rep(size), res.body:sub(1, size))
      end)
    end

    it("resolves relative and ~ paths against /home/user", function()
      assert.are.equal(200, upload("rel/a.txt", "relative").status)
      assert.are.equal("relative", download("~/rel/a.txt").body)
      assert.are.equal("relative", download("/home/user/rel/a.txt").body)
      local res = upload("~/tilde.txt", "t")
      assert.are.equal("/home/user/tilde.txt", res.json[1].path)
      assert.are.equal("t", download("tilde.txt").body)
    end)

    it("overwrites an existing file", function()
      upload("over.txt", "a long first version")
      upload("over.txt", "short")
      assert.are.equal("short", download("over.txt").body)
    end)

    it("writes and reads /tmp", function()
      assert.are.equal(200, upload("/tmp/t/x.txt", "in tmp").status)
      assert.are.equal("in tmp", download("/tmp/t/x.txt").body)
    end)

    it("serves an empty file", function()
      upload("empty.txt", "")
      local res = download("empty.txt")
      assert.are.equal(200, res.status)
      assert.are.equal("", res.body)
    end)

    it("404s a missing file with envd's message", function()
      local res = download("missing.txt")
      assert.are.equal(404, res.status)
      assert.are.same({ code = 404, message = "path '/home/user/missing.txt' does not exist" }, res.json)
    end)

    it("400s a directory", function()
      upload("somedir/f", "x")
      local res = download("somedir")
      assert.are.equal(400, res.status)
      assert.are.same({ code = 400, message = "path '/home/user/somedir' is a directory" }, res.json)
    end)

    it("accepts username=user and refuses an unknown user", function()
      upload("u.txt", "u")
      local res = http.sandbox(srv, sb, 49983, "GET", "/files?path=u.txt&username=user")
      assert.are.equal(200, res.status)
      res = http.sandbox(srv, sb, 49983, "GET", "/files?path=u.txt&username=mallory")
      assert.are.equal(401, res.status)
    end)

    it("requires path for a raw upload", function()
      local res = http.sandbox(srv, sb, 49983, "POST", "/files",
        { body = "x", headers = { ["Content-Type"] = "application/octet-stream" } })
      assert.are.equal(400, res.status)
      assert.are.same({ code = 400, message = "path query parameter is required for raw body upload" }, res.json)
    end)

    it("refuses other content types", function()
      local res = http.sandbox(srv, sb, 49983, "POST", "/files?path=x.json", { json = { a = 1 } })
      assert.are.equal(400, res.status)
      assert.are.equal(400, res.json.code)
    end)

    describe("multipart/form-data", function()
      local dir
      lazy_setup(function()
        dir = os.tmpname()
        os.remove(dir)
        os.execute("mkdir -p " .. wbd.sh_quote(dir))
        for name, data in pairs({ a = "first file", b = "second\nfile", e = "" }) do
          local f = assert(io.open(dir .. "/" .. name, "wb"))
          f:write(data)
          f:close()
        end
      end)
      lazy_teardown(function() os.execute("rm -rf " .. wbd.sh_quote(dir)) end)

      local function post(query, parts)
        local args = {}
        for _, p in ipairs(parts) do
          args[#args + 1] = "-F"
          args[#args + 1] = p
        end
        return http.sandbox(srv, sb, 49983, "POST", "/files" .. query, { curl_args = args })
      end

      it("writes several files named by their filenames, creating parents", function()
        local res = post("", { "file=@" .. dir .. "/a;filename=mp/one.txt",
          "file=@" .. dir .. "/b;filename=/home/user/mp/deep/er/two.txt",
          "file=@" .. dir .. "/e;filename=/tmp/mp-empty.txt", "other=@" .. dir .. "/a;filename=ignored.txt" })
        assert.are.equal(200, res.status, res.body)
        assert.are.same({
          { path = "/home/user/mp/one.txt", name = "one.txt", type = "file" },
          { path = "/home/user/mp/deep/er/two.txt", name = "two.txt", type = "file" },
          { path = "/tmp/mp-empty.txt", name = "mp-empty.txt", type = "file" },
        }, res.json)
        assert.are.equal("first file", download("mp/one.txt").body)
        assert.are.equal("second\nfile", download("mp/deep/er/two.txt").body)
        assert.are.equal(200, download("/tmp/mp-empty.txt").status)
        assert.are.equal("", download("/tmp/mp-empty.txt").body)
        assert.are.equal(404, download("ignored.txt").status)
      end)

      it("uses the path parameter as the destination", function()
        local res = post("?path=mp%2Fnamed.txt", { "file=@" .. dir .. "/a;filename=whatever.txt" })
        assert.are.equal(200, res.status, res.body)
        assert.are.same({ { path = "/home/user/mp/named.txt", name = "named.txt", type = "file" } }, res.json)
        assert.are.equal("first file", download("mp/named.txt").body)
      end)

      it("400s two parts with one destination", function()
        local res = post("", { "file=@" .. dir .. "/a;filename=dup.txt", "file=@" .. dir .. "/b;filename=./dup.txt" })
        assert.are.equal(400, res.status)
        assert.matches("same path", res.json.message)
      end)

      -- a path that is not UTF-8 made the duplicate check compare a
      -- NULL JSON string (json_string refuses the byte) and crashed warmboxd.
      it("survives two parts to a path that is not UTF-8, and answers it as U+FFFD", function()
        local res = post("?path=/home/user/%ff",
          { "file=@" .. dir .. "/a;filename=x", "file=@" .. dir .. "/b;filename=y" })
        assert.are.equal(400, res.status, res.body)
        assert.matches("same path", res.json.message)
        assert.is_true(wbd.alive(srv.pid))
        res = post("?path=/home/user/bad%ffname", { "file=@" .. dir .. "/a;filename=x" })
        assert.are.equal(200, res.status, res.body)
        assert.are.same({ { path = "/home/user/bad\u{FFFD}name", name = "bad\u{FFFD}name", type = "file" } }, res.json)
        assert.are.equal("first file", download("/home/user/bad\xffname").body)
        assert.are.equal(200, http.api(srv, "GET", "/health").status)
      end)
    end)
  end)

end)
