-- warmboxd's data-plane routing over real HTTP: the E2B headers and the
-- per-port Host form, the proxy's 502s, envd's token, and auto-resume.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local NOT_FOUND = "The sandbox was not found"

-- Seconds since the epoch of an RFC 3339 UTC time ("2026-08-21T20:00:00.123Z").
local function epoch(s)
  local y, mo, d, h, mi, se = s:match("^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)")
  assert(y, "not an RFC 3339 time: " .. tostring(s))
  y, mo = tonumber(y), tonumber(mo)
  -- days from civil (Howard Hinnant), UTC without os.time's local zone
  y = mo <= 2 and y - 1 or y
  local era = (y >= 0 and y or y - 399) // 400
  local yoe = y - era * 400
  local doy = (153 * (mo + (mo > 2 and -3 or 9)) + 2) // 5 + tonumber(d) - 1
  local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
  local days = era * 146097 + doe - 719468
  return days * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(se)
end

describe("warmboxd data plane routing", function()
  local srv

  local function create(body) return http.create(srv, body) end

  local function by_host(sb, port, method, path, headers)
    local host_url = string.format("http://%d-%s.localhost:%d%s", port, sb.sandboxID, srv.port, path)
    return http.request{ method = method, url = host_url, headers = headers or {} }
  end

  lazy_setup(function()
    srv = wbd.start{}
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("routes by E2b-Sandbox-Id and E2b-Sandbox-Port", function()
    local sb = create{ templateID = "base", secure = true, timeout = 300 }
    local res = http.sandbox(srv, sb, 49983, "GET", "/health")
    assert.are.equal(204, res.status)
  end)

  it("routes by a PORT-ID.localhost Host", function()
    local sb = create{ templateID = "base", secure = true, timeout = 300 }
    local res = by_host(sb, 49983, "GET", "/health")
    assert.are.equal(204, res.status)
    res = http.request{ method = "POST", url = string.format("http://49983-%s.localhost:%d/filesystem.Filesystem/Stat",
      sb.sandboxID, srv.port), headers = { ["X-Access-Token"] = sb.envdAccessToken }, json = { path = "/home/user" } }
    assert.are.equal(200, res.status, res.body)
    assert.are.equal("FILE_TYPE_DIRECTORY", res.json.entry.type)
    res = http.request{ method = "POST", url = string.format("http://49983-%s.localhost:%d/filesystem.Filesystem/Stat",
      sb.sandboxID, srv.port), json = { path = "/home/user" } }
    assert.are.equal(401, res.status)
  end)

  it("answers 502 with the port for a port that is not open", function()
    local sb = create{ templateID = "base", timeout = 300 }
    local res = by_host(sb, 3000, "GET", "/")
    assert.are.equal(502, res.status)
    assert.are.same({ sandboxId = sb.sandboxID, message = "The sandbox is running but port is not open", code = 502,
      port = 3000 }, res.json)
  end)

  it("answers 502 'not found' for an unknown sandbox", function()
    local ghost = { sandboxID = "iaaaaaaaaaaaaaaaaaaaa" }
    local res = http.sandbox(srv, ghost, 49983, "GET", "/health")
    assert.are.equal(502, res.status)
    assert.are.same({ sandboxId = ghost.sandboxID, message = NOT_FOUND, code = 502 }, res.json)
    res = by_host(ghost, 49983, "GET", "/health")
    assert.are.equal(502, res.status)
    assert.are.equal(NOT_FOUND, res.json.message)
  end)

  it("answers 502 'not found' for a killed sandbox", function()
    local sb = create{ templateID = "base", timeout = 300 }
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
    local res = http.sandbox(srv, sb, 49983, "GET", "/health")
    assert.are.equal(502, res.status)
    assert.are.same({ sandboxId = sb.sandboxID, message = NOT_FOUND, code = 502 }, res.json)
  end)

  it("answers 502 for a paused sandbox without autoResume, and leaves it paused", function()
    local sb = create{ templateID = "base", timeout = 300, autoPause = true }
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {}).status)
    local res = http.sandbox(srv, sb, 49983, "GET", "/health")
    assert.are.equal(502, res.status)
    assert.are.equal(NOT_FOUND, res.json.message)
    assert.are.equal("paused", http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json.state)
  end)

  it("resumes a paused sandbox with autoResume on traffic, keeping its files", function()
    local sb = create{ templateID = "base", timeout = 60, secure = true, autoPause = true,
      autoResume = { enabled = true } }
    local up = http.sandbox(srv, sb, 49983, "POST", "/files?path=kept.txt",
      { body = "kept", headers = { ["Content-Type"] = "application/octet-stream" } })
    assert.are.equal(200, up.status, up.body)
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {}).status)
    assert.are.equal("paused", http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json.state)
    local res = http.sandbox(srv, sb, 49983, "GET", "/files?path=kept.txt")
    assert.are.equal(200, res.status, res.body)
    assert.are.equal("kept", res.body)
    local info = http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID).json
    assert.are.equal("running", info.state)
    -- E2B's lease rule after an auto-resume: at least 300 s
    assert.is_true(epoch(info.endAt) - epoch(info.startedAt) >= 299, info.startedAt .. " " .. info.endAt)
  end)

  it("still checks the token after an auto-resume", function()
    local sb = create{ templateID = "base", timeout = 60, secure = true, autoPause = true,
      autoResume = { enabled = true } }
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {}).status)
    local res = http.sandbox(srv, { sandboxID = sb.sandboxID }, 49983, "POST", "/filesystem.Filesystem/Stat",
      { json = { path = "/home/user" } })
    assert.are.equal(401, res.status)
  end)

  -- E2B's code-interpreter SDK sends X-Access-Token on /execute only, none on
  -- its context calls (js/src/sandbox.ts of e2b-dev/code-interpreter).
  local function interp_codes(server, sb)
    local anon = { sandboxID = sb.sandboxID }
    return {
      http.sandbox(server, anon, 49999, "POST", "/execute", { json = { code = "1" } }).status,
      http.sandbox(server, anon, 49999, "GET", "/contexts").status,
      http.sandbox(server, anon, 49999, "POST", "/contexts", { json = {} }).status,
      http.sandbox(server, anon, 49999, "GET", "/health").status,
      http.sandbox(server, sb, 49999, "GET", "/contexts").status,
    }
  end

  it("checks the code interpreter's token as E2B does: on /execute, not on /contexts or /health", function()
    local sb = create{ templateID = "base", timeout = 300, secure = true }
    assert.are.same({ 401, 200, 200, 200, 200 }, interp_codes(srv, sb))
    assert.are.equal(200, http.sandbox(srv, sb, 49999, "GET", "/contexts").status)
  end)

  it("with --strict-tokens (warmbox.server's own) checks it on every call but /health", function()
    local strict = assert(require("warmbox.server").start{ bin = wbd.bin() })
    local ok, err = pcall(function()
      local sb = http.create(strict, { templateID = "base", timeout = 300, secure = true })
      assert.are.same({ 401, 401, 401, 200, 200 }, interp_codes(strict, sb))
      http.api(strict, "DELETE", "/sandboxes/" .. sb.sandboxID)
    end)
    strict:stop()
    assert(ok, err)
  end)
end)
