-- warmboxd's envd (port 49983) over real HTTP: auth, /files, the Filesystem
-- and Process Connect-RPC services, and path confinement.

-- Run in parts (spec.helpers.parts), one spec file a group: warmboxd_envd_<group>_spec.lua.
local part = (...)({
  files = {
    "auth on a secure sandbox",
    "signed /files URLs",
    "GET /health and /envs",
    "/files",
  },
  fs = {
    "filesystem.Filesystem",
    "the jail's filesystem",
  },
  process = {
    "process.Process/Start",
    "process.Process/List and SendSignal",
  },
})
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local envd = require "spec.helpers.envd"
local cjson = http.cjson

local RPC = { ["Connect-Protocol-Version"] = "1" }
local UNAUTHORIZED = "unauthorized access, please provide a valid access token or method signing if supported"
local b64decode, sign, urlencode = envd.b64decode, envd.sign, envd.urlencode
local envelope, envelopes = envd.envelope, envd.envelopes

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

  part("auth on a secure sandbox", function()
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

  part("signed /files URLs", function()
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

  part("GET /health and /envs", function()
    it("/envs returns the sandbox's env vars", function()
      local res = http.sandbox(srv, sb, 49983, "GET", "/envs")
      assert.are.equal(200, res.status)
      assert.are.same({ GREETING = "hello", SHARED = "sandbox" }, res.json)
    end)
  end)

  part("/files", function()
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

  part("filesystem.Filesystem", function()
    lazy_setup(function()
      upload("fs/a.txt", "12345")
      upload("fs/sub/b.txt", "b")
      upload("fs/sub/deeper/c.txt", "c")
      upload("fs/empty", "")
    end)

    it("Stat returns a protojson EntryInfo", function()
      local res = rpc(sb, "filesystem.Filesystem/Stat", { path = "fs/a.txt" })
      assert.are.equal(200, res.status, res.body)
      assert.matches("^application/json", res.headers["content-type"])
      local e = res.json.entry
      assert.are.equal("a.txt", e.name)
      assert.are.equal("FILE_TYPE_FILE", e.type)
      assert.are.equal("/home/user/fs/a.txt", e.path)
      assert.are.equal("5", e.size)
      assert.are.equal(420, e.mode)
      assert.are.equal("-rw-r--r--", e.permissions)
      assert.are.equal("user", e.owner)
      assert.are.equal("user", e.group)
      assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d[%.%d]*Z$", e.modifiedTime)
    end)

    it("Stat omits a zero size and reports directories", function()
      local e = rpc(sb, "filesystem.Filesystem/Stat", { path = "fs/empty" }).json.entry
      assert.is_nil(e.size)
      e = rpc(sb, "filesystem.Filesystem/Stat", { path = "/home/user/fs/sub" }).json.entry
      assert.are.equal("FILE_TYPE_DIRECTORY", e.type)
      assert.are.equal("drwxr-xr-x", e.permissions)
      assert.are.equal(493, e.mode)
    end)

    it("Stat of a missing path is not_found (404)", function()
      local res = rpc(sb, "filesystem.Filesystem/Stat", { path = "fs/nope" })
      assert.are.equal(404, res.status)
      assert.are.equal("not_found", res.json.code)
      assert.is_string(res.json.message)
    end)

    it("MakeDir creates parents and returns the entry", function()
      local res = rpc(sb, "filesystem.Filesystem/MakeDir", { path = "made/a/b" })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("FILE_TYPE_DIRECTORY", res.json.entry.type)
      assert.are.equal("/home/user/made/a/b", res.json.entry.path)
    end)

    it("MakeDir of an existing directory is already_exists (409)", function()
      rpc(sb, "filesystem.Filesystem/MakeDir", { path = "made2" })
      local res = rpc(sb, "filesystem.Filesystem/MakeDir", { path = "made2" })
      assert.are.equal(409, res.status)
      assert.are.equal("already_exists", res.json.code)
    end)

    it("MakeDir over a file is invalid_argument (400)", function()
      local res = rpc(sb, "filesystem.Filesystem/MakeDir", { path = "fs/a.txt" })
      assert.are.equal(400, res.status)
      assert.are.equal("invalid_argument", res.json.code)
    end)

    it("ListDir lists one level by default and when depth is 0", function()
      for _, depth in ipairs({ 1, 0 }) do
        local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "fs", depth = depth })
        assert.are.equal(200, res.status, res.body)
        local names = {}
        for _, e in ipairs(res.json.entries) do names[#names + 1] = e.path end
        assert.are.same({ "/home/user/fs/a.txt", "/home/user/fs/empty", "/home/user/fs/sub" }, names)
      end
    end)

    it("ListDir walks deeper with depth", function()
      local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "/home/user/fs", depth = 2 })
      local names = {}
      for _, e in ipairs(res.json.entries) do names[#names + 1] = e.path end
      assert.are.same({ "/home/user/fs/a.txt", "/home/user/fs/empty", "/home/user/fs/sub",
        "/home/user/fs/sub/b.txt", "/home/user/fs/sub/deeper" }, names)
    end)

    it("ListDir of an empty directory is {}", function()
      rpc(sb, "filesystem.Filesystem/MakeDir", { path = "emptydir" })
      local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "emptydir", depth = 1 })
      assert.are.equal(200, res.status)
      assert.are.equal("{}", res.body)
    end)

    it("ListDir errors: missing is not_found, a file is invalid_argument", function()
      local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "nodir", depth = 1 })
      assert.are.equal(404, res.status)
      assert.are.equal("not_found", res.json.code)
      res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "fs/a.txt", depth = 1 })
      assert.are.equal(400, res.status)
      assert.are.equal("invalid_argument", res.json.code)
    end)

    it("Remove is recursive and a missing path is fine", function()
      upload("rm/x/y/z.txt", "z")
      local res = rpc(sb, "filesystem.Filesystem/Remove", { path = "rm" })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("{}", res.body)
      assert.are.equal(404, rpc(sb, "filesystem.Filesystem/Stat", { path = "rm" }).status)
      res = rpc(sb, "filesystem.Filesystem/Remove", { path = "rm" })
      assert.are.equal(200, res.status)
      assert.are.equal("{}", res.body)
    end)

    it("Move renames, creating the destination's parents", function()
      upload("mv/src.txt", "moving")
      local res = rpc(sb, "filesystem.Filesystem/Move", { source = "mv/src.txt", destination = "mv/new/dst.txt" })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("/home/user/mv/new/dst.txt", res.json.entry.path)
      assert.are.equal("moving", download("mv/new/dst.txt").body)
      assert.are.equal(404, download("mv/src.txt").status)
      res = rpc(sb, "filesystem.Filesystem/Move", { source = "mv/src.txt", destination = "mv/x.txt" })
      assert.are.equal(404, res.status)
      assert.are.equal("not_found", res.json.code)
    end)

    it("answers unimplemented (501) for an RPC it does not serve", function()
      local res = rpc(sb, "filesystem.Filesystem/Chown", { path = "fs" })
      assert.are.equal(501, res.status)
      assert.are.equal("unimplemented", res.json.code)
    end)

    it("refuses an unknown user in Authorization with unauthenticated (401)", function()
      local res = rpc(sb, "filesystem.Filesystem/Stat", { path = "fs" },
        { Authorization = "Basic " .. "bWFsbG9yeTo=" })   -- "mallory:"
      assert.are.equal(401, res.status)
      assert.are.equal("unauthenticated", res.json.code)
      res = rpc(sb, "filesystem.Filesystem/Stat", { path = "fs" }, { Authorization = "Basic dXNlcjo=" })  -- "user:"
      assert.are.equal(200, res.status)
    end)
  end)

  part("the jail's filesystem", function()
    -- What a process in the sandbox prints for `cat path` (nil when it fails).
    local function jail_cat(path, s)
      local r = sh("cat " .. path, s)
      if r.end_ and r.end_.exitCode then return nil end
      return r.stdout
    end
    local function host_file(path)
      local f = io.open(path, "r")
      if not f then return nil end
      local d = f:read("a")
      f:close()
      return d
    end

    it("serves every path as the sandbox's processes see it, never the host's", function()
      local mine = jail_cat("/etc/passwd")
      assert.matches("user:x:1000:1000", mine)
      assert.are_not.equal(host_file("/etc/passwd"), mine)   -- the jail's generated one
      for _, p in ipairs({ "/etc/passwd", "../../etc/passwd", "/home/user/../../etc/passwd", "/tmp/../etc/passwd" }) do
        local res = download(p)
        assert.are.equal(200, res.status, p)
        assert.are.equal(mine, res.body, p)
      end
      -- a host tree the jail binds read-only, through its /bin -> usr/bin link too
      assert.are.equal(host_file("/usr/bin/env"), download("/usr/bin/env").body)
      assert.are.equal(host_file("/usr/bin/env"), download("/bin/env").body)
      assert.are.equal(jail_cat("/etc/hosts"), download("/etc/hosts").body)
      local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "/", depth = 1 })
      assert.are.equal(200, res.status, res.body)
      local names = {}
      for _, e in ipairs(res.json.entries) do names[e.name] = e end
      for _, n in ipairs({ "etc", "home", "tmp", "usr", "root", "proc", "dev" }) do assert.is_table(names[n], n) end
      -- /tmp as the jail has it (the sandbox's own, sticky), not the mount point under it
      assert.are.equal("dtrwxrwxrwx", names.tmp.permissions)
      -- two levels: into the mounted trees, never into /proc or /dev
      assert.are.equal(200, upload("/tmp/level2.txt", "x").status)
      res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "/", depth = 2 })
      local paths = {}
      for _, e in ipairs(res.json.entries) do paths[e.path] = true end
      for _, want in ipairs({ "/home/user", "/usr/bin", "/tmp/level2.txt", "/etc/passwd" }) do
        assert.is_true(paths[want], want)
      end
      for path in pairs(paths) do
        assert.not_matches("^/proc/.", path)
        assert.not_matches("^/dev/.", path)
      end
    end)

    it("does not serve the per-process /proc, /dev and /sys", function()
      for _, p in ipairs({ "/proc/self/environ", "/proc/1/root/etc/shadow", "/dev/null", "/sys/kernel" }) do
        local res = download(p)
        assert.are.equal(400, res.status, p)
        res = rpc(sb, "filesystem.Filesystem/Stat", { path = p })
        assert.are.equal(403, res.status, p)
        assert.are.equal("permission_denied", res.json.code, p)
      end
    end)

    it("writes outside /home/user and /tmp to the sandbox's own root, seen by its processes", function()
      assert.are.equal(200, upload("/opt/app/x.txt", "in opt").status)
      assert.are.equal("in opt", jail_cat("/opt/app/x.txt"))
      assert.is_nil(host_file("/opt/app/x.txt"))
      assert.are.equal(200, upload("/etc/warmbox-evil", "mine").status)
      assert.are.equal("mine", jail_cat("/etc/warmbox-evil"))
      assert.is_nil(host_file("/etc/warmbox-evil"))
      -- and the other way round: a process's file outside home and /tmp
      local r = sh("mkdir -p /root/made && echo by-process > /root/made/f && echo run > /run/marker")
      assert.is_nil(r.end_.exitCode, r.stderr)
      assert.are.equal("by-process\n", download("/root/made/f").body)
      assert.are.equal("run\n", download("/run/marker").body)
      local res = rpc(sb, "filesystem.Filesystem/MakeDir", { path = "/srv/data" })
      assert.are.equal(200, res.status, res.body)
      assert.is_nil(sh("test -d /srv/data").end_.exitCode)
      res = rpc(sb, "filesystem.Filesystem/Move", { source = "/opt/app/x.txt", destination = "/srv/data/x.txt" })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("in opt", jail_cat("/srv/data/x.txt"))
      assert.are.equal(200, rpc(sb, "filesystem.Filesystem/Remove", { path = "/srv/data" }).status)
      assert.is_nil(jail_cat("/srv/data/x.txt"))
    end)

    it("keeps its root's skeleton out of the sandbox user's reach (warmboxd as root)", function()
      local id = io.popen("id -u"):read("l")
      if id ~= "0" then return end   -- without root the jail's user is warmboxd's own uid
      for _, cmd in ipairs({ "touch /x", "rmdir /usr", "mv /etc /etc2", "ln -s / /l", "rm /bin",
                             "echo x > /etc/passwd", "echo x > /usr/x" }) do
        local r = sh(cmd)
        assert.is_number(r.end_.exitCode, cmd)
      end
      local link = io.popen("readlink /bin"):read("l")   -- the host's (merged /usr), or nil
      if link then assert.are.equal(link .. "\n", sh("readlink /bin").stdout) end
      -- the parts that are the user's own
      local r = sh("touch /root/a /run/a /var/tmp/a /tmp/a /home/user/a")
      assert.is_nil(r.end_.exitCode, r.stderr)
    end)

    it("keeps another sandbox's root apart", function()
      assert.are.equal(200, upload("/opt/only-here", "a").status)
      assert.are.equal(404, download("/opt/only-here", open).status)
      assert.is_nil(jail_cat("/opt/only-here", open))
    end)

    it("keeps the root across a pause, with memory and without", function()
      local s = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 }).json
      assert.are.equal(200, upload("/opt/kept", "kept", s).status)
      local path = "/sandboxes/" .. s.sandboxID
      for _, memory in ipairs({ true, false }) do
        assert.are.equal(204, http.api(srv, "POST", path .. "/pause", { memory = memory }).status)
        assert.are.equal(201, http.api(srv, "POST", path .. "/connect", { timeout = 60 }).status)
        assert.are.equal("kept", jail_cat("/opt/kept", s), tostring(memory))
        assert.are.equal("kept", download("/opt/kept", s).body)
      end
      http.api(srv, "DELETE", path)
    end)

    it("refuses every change to the host trees the jail has read-only", function()
      local env = host_file("/usr/bin/env")
      assert.are_not.equal(200, upload("/usr/bin/env", "pwned").status)
      assert.are_not.equal(200, upload("/usr/warmbox-evil", "x").status)
      assert.are_not.equal(200, upload("/etc/passwd", "pwned").status)
      assert.are_not.equal(200, upload("/etc/hosts", "pwned").status)
      for _, m in ipairs({ { "MakeDir", { path = "/usr/lib/warmbox-evil" } },
                           { "Remove", { path = "/usr/bin/env" } },
                           { "Remove", { path = "/etc/hosts" } },
                           { "Move", { source = "/usr/bin/env", destination = "/tmp/env" } },
                           { "Move", { source = "/tmp/x", destination = "/usr/bin/x" } } }) do
        local res = rpc(sb, "filesystem.Filesystem/" .. m[1], m[2])
        assert.are.equal(403, res.status, m[1] .. " " .. res.body)
        assert.are.equal("permission_denied", res.json.code)
      end
      assert.are.equal(env, host_file("/usr/bin/env"))
      assert.is_nil(host_file("/usr/warmbox-evil"))
      assert.is_nil(io.open("/usr/lib/warmbox-evil", "r"))
      assert.matches("user:x:1000", jail_cat("/etc/passwd"))
    end)

    it("answers relative paths of user root from /root, and starts its processes there", function()
      local res = http.sandbox(srv, sb, 49983, "POST", "/files?username=root&path=hello.txt",
        { body = "as root", headers = { ["Content-Type"] = "application/octet-stream" } })
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("/root/hello.txt", res.json[1].path)
      assert.are.equal("as root", jail_cat("/root/hello.txt"))
      res = http.sandbox(srv, sb, 49983, "GET", "/files?username=root&path=hello.txt")
      assert.are.equal("as root", res.body)
      local r = start(sb, { cmd = "/bin/bash", args = { "-c", "pwd; echo $HOME" } },
        { Authorization = "Basic " .. "cm9vdDo=" })   -- "root:"
      assert.are.equal("/root\n/root\n", r.stdout)
      assert.are.equal("/home/user\n", sh("pwd").stdout)
    end)

    it("refuses to remove the sandbox's home itself", function()
      local res = rpc(sb, "filesystem.Filesystem/Remove", { path = "/home/user" })
      assert.are.equal(403, res.status)
      assert.are.equal(200, rpc(sb, "filesystem.Filesystem/Stat", { path = "fs/a.txt" }).status)
    end)

    describe("with symlinks planted by the sandbox's own code", function()
      lazy_setup(function()
        local r = sh("cd /home/user && mkdir -p links/in && echo inside > links/in/f.txt && " ..
          "ln -s /etc/passwd links/abs && ln -s ../../../../../../../../etc/passwd links/rel && " ..
          "ln -s /etc links/etcdir && ln -s ../../../../../../../../etc links/reldir && " ..
          "ln -s in/f.txt links/ok && ln -s /home/user/links/in/f.txt links/absin && ln -s /tmp links/tmpdir && " ..
          "ln -s /home/user/../../etc links/sneaky && ln -s /tmp/../etc/passwd links/sneaky2")
        assert.are.equal(200, r.status)
        assert.is_nil(r.end_.exitCode, r.stderr)
      end)

      it("serves what they point at in the jail, never a host file", function()
        local mine = jail_cat("/etc/passwd")
        for _, p in ipairs({ "links/abs", "links/rel", "links/etcdir/passwd", "links/reldir/passwd",
          "links/sneaky/passwd", "links/sneaky2" }) do
          local res = download(p)
          assert.are.equal(200, res.status, p)
          assert.are.equal(mine, res.body, p)
          assert.are.equal(mine, jail_cat("/home/user/" .. p), p)
        end
        local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "links/etcdir", depth = 1 })
        assert.are.equal(200, res.status)
        assert.not_matches("shadow", res.body)   -- the host's /etc is not the jail's
        -- a bound file is listed as the file, not as the mount point under it,
        -- through the link as directly
        for _, dir in ipairs({ "links/etcdir", "/etc" }) do
          res = rpc(sb, "filesystem.Filesystem/ListDir", { path = dir, depth = 1 })
          local seen
          for _, e in ipairs(res.json.entries) do
            if e.name == "passwd" then
              seen = e
              assert.are.equal(tostring(#mine), e.size, dir)
            end
          end
          assert.are.equal(dir == "/etc" and "/etc/passwd" or "/home/user/links/etcdir/passwd", seen.path)
        end
      end)

      it("writes through them where the jail would: the sandbox's own root", function()
        for _, p in ipairs({ "links/etcdir/warmbox-evil", "links/reldir/warmbox-evil2" }) do
          assert.are.equal(200, upload(p, "x").status, p)
          assert.are.equal("x", jail_cat("/home/user/" .. p), p)
        end
        assert.is_nil(host_file("/etc/warmbox-evil"))
        assert.is_nil(host_file("/etc/warmbox-evil2"))
      end)

      it("does not overwrite a read-only file through a planted link", function()
        local before, mine = host_file("/etc/passwd"), jail_cat("/etc/passwd")
        assert.are_not.equal(200, upload("links/abs", "pwned").status)
        assert.are.equal(before, host_file("/etc/passwd"))
        assert.are.equal(mine, jail_cat("/etc/passwd"))
        local r = sh("ln -s /usr/lib links/usrlib && ln -s ../../../usr/bin links/relusr")
        assert.is_nil(r.end_.exitCode, r.stderr)
        for _, p in ipairs({ "links/usrlib/warmbox-evil", "links/relusr/warmbox-evil" }) do
          assert.are_not.equal(200, upload(p, "x").status, p)
          local res = rpc(sb, "filesystem.Filesystem/MakeDir", { path = p })
          assert.are.equal(403, res.status, p)
        end
        assert.is_nil(host_file("/usr/lib/warmbox-evil"))
        assert.is_nil(host_file("/usr/bin/warmbox-evil"))
      end)

      it("lists and stats the links themselves", function()
        local e = rpc(sb, "filesystem.Filesystem/Stat", { path = "links/abs" }).json.entry
        assert.are.equal("FILE_TYPE_SYMLINK", e.type)
        assert.are.equal("/etc/passwd", e.symlinkTarget)
        -- the resolved absolute path, as envd sends, not the link's text
        local function target(p) return rpc(sb, "filesystem.Filesystem/Stat", { path = p }).json.entry.symlinkTarget end
        assert.are.equal("/etc/passwd", target("links/rel"))
        assert.are.equal("/home/user/links/in/f.txt", target("links/ok"))
        assert.are.equal("/etc", target("links/sneaky"))
        local res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "links", depth = 3 })
        for _, entry in ipairs(res.json.entries) do
          assert.not_matches("passwd$", entry.path:gsub("^/home/user/links/", ""))
        end
      end)

      it("follows a link that stays inside the sandbox, relative or absolute", function()
        assert.are.equal("inside\n", download("links/ok").body)
        assert.are.equal("inside\n", download("links/absin").body)
        local res = upload("links/tmpdir/via-link.txt", "via")
        assert.are.equal(200, res.status, res.body)
        assert.are.equal("via", download("/tmp/via-link.txt").body)
        res = rpc(sb, "filesystem.Filesystem/ListDir", { path = "links/tmpdir", depth = 1 })
        assert.are.equal(200, res.status, res.body)
      end)

      it("moves and removes the link, never its target", function()
        local res = rpc(sb, "filesystem.Filesystem/Move", { source = "links/rel", destination = "links/rel2" })
        assert.are.equal(200, res.status, res.body)
        assert.are.equal("FILE_TYPE_SYMLINK", res.json.entry.type)
        res = rpc(sb, "filesystem.Filesystem/Remove", { path = "links/rel2" })
        assert.are.equal(200, res.status)
        res = rpc(sb, "filesystem.Filesystem/Remove", { path = "links/etcdir" })
        assert.are.equal(200, res.status)
        assert.is_not_nil(io.open("/etc/passwd", "r"))
        assert.is_not_nil(io.open("/etc/hostname", "r") or io.open("/etc/os-release", "r"))
      end)
    end)
  end)

  part("process.Process/Start", function()
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

  part("process.Process/List and SendSignal", function()
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
