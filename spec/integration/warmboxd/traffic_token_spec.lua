-- E2B's traffic token: `network: {allowPublicTraffic: false}` (with
-- `secure: true`) gives a sandbox a trafficAccessToken, and its ports other
-- than envd's (a server started in it, the interpreter's 49999) answer only
-- a request carrying it in `e2b-traffic-access-token`: else the proxy's 403.
-- And warmboxd's own rule under --secure-all: a sandbox's forwarded ports
-- need its X-Access-Token (or its traffic token), never its id alone.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local envd = require "spec.helpers.envd"

local q = wbd.sh_quote
local PRIVATE = { allowPublicTraffic = false }
local MISSING = "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing"
local INVALID = "Sandbox is secured with traffic access token. Provided token in header "
  .. "'e2b-traffic-access-token' is invalid"

-- `python -m http.server port` in the sandbox, started through envd as the
-- E2B suite spec does (envd's port needs no traffic token).
local function start_server(srv, sb, port)
  local dir = os.tmpname()
  local f = assert(io.open(dir .. ".req", "wb"))
  f:write(envd.envelope(0, { process = { cmd = "/bin/bash", args = { "-l", "-c",
    "mkdir -p /tmp/www && cd /tmp/www && echo served > index.html && exec python -m http.server " .. port },
    envs = {} } }))
  f:close()
  os.execute(string.format("(env -u LD_PRELOAD curl -sS -N --max-time 120 -X POST -H %s -H %s -H %s -H %s -H %s"
    .. " --data-binary @%s %s > /dev/null 2>&1; rm -f %s) &",
    q("E2b-Sandbox-Id: " .. sb.sandboxID), q("E2b-Sandbox-Port: 49983"), q("X-Access-Token: " .. sb.envdAccessToken),
    q("Content-Type: application/connect+json"), q("Connect-Protocol-Version: 1"), q(dir .. ".req"),
    q(srv.url .. "/process.Process/Start"), q(dir .. ".req")))
  os.remove(dir)
end

-- A request to the sandbox's `port` with exactly `headers` (no token of its own).
local function port_get(srv, sb, port, path, headers, o)
  local h = { ["E2b-Sandbox-Id"] = sb.sandboxID, ["E2b-Sandbox-Port"] = tostring(port) }
  for k, v in pairs(headers or {}) do h[k] = v end
  o = o or {}
  return http.request{ method = o.method or "GET", url = srv.url .. path, headers = h, json = o.json,
    timeout = o.timeout }
end

local function assert_refused(res, sb, message)
  assert.equal(403, res.status, res.body)
  assert.equal(403, res.json.code)
  assert.equal(sb.sandboxID, res.json.sandboxId)
  assert.equal(message, res.json.message)
end

describe("warmboxd: E2B's traffic token (network.allowPublicTraffic false)", function()
  local srv

  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("refuses allowPublicTraffic false without secure: true, with E2B's 400", function()
    for _, body in ipairs({ { templateID = "base", network = PRIVATE },
                            { templateID = "base", secure = false, network = PRIVATE } }) do
      local res = http.api(srv, "POST", "/sandboxes", body)
      assert.equal(400, res.status, res.body)
      assert.equal("You cannot create a sandbox without public access unless you enable secure envd access "
        .. "via 'secure' flag.", res.json.message)
    end
    local res = http.api(srv, "POST", "/sandboxes", { templateID = "base", network = { allowPublicTraffic = "no" } })
    assert.equal(400, res.status, res.body)
    -- public (the default, or said so): no token
    local sb = http.create(srv, { templateID = "base", secure = true, network = { allowPublicTraffic = true } })
    assert.is_nil(sb.trafficAccessToken)
    assert.is_nil(http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json.network)
    assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
    -- POST /v2/sandboxes always secures envd: no 400 there
    sb = http.create(srv, { templateID = "base", network = PRIVATE }, "/v2/sandboxes")
    assert.is_string(sb.trafficAccessToken)
    assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
  end)

  it("a forwarded port needs the token, kept across pause and resume; a fork has its own", function()
    local sb = http.create(srv, { templateID = "base", secure = true, timeout = 600, network = PRIVATE })
    local token = sb.trafficAccessToken
    assert.is_string(token)
    assert.matches("^ta_%x+$", token)
    assert.not_equal(sb.envdAccessToken, token)
    -- GET /sandboxes/{id}: the ingress setting, not the token (E2B's SandboxDetail)
    local info = http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json
    assert.same({ allowPublicTraffic = false }, info.network)
    assert.is_nil(info.trafficAccessToken)
    -- refused before anything else (nothing listens yet), as E2B's proxy
    assert_refused(port_get(srv, sb, 8000, "/"), sb, MISSING)
    start_server(srv, sb, 8000)
    assert.truthy(wbd.eventually(function()
      return port_get(srv, sb, 8000, "/index.html", { ["e2b-traffic-access-token"] = token }).status == 200
    end, 30), "the sandbox's server never answered")
    assert_refused(port_get(srv, sb, 8000, "/index.html"), sb, MISSING)
    assert_refused(port_get(srv, sb, 8000, "/index.html", { ["e2b-traffic-access-token"] = "" }), sb, MISSING)
    assert_refused(port_get(srv, sb, 8000, "/index.html", { ["e2b-traffic-access-token"] = token .. "0" }), sb, INVALID)
    assert_refused(port_get(srv, sb, 8000, "/index.html", { ["e2b-traffic-access-token"] = sb.envdAccessToken }),
      sb, INVALID)
    -- the envd token is not the traffic token
    assert_refused(port_get(srv, sb, 8000, "/index.html", { ["X-Access-Token"] = sb.envdAccessToken }), sb, MISSING)
    local res = port_get(srv, sb, 8000, "/index.html", { ["E2B-Traffic-Access-Token"] = token })
    assert.equal(200, res.status, res.body)
    assert.equal("served\n", res.body)
    -- envd's port is not the proxy's to guard
    assert.equal(204, port_get(srv, sb, 49983, "/health").status)

    -- pause, connect: the same token
    assert.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause").status)
    -- paused without autoResume: E2B's 502 comes before the token is looked at
    res = port_get(srv, sb, 8000, "/index.html")
    assert.equal(502, res.status, res.body)
    assert.equal("The sandbox was not found", res.json.message)
    local con = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 600 })
    assert.equal(201, con.status, con.body)
    assert.equal(token, con.json.trafficAccessToken)
    assert_refused(port_get(srv, sb, 8000, "/index.html"), sb, MISSING)
    res = port_get(srv, sb, 8000, "/index.html", { ["e2b-traffic-access-token"] = token })
    assert.equal(200, res.status, res.body)
    assert.equal("served\n", res.body)

    -- a fork keeps the private ingress with a token of its own
    local fork = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/fork", { count = 1, timeout = 600 })
    assert.equal(201, fork.status, fork.body)
    local child = fork.json[1].sandbox
    assert.is_string(child.trafficAccessToken, fork.body)
    assert.not_equal(token, child.trafficAccessToken)
    assert.same({ allowPublicTraffic = false }, http.api(srv, "GET", "/sandboxes/" .. child.sandboxID).json.network)
    assert_refused(port_get(srv, child, 8000, "/"), child, MISSING)
    assert_refused(port_get(srv, child, 8000, "/", { ["e2b-traffic-access-token"] = token }), child, INVALID)
    -- its own token passes the proxy (its server did not come along: the proxy's 502)
    res = port_get(srv, child, 8000, "/", { ["e2b-traffic-access-token"] = child.trafficAccessToken })
    assert.equal(502, res.status, res.body)
    assert.equal("The sandbox is running but port is not open", res.json.message)
    for _, id in ipairs({ sb.sandboxID, child.sandboxID }) do
      assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. id).status)
    end
  end)

  it("guards the interpreter's port (its SDK sends E2B-Traffic-Access-Token)", function()
    local sb = http.create_interp(srv, { network = PRIVATE })
    local token = assert(sb.trafficAccessToken)
    local with = { ["E2B-Traffic-Access-Token"] = token }
    assert_refused(port_get(srv, sb, 49999, "/contexts", nil, { method = "POST", json = { language = "python" } }),
      sb, MISSING)
    assert_refused(port_get(srv, sb, 49999, "/health"), sb, MISSING)
    local ctx = port_get(srv, sb, 49999, "/contexts", with, { method = "POST", json = { language = "python" } })
    assert.equal(200, ctx.status, ctx.body)
    assert.equal(200, port_get(srv, sb, 49999, "/contexts", with).status)
    -- /execute: the envd token (X-Access-Token) and the traffic token, both
    local code = { code = "print(6 * 7)" }
    assert_refused(port_get(srv, sb, 49999, "/execute", { ["X-Access-Token"] = sb.envdAccessToken },
      { method = "POST", json = code }), sb, MISSING)
    assert_refused(port_get(srv, sb, 49999, "/execute", { ["X-Access-Token"] = sb.envdAccessToken,
      ["E2B-Traffic-Access-Token"] = "ta_wrong" }, { method = "POST", json = code }), sb, INVALID)
    local res = port_get(srv, sb, 49999, "/execute", { ["X-Access-Token"] = sb.envdAccessToken,
      ["E2B-Traffic-Access-Token"] = token }, { method = "POST", json = code, timeout = 120 })
    assert.equal(200, res.status, res.body)
    assert.matches("42", res.body, 1, true)
    assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
  end)

  it("warmbox's E2B client sends the token it was given on the interpreter's port", function()
    local c = require("warmbox.e2b").new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key }
    local sb = assert(c:create{ template = "code-interpreter-v1", timeout = 600, network = PRIVATE })
    assert.is_string(sb.traffic_access_token)
    local box = c:sandbox(sb)
    local ctx = assert(box:create_context{ language = "python" })
    assert.is_string(ctx.id)
    assert.is_truthy(box:run_code("6 * 7", { context_id = ctx.id, timeout = 60 }))
    -- by id alone (no token): the proxy's 403
    local bare = c:sandbox(sb.sandbox_id, { access_token = sb.envd_access_token })
    local ok, msg = bare:create_context{ language = "python" }
    assert.is_nil(ok)
    assert.matches("403", msg, 1, true)
    assert.is_truthy(c:kill(sb.sandbox_id))
  end)

  it("checks the token before an auto-resume: a refused request leaves the sandbox paused", function()
    local sb = http.create(srv, { templateID = "base", secure = true, timeout = 600, autoPause = true,
      autoResume = { enabled = true }, network = PRIVATE })
    local function state() return http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json.state end
    assert.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause").status)
    assert_refused(port_get(srv, sb, 8000, "/"), sb, MISSING)
    assert_refused(port_get(srv, sb, 49999, "/health", { ["e2b-traffic-access-token"] = "ta_0" }), sb, INVALID)
    assert.equal("paused", state())
    local res = port_get(srv, sb, 8000, "/", { ["e2b-traffic-access-token"] = sb.trafficAccessToken })
    assert.equal(502, res.status, res.body)   -- resumed; nothing listens on 8000
    assert.equal("The sandbox is running but port is not open", res.json.message)
    assert.equal("running", state())
    assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
  end)

  it("keeps the token across a restart of warmboxd", function()
    local sb = http.create(srv, { templateID = "base", secure = true, timeout = 600, network = PRIVATE })
    local token = sb.trafficAccessToken
    assert.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause").status)
    local api_key = srv.api_key
    assert.is_true(srv:kill("TERM"))
    local old = srv
    srv = wbd.start{ dir = old.dir, api_key = api_key }
    assert.same({ allowPublicTraffic = false }, http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json.network)
    local con = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 600 })
    assert.equal(201, con.status, con.body)
    assert.equal(token, con.json.trafficAccessToken)
    assert_refused(port_get(srv, sb, 8000, "/"), sb, MISSING)
    local res = port_get(srv, sb, 8000, "/", { ["e2b-traffic-access-token"] = token })
    assert.equal(502, res.status, res.body)   -- past the proxy's check; nothing listens after a restart
    assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
  end)
end)

describe("warmboxd --secure-all: a sandbox's own ports need its token", function()
  local srv

  lazy_setup(function() srv = wbd.start{ args = { "--secure-all" } } end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("answers a forwarded port with the X-Access-Token or the traffic token, else 403", function()
    local sb = http.create(srv, { templateID = "base", timeout = 600 })
    assert.is_string(sb.envdAccessToken)
    local own = { ["X-Access-Token"] = sb.envdAccessToken }
    start_server(srv, sb, 8000)
    assert.truthy(wbd.eventually(function() return port_get(srv, sb, 8000, "/index.html", own).status == 200 end, 30),
      "the sandbox's server never answered")
    local res = port_get(srv, sb, 8000, "/index.html")
    assert.equal(403, res.status, res.body)
    assert.equal(sb.sandboxID, res.json.sandboxId)
    assert.equal(8000, res.json.port)
    assert.equal(403, port_get(srv, sb, 8000, "/index.html", { ["X-Access-Token"] = "ea_wrong" }).status)
    -- nor by a token of another sandbox
    local other = http.create(srv, { templateID = "base", timeout = 600 })
    assert.equal(403, port_get(srv, sb, 8000, "/index.html", { ["X-Access-Token"] = other.envdAccessToken }).status)
    -- nothing listening behind the check does not tell more than the 403
    assert.equal(403, port_get(srv, sb, 9000, "/").status)
    assert.equal("served\n", port_get(srv, sb, 8000, "/index.html", own).body)
    -- a private sandbox there: its traffic token
    local priv = http.create(srv, { templateID = "base", timeout = 600, network = PRIVATE })
    res = port_get(srv, priv, 8000, "/", { ["e2b-traffic-access-token"] = priv.trafficAccessToken })
    assert.equal(502, res.status, res.body)   -- past the check; nothing listens
    assert.equal(403, port_get(srv, priv, 8000, "/").status)
    for _, id in ipairs({ sb.sandboxID, other.sandboxID, priv.sandboxID }) do
      assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. id).status)
    end
  end)
end)
