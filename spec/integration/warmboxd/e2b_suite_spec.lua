-- Two tests of E2B's JS SDK suite, as their requests go over the wire,
-- against warmboxd with its default flags (no --resume-ms, no --max-running):
-- `fork with count lower than 1 fails` (an InvalidArgumentError: E2B's 400
-- with its error body, before the sandbox is looked up) and `pause and resume
-- a sandbox with completed long running process` (a background command
-- started just before a pause has written its file 2 s after the resume).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local envd = require "spec.helpers.envd"

local q = wbd.sh_quote

describe("warmboxd with default flags: E2B's JS SDK tests over the wire", function()
  local srv

  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("fork with count lower than 1 fails: 400 with E2B's error body, even for an unknown sandbox", function()
    local res = http.api(srv, "POST", "/sandboxes/sbx-test/fork", { count = 0, timeout = 300 })
    assert.equal(400, res.status, res.body)
    assert.equal(400, res.json.code)
    assert.is_string(res.json.message)
    assert.matches("count", res.json.message, 1, true)
  end)

  -- commands.run(cmd, { background = true }): envd's Process/Start as the SDK
  -- sends it (`/bin/bash -l -c cmd`), kept open in the background; returns
  -- once the start event came (when the SDK's run returns), and the files
  -- holding the stream.
  local function run_background(sb, cmd)
    local tmp = os.tmpname()
    local f = assert(io.open(tmp .. ".req", "wb"))
    f:write(envd.envelope(0, { process = { cmd = "/bin/bash", args = { "-l", "-c", cmd }, envs = {} } }))
    f:close()
    os.execute(string.format("(env -u LD_PRELOAD curl -sS -N --max-time 60 -X POST -H %s -H %s -H %s -H %s -H %s"
      .. " --data-binary @%s %s > %s 2>/dev/null) &",
      q("E2b-Sandbox-Id: " .. sb.sandboxID), q("E2b-Sandbox-Port: 49983"), q("X-Access-Token: " .. sb.envdAccessToken),
      q("Content-Type: application/connect+json"), q("Connect-Protocol-Version: 1"), q(tmp .. ".req"),
      q(srv.url .. "/process.Process/Start"), q(tmp .. ".out")))
    -- as soon as it came, as the SDK goes on at once
    local core = require "warmbox.core"
    local deadline = core.now() + 30
    while not (wbd.read_all(tmp .. ".out") or ""):find('"start"', 1, true) do
      assert.is_true(core.now() < deadline, "no start event")
      core.sleep(0.001)
    end
    return tmp
  end

  -- The SDK's requests go on kept-alive connections, one right after another:
  -- so do these (libcurl in this process, not a curl per request).
  local client
  local function call(method, path, body, headers)
    client = client or require("warmbox.core").http{ timeout = 30 }
    local h = { ["X-API-Key"] = srv.api_key, ["Content-Type"] = body and "application/json" or nil }
    for k, v in pairs(headers or {}) do h[k] = v end
    return assert(client:request{ method = method, url = srv.url .. path, headers = h, body = body })
  end
  local function file(sb, path)
    return call("GET", "/files?path=" .. envd.urlencode(path) .. "&username=user", nil,
      { ["E2b-Sandbox-Id"] = sb.sandboxID, ["E2b-Sandbox-Port"] = "49983", ["X-Access-Token"] = sb.envdAccessToken })
  end

  it("pause and resume a sandbox with completed long running process", function()
    for attempt = 1, 3 do
      local sb = http.create(srv, { templateID = "base", secure = true, timeout = 600 })
      local tmp = run_background(sb, 'sleep 2 && echo "done" > /home/user/test_long_running.txt')
      -- the file should not exist before 2 seconds have elapsed
      assert.equal(404, file(sb, "/home/user/test_long_running.txt").status)
      assert.equal(204, call("POST", "/sandboxes/" .. sb.sandboxID .. "/pause").status)
      -- (201: the connect resumed it)
      assert.equal(201, call("POST", "/sandboxes/" .. sb.sandboxID .. "/connect", '{"timeout":600}').status)
      -- the SDK test waits 2 s after the connect, then reads the file
      wbd.sleep(2)
      local res = file(sb, "/home/user/test_long_running.txt")
      assert.equal(200, res.status, "attempt " .. attempt .. ": " .. tostring(res.body))
      assert.equal("done\n", res.body)
      assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
      for _, s in ipairs({ "", ".req", ".out" }) do os.remove(tmp .. s) end
    end
  end)
end)

-- E2B's public hosts: sandbox.getHost(port) is `PORT-ID.<E2B_DOMAIN>`, and the
-- SDK's tests fetch `https://` it (`pause and resume a sandbox with http
-- server`, `tests/sandbox/host.test.ts`). warmboxd forwards a PORT-ID.localhost
-- request to that port on the sandbox's own loopback, and serves HTTPS on a
-- second listener with --tls-cert/--tls-key (here a throwaway self-signed
-- certificate for *.wb.localhost, made with openssl). curl resolves
-- *.localhost to loopback itself (RFC 6761); node needs spec/sdk/localhost.cjs.
describe("warmboxd: a sandbox's own port at PORT-ID.localhost, over HTTP and HTTPS", function()
  local srv, dir, tls_port

  lazy_setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir)))
    assert(os.execute(string.format("env -u LD_PRELOAD openssl req -x509 -newkey rsa:2048 -nodes -days 1"
      .. " -subj /CN=localhost -addext %s -keyout %s -out %s >/dev/null 2>&1",
      q("subjectAltName=DNS:*.wb.localhost,DNS:localhost"), q(dir .. "/key.pem"), q(dir .. "/cert.pem"))),
      "openssl could not make a certificate")
    srv = wbd.start{ args = { "--tls-cert", dir .. "/cert.pem", "--tls-key", dir .. "/key.pem" } }
    tls_port = tonumber(wbd.eventually(function()
      return (wbd.read_all(srv.log_path) or ""):match("warmboxd listening on https://127%.0%.0%.1:(%d+)")
    end, 15))
    assert.truthy(tls_port, srv:log())
  end)
  lazy_teardown(function()
    if srv then srv:stop() end
    if dir then os.execute("rm -rf " .. q(dir)) end
  end)

  -- curl as a user's client: status and body of url (a .localhost name: loopback).
  local function get(url, method)
    local tmp = os.tmpname()
    local p = assert(io.popen(string.format("env -u LD_PRELOAD curl -sS --max-time 30 --cacert %s -X %s -o %s"
      .. " -w '%%{http_code}' %s 2>&1", q(dir .. "/cert.pem"), method or "GET", q(tmp), q(url))))
    local status = p:read("a")
    p:close()
    local body = wbd.read_all(tmp) or ""
    os.remove(tmp)
    return tonumber(status:match("(%d+)$")), body, status
  end

  local function start_server(sb, port)
    local cmd = "mkdir -p /tmp/www && cd /tmp/www && echo served-from-the-sandbox > index.html"
      .. " && echo spaced > 'a b+c.txt'"
      .. " && exec python -m http.server " .. port   -- `python`, as E2B's host test runs it
    local f = assert(io.open(dir .. "/start.req", "wb"))
    f:write(envd.envelope(0, { process = { cmd = "/bin/bash", args = { "-l", "-c", cmd }, envs = {} } }))
    f:close()
    os.execute(string.format("(env -u LD_PRELOAD curl -sS -N --max-time 120 -X POST -H %s -H %s -H %s -H %s -H %s"
      .. " --data-binary @%s %s > /dev/null 2>&1) &",
      q("E2b-Sandbox-Id: " .. sb.sandboxID), q("E2b-Sandbox-Port: 49983"), q("X-Access-Token: " .. sb.envdAccessToken),
      q("Content-Type: application/connect+json"), q("Connect-Protocol-Version: 1"), q(dir .. "/start.req"),
      q(srv.url .. "/process.Process/Start")))
  end

  it("answers from the sandbox's server on http and https, after a pause and a resume too", function()
    local sb = http.create(srv, { templateID = "base", secure = true, timeout = 600 })
    local host = "8000-" .. sb.sandboxID .. ".wb.localhost"
    -- nothing listens yet: the proxy's 502, naming the port
    local status, body = get("https://" .. host .. ":" .. tls_port .. "/")
    assert.equal(502, status, body)
    assert.matches('"message":"The sandbox is running but port is not open"', body, 1, true)
    assert.matches('"port":8000', body, 1, true)
    start_server(sb, 8000)
    assert.truthy(wbd.eventually(function()
      return get("https://" .. host .. ":" .. tls_port .. "/index.html") == 200
    end, 30), "the sandbox's server never answered")
    status, body = get("https://" .. host .. ":" .. tls_port .. "/index.html?x=1")
    assert.equal(200, status, body)
    assert.equal("served-from-the-sandbox\n", body)
    status, body = get("http://" .. host .. ":" .. srv.port .. "/index.html")
    assert.equal(200, status, body)
    assert.equal("served-from-the-sandbox\n", body)
    -- the path as the client encoded it (warmboxd's server decodes it first)
    status, body = get("http://" .. host .. ":" .. srv.port .. "/a%20b%2Bc.txt")
    assert.equal(200, status, body)
    assert.equal("spaced\n", body)
    -- the server's own answer, whatever its status (it has no POST)
    status = get("http://" .. host .. ":" .. srv.port .. "/index.html", "POST")
    assert.equal(501, status)
    -- another port of the same sandbox: nothing listens there
    status, body = get("http://9000-" .. sb.sandboxID .. ".wb.localhost:" .. srv.port .. "/")
    assert.equal(502, status, body)
    assert.matches('"port":9000', body, 1, true)
    -- as the SDK test: pause, connect, the same server answers again
    assert.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause").status)
    assert.equal(201, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 600 }).status)
    status, body = get("https://" .. host .. ":" .. tls_port .. "/index.html")
    assert.equal(200, status, body)
    assert.equal("served-from-the-sandbox\n", body)
    assert.is_true((srv:stats().counters.port_forwarded or 0) >= 4)
    -- a killed sandbox: E2B's 502 "The sandbox was not found", with its id
    assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
    status, body = get("https://" .. host .. ":" .. tls_port .. "/")
    assert.equal(502, status, body)
    assert.matches('"message":"The sandbox was not found"', body, 1, true)
    assert.matches('"sandboxId":"' .. sb.sandboxID .. '"', body, 1, true)
  end)
end)
