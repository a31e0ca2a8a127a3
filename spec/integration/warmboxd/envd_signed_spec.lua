-- Signed file URLs over real HTTP without any routing header: the SDK's
-- uploadUrl/downloadUrl, with E2B_SANDBOX_URL set, are `<url>/files?path=...
-- &signature=...` and name no sandbox, so warmboxd finds the running secure
-- sandbox whose access token made the signature. Expired and bad signatures
-- get envd's own 401s; a signature reaches only its own sandbox (never one
-- of another team, never a sandbox without a token).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local envd = require "spec.helpers.envd"

-- "v1_" .. base64-no-padding(sha256(raw)), as the SDK signs file URLs.
local function signed_url(srv, ...) return envd.signed_url(srv.url, ...) end

describe("warmboxd signed /files URLs without routing headers", function()
  local srv, a, b, other, open

  local function create(key, body)
    local res = http.request{ method = "POST", url = srv.url .. "/sandboxes", headers = { ["X-API-Key"] = key },
      json = body }
    assert.are.equal(201, res.status, res.body)
    return res.json
  end

  local function read(sb, path)
    return http.sandbox(srv, sb, 49983, "GET", "/files?path=" .. envd.urlencode(path))
  end

  local function post(url, data, headers)
    local h = { ["Content-Type"] = "application/octet-stream" }
    for k, v in pairs(headers or {}) do h[k] = v end
    return http.request{ method = "POST", url = url, body = data, headers = h }
  end

  lazy_setup(function()
    srv = wbd.start{}
    a = create(srv.api_key, { templateID = "base", secure = true, timeout = 600 })
    b = create(srv.api_key, { templateID = "base", secure = true, timeout = 600 })
    other = create(wbd.new_key(), { templateID = "base", secure = true, timeout = 600 })
    open = create(srv.api_key, { templateID = "base", timeout = 600 })
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("routes a signed upload and download to the sandbox whose token signed it", function()
    local exp = tostring(os.time() + 600)
    for _, sb in ipairs({ a, b, other }) do
      local res = post(signed_url(srv, "hello.txt", "write", nil, sb.envdAccessToken, exp), "for " .. sb.sandboxID)
      assert.are.equal(200, res.status, res.body)
      assert.are.same({ { name = "hello.txt", path = "/home/user/hello.txt", type = "file" } }, res.json)
    end
    for _, sb in ipairs({ a, b, other }) do
      assert.are.equal("for " .. sb.sandboxID, read(sb, "hello.txt").body)
      local res = http.request{ url = signed_url(srv, "hello.txt", "read", nil, sb.envdAccessToken, exp) }
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("for " .. sb.sandboxID, res.body)
    end
  end)

  it("signs without an expiration and with a user, as the SDK does", function()
    local res = post(signed_url(srv, "/tmp/s.txt", "write", "root", a.envdAccessToken), "rooted")
    assert.are.equal(200, res.status, res.body)
    res = http.request{ url = signed_url(srv, "/tmp/s.txt", "read", "root", a.envdAccessToken) }
    assert.are.equal(200, res.status, res.body)
    assert.are.equal("rooted", res.body)
    assert.are.equal(404, read(b, "/tmp/s.txt").status)
  end)

  it("answers an expired signature as envd does", function()
    local exp = tostring(os.time() - 10)
    local res = http.request{ url = signed_url(srv, "hello.txt", "read", nil, a.envdAccessToken, exp) }
    assert.are.equal(401, res.status)
    assert.are.same({ code = 401, message = "signature is already expired" }, res.json)
    res = post(signed_url(srv, "late.txt", "write", nil, a.envdAccessToken, exp), "x")
    assert.are.equal(401, res.status)
    assert.are.same({ code = 401, message = "signature is already expired" }, res.json)
    assert.are.equal(404, read(a, "late.txt").status)
  end)

  it("answers a signature no sandbox made with envd's 401", function()
    local exp = tostring(os.time() + 600)
    local good = signed_url(srv, "hello.txt", "read", nil, a.envdAccessToken, exp)
    local urls = {
      signed_url(srv, "hello.txt", "read", nil, "ea_" .. string.rep("0", 64), exp),   -- unknown token
      good:gsub("path=hello.txt", "path=other.txt"),                                 -- another path
      good:gsub("signature_expiration=%d+", "signature_expiration=" .. (tonumber(exp) + 1)),  -- other time
      signed_url(srv, "hello.txt", "write", nil, a.envdAccessToken, exp),            -- write for a read
      srv.url .. "/files?path=hello.txt&signature=v1_nope",
    }
    for _, url in ipairs(urls) do
      local res = http.request{ url = url }
      assert.are.equal(401, res.status, url)
      assert.are.same({ code = 401, message = "invalid signature" }, res.json)
    end
  end)

  it("never reaches a sandbox without a token with an empty-token signature", function()
    assert.are.equal(200, http.sandbox(srv, open, 49983, "POST", "/files?path=secret.txt",
      { body = "open data", headers = { ["Content-Type"] = "application/octet-stream" } }).status)
    local res = http.request{ url = signed_url(srv, "secret.txt", "read", nil, "") }
    assert.are.equal(401, res.status)
    assert.not_matches("open data", res.body)
  end)

  it("does not route a signed URL of a killed sandbox", function()
    local gone = create(srv.api_key, { templateID = "base", secure = true, timeout = 600 })
    local url = signed_url(srv, "hello.txt", "read", nil, gone.envdAccessToken)
    assert.are.equal(404, http.request{ url = url }.status)   -- running, but no such file
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. gone.sandboxID).status)
    local res = http.request{ url = url }
    assert.are.equal(401, res.status)
    assert.are.same({ code = 401, message = "invalid signature" }, res.json)
  end)

  it("reads no large body for a signature no sandbox made", function()
    local before = (srv:stats().counters or {}).body_too_large or 0
    local res = post(srv.url .. "/files?path=x&signature=v1_" .. string.rep("A", 43), string.rep("x", 1 << 20))
    -- The server drops the body (it keeps none of it) and answers 413.
    assert.are.equal(413, res.status, res.body)
    assert.are.equal(before + 1, (srv:stats().counters or {}).body_too_large)
    assert.is_true(wbd.alive(srv.pid))
  end)

  it("counts signed requests under envd's /files routes", function()
    srv:reset_stats()
    http.request{ url = signed_url(srv, "hello.txt", "read", nil, a.envdAccessToken) }
    http.request{ url = srv.url .. "/files?path=x&signature=v1_bad" }
    assert.are.equal(2, srv:count("envd GET /files"))
  end)

  it("costs one hash of its path, not one per running secure sandbox, and nothing for an oversized path", function()
    -- 3 running secure sandboxes (a, b, other): a forged signature is tried
    -- against each token, but the path (the part a client sizes) is hashed once.
    local exp = tostring(os.time() + 600)
    local forged = "v1_" .. string.rep("A", 43)
    local function hashed(path)
      assert.are.equal(204, http.request{ method = "POST", url = srv.url .. "/_warmboxd/stats/reset" }.status)
      local res = http.request{ url = srv.url .. "/files?path=" .. path .. "&signature=" .. forged
        .. "&signature_expiration=" .. exp }
      assert.are.equal(401, res.status, res.body)
      return srv:stats().counters.signed_url_hashed_bytes or 0
    end
    local n = hashed(string.rep("p", 4000))
    assert.is_true(n >= 4000, n)
    -- each token adds its own "token:expiration" (about 80 bytes), never the path again
    assert.is_true(n < 4000 + 3 * 128, n)
    -- a path no envd serves (over 4096 bytes) is refused before any hashing
    assert.are.equal(0, hashed(string.rep("p", 20000)))
  end)
end)
