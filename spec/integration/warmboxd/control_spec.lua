-- warmboxd's control plane over real HTTP: every endpoint, status and error
-- body that E2B's API answers: create, list, lifecycle, errors.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"


local function new_srv(args)
  return wbd.start{ args = args }
end

local create = http.create

local function info(srv, id)
  return http.api(srv, "GET", "/sandboxes/" .. id)
end

local ts = wbd.utc

local eventually = wbd.eventually

local function not_found_msg(id)
  return 'Sandbox "' .. id .. "\" doesn't exist or you don't have access to it"
end

describe("warmboxd control plane", function()
  local srv

  lazy_setup(function() srv = new_srv() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  describe("GET /health", function()
    it("answers 200 without an API key", function()
      local res = http.request{ url = srv.url .. "/health" }
      assert.are.equal(200, res.status)
    end)
  end)

  describe("auth", function()
    it("answers 401 with E2B's error body when X-API-Key is missing", function()
      local res = http.request{ method = "GET", url = srv.url .. "/v2/sandboxes" }
      assert.are.equal(401, res.status)
      assert.are.equal(401, res.json.code)
      assert.is_string(res.json.message)
    end)

    it("answers 401 for a key that is not e2b_ + hex", function()
      for _, key in ipairs({ "nope", "e2b_", "e2b_XYZ", "E2B_abc" }) do
        local res = http.request{ url = srv.url .. "/v2/sandboxes", headers = { ["X-API-Key"] = key } }
        assert.are.equal(401, res.status, key)
        assert.are.equal(401, res.json.code)
      end
    end)

    it("keeps teams apart: another key's sandboxes are 404 and unlisted", function()
      local sb = create(srv)
      local other = { url = srv.url, api_key = wbd.new_key() }
      local id = sb.sandboxID
      local res = http.api(other, "GET", "/sandboxes/" .. id)
      assert.are.equal(404, res.status)
      assert.are.same({ code = 404, message = not_found_msg(id) }, res.json)
      assert.are.equal(404, http.api(other, "DELETE", "/sandboxes/" .. id).status)
      assert.are.equal(404, http.api(other, "POST", "/sandboxes/" .. id .. "/pause", {}).status)
      assert.are.equal(404, http.api(other, "POST", "/sandboxes/" .. id .. "/connect", { timeout = 10 }).status)
      assert.are.equal(404, http.api(other, "POST", "/sandboxes/" .. id .. "/timeout", { timeout = 10 }).status)
      local list = http.api(other, "GET", "/v2/sandboxes")
      assert.are.equal(200, list.status)
      assert.are.same({}, list.json)
      assert.are.equal("0", list.headers["x-total-running"])
      -- the owner still has it, running
      assert.are.equal("running", info(srv, id).json.state)
    end)

    it("with --api-key accepts only that key", function()
      local key = "e2b_" .. string.rep("ab", 20)
      local s2 = new_srv({ "--api-key", key })
      local ok, err = pcall(function()
        local res = http.request{ url = s2.url .. "/v2/sandboxes", headers = { ["X-API-Key"] = wbd.new_key() } }
        assert.are.equal(401, res.status)
        res = http.request{ url = s2.url .. "/v2/sandboxes", headers = { ["X-API-Key"] = key } }
        assert.are.equal(200, res.status)
      end)
      s2:stop()
      assert(ok, err)
    end)
  end)

  describe("POST /sandboxes and /v2/sandboxes (create)", function()
    it("answers 201 with a Sandbox", function()
      for _, path in ipairs({ "/sandboxes", "/v2/sandboxes" }) do
        local res = http.api(srv, "POST", path, { templateID = "base", secure = true })
        assert.are.equal(201, res.status)
        local sb = res.json
        assert.matches("^i[a-z0-9]+$", sb.sandboxID)
        assert.are.equal(21, #sb.sandboxID)
        assert.are.equal("6532622b", sb.clientID)
        assert.are.equal("base", sb.templateID)
        assert.is_string(sb.envdVersion)
        assert.is_string(sb.envdAccessToken)
        assert.is_true(#sb.envdAccessToken > 16)
        assert.are.equal("application/json", res.headers["content-type"])
      end
    end)

    it("gives no envdAccessToken unless secure (old path)", function()
      local sb = create(srv, { templateID = "base" })
      assert.is_nil(sb.envdAccessToken)
      assert.is_nil(info(srv, sb.sandboxID).json.envdAccessToken)
    end)

    it("always secures sandboxes created through /v2/sandboxes, as e2b 2.51 expects", function()
      for _, body in ipairs({ { templateID = "base" }, { templateID = "base", secure = false } }) do
        local res = http.api(srv, "POST", "/v2/sandboxes", body)
        assert.are.equal(201, res.status)
        assert.is_string(res.json.envdAccessToken)
        assert.are.equal(res.json.envdAccessToken, info(srv, res.json.sandboxID).json.envdAccessToken)
      end
    end)

    it("gives distinct ids", function()
      local seen = {}
      for _ = 1, 10 do
        local id = create(srv).sandboxID
        assert.is_nil(seen[id])
        seen[id] = true
      end
    end)

    it("uses the server's default timeout (15 s) when none is given", function()
      local d = info(srv, create(srv).sandboxID).json
      assert.are.equal(15, math.floor(ts(d.endAt) - ts(d.startedAt) + 0.5))
    end)

    it("honours --default-timeout", function()
      local s2 = new_srv({ "--default-timeout", "42" })
      local ok, err = pcall(function()
        local d = info(s2, create(s2).sandboxID).json
        assert.are.equal(42, math.floor(ts(d.endAt) - ts(d.startedAt) + 0.5))
      end)
      s2:stop()
      assert(ok, err)
    end)

    it("keeps metadata, envVars and lifecycle", function()
      local sb = create(srv, { templateID = "base", timeout = 120, metadata = { user = "a b", k = "v" },
        envVars = { FOO = "bar" }, autoPause = true, autoResume = { enabled = true }, secure = true })
      local d = info(srv, sb.sandboxID).json
      assert.are.same({ user = "a b", k = "v" }, d.metadata)
      assert.are.same({ autoResume = true, onTimeout = "pause" }, d.lifecycle)
      assert.are.equal(120, math.floor(ts(d.endAt) - ts(d.startedAt) + 0.5))
      assert.are.equal(sb.envdAccessToken, d.envdAccessToken)
    end)

    it("defaults the lifecycle to kill without auto-resume", function()
      local d = info(srv, create(srv).sandboxID).json
      assert.are.same({ autoResume = false, onTimeout = "kill" }, d.lifecycle)
      assert.are.same({}, d.metadata)
    end)

    local bad = {
      { "timeout 0", { templateID = "base", timeout = 0 }, "Timeout must be greater than 0" },
      { "a negative timeout", { templateID = "base", timeout = -5 }, "Timeout must be greater than 0" },
      { "a timeout above the maximum", { templateID = "base", timeout = 24 * 3600 + 1 },
        "Timeout cannot be greater than 24 hours" },
      { "autoPauseMemory false without autoPause", { templateID = "base", autoPauseMemory = false },
        "autoPauseMemory=false only applies when autoPause is true." },
      { "autoPauseMemory false with autoResume", { templateID = "base", autoPause = true,
        autoPauseMemory = false, autoResume = { enabled = true } }, nil },
      { "a missing templateID", { timeout = 10 }, nil },
      { "a non-string metadata value", { templateID = "base", metadata = { a = 1 } }, nil },
      { "a string timeout", { templateID = "base", timeout = "10" }, nil },
    }
    for _, case in ipairs(bad) do
      it("answers 400 for " .. case[1], function()
        local res = http.api(srv, "POST", "/sandboxes", case[2])
        assert.are.equal(400, res.status)
        assert.are.equal(400, res.json.code)
        if case[3] then assert.are.equal(case[3], res.json.message) end
      end)
    end

    it("answers 400 for a body that is not JSON, or missing", function()
      local res = http.api(srv, "POST", "/sandboxes", nil, { body = "{nope" })
      assert.are.equal(400, res.status)
      assert.are.equal(400, res.json.code)
      res = http.api(srv, "POST", "/v2/sandboxes")
      assert.are.equal(400, res.status)
    end)

    it("accepts autoPauseMemory false with autoPause", function()
      local sb = create(srv, { templateID = "base", autoPause = true, autoPauseMemory = false })
      assert.are.equal("pause", info(srv, sb.sandboxID).json.lifecycle.onTimeout)
    end)

    it("caps --max-length-hours in the timeout bound", function()
      local s2 = new_srv({ "--max-length-hours", "1" })
      local ok, err = pcall(function()
        local res = http.api(s2, "POST", "/sandboxes", { templateID = "base", timeout = 3601 })
        assert.are.equal(400, res.status)
        assert.are.equal("Timeout cannot be greater than 1 hours", res.json.message)
        assert.are.equal(201, http.api(s2, "POST", "/sandboxes", { templateID = "base", timeout = 3600 }).status)
      end)
      s2:stop()
      assert(ok, err)
    end)
  end)

  describe("GET /sandboxes/{id} (info)", function()
    it("answers a SandboxDetail", function()
      local sb = create(srv, { templateID = "base", secure = true, allow_internet_access = false })
      local res = info(srv, sb.sandboxID)
      assert.are.equal(200, res.status)
      local d = res.json
      assert.are.equal(sb.sandboxID, d.sandboxID)
      assert.are.equal("base", d.templateID)
      assert.are.equal("6532622b", d.clientID)
      assert.are.equal("running", d.state)
      assert.is_number(d.cpuCount)
      assert.is_number(d.memoryMB)
      assert.is_number(d.diskSizeMB)
      assert.is_false(d.allowInternetAccess)
      assert.is_string(d.envdVersion)
      assert.is_true(ts(d.endAt) > ts(d.startedAt))
      assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d+Z$", d.startedAt)
    end)

    it("gives each template its size as E2B builds it: code-interpreter-v1 2 vCPU / 2048 MB, base 2 / 512", function()
      local ci = create(srv, { templateID = "code-interpreter-v1" })
      local base = create(srv, { templateID = "base" })
      local d = info(srv, ci.sandboxID).json
      assert.are.same({ 2, 2048 }, { d.cpuCount, d.memoryMB })
      d = info(srv, base.sandboxID).json
      assert.are.same({ 2, 512 }, { d.cpuCount, d.memoryMB })
      local listed = {}
      for _, item in ipairs(http.api(srv, "GET", "/v2/sandboxes?limit=100").json) do listed[item.sandboxID] = item end
      assert.are.same({ 2, 2048 }, { listed[ci.sandboxID].cpuCount, listed[ci.sandboxID].memoryMB })
      assert.are.same({ 2, 512 }, { listed[base.sandboxID].cpuCount, listed[base.sandboxID].memoryMB })
    end)

    it("answers 404 with E2B's message for an unknown id", function()
      local res = info(srv, "izzzzzzzzzzzzzzzzzzzz")
      assert.are.equal(404, res.status)
      assert.are.same({ code = 404, message = not_found_msg("izzzzzzzzzzzzzzzzzzzz") }, res.json)
    end)

    it("accepts the old <id>-<clientID> form and rejects a malformed id", function()
      local sb = create(srv)
      assert.are.equal(200, info(srv, sb.sandboxID .. "-6532622b").status)
      local res = info(srv, sb.sandboxID .. "-a-b")
      assert.are.equal(400, res.status)
      assert.are.equal("Invalid sandbox ID", res.json.message)
      assert.are.equal(400, info(srv, "BAD_ID").status)
    end)
  end)

  describe("DELETE /sandboxes/{id} (kill)", function()
    it("answers 204, then 404", function()
      local id = create(srv).sandboxID
      local res = http.api(srv, "DELETE", "/sandboxes/" .. id)
      assert.are.equal(204, res.status)
      assert.are.equal("", res.body)
      res = http.api(srv, "DELETE", "/sandboxes/" .. id)
      assert.are.equal(404, res.status)
      assert.are.same({ code = 404, message = not_found_msg(id) }, res.json)
      assert.are.equal(404, info(srv, id).status)
    end)

    it("kills a paused sandbox too", function()
      local id = create(srv).sandboxID
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/pause", {}).status)
      assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. id).status)
      assert.are.equal(404, info(srv, id).status)
      assert.are.equal(404, http.api(srv, "POST", "/sandboxes/" .. id .. "/connect", { timeout = 10 }).status)
    end)
  end)

  describe("POST /sandboxes/{id}/timeout", function()
    it("replaces the lease, shorter or longer", function()
      local id = create(srv, { templateID = "base", timeout = 600 }).sandboxID
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/timeout", { timeout = 30 }).status)
      local d = info(srv, id).json
      local left = ts(d.endAt) - os.time()
      assert.is_true(left <= 31 and left > 20, tostring(left))
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/timeout", { timeout = 900 }).status)
      left = ts(info(srv, id).json.endAt) - os.time()
      assert.is_true(left > 800, tostring(left))
    end)

    it("is capped by the maximum run length", function()
      local s2 = new_srv({ "--max-length-hours", "1" })
      local ok, err = pcall(function()
        local id = create(s2, { templateID = "base", timeout = 60 }).sandboxID
        assert.are.equal(204, http.api(s2, "POST", "/sandboxes/" .. id .. "/timeout", { timeout = 7200 }).status)
        local d = info(s2, id).json
        assert.are.equal(3600, math.floor(ts(d.endAt) - ts(d.startedAt) + 0.5))
      end)
      s2:stop()
      assert(ok, err)
    end)

    it("answers 400 'Max instance length exceeded' once the run is longer than the maximum", function()
      local s2 = new_srv({ "--max-length-hours", "1" })
      local ok, err = pcall(function()
        -- a record that started two hours ago (the seed knob backdates it)
        local res = http.api(s2, "POST", "/_warmboxd/seed", { count = 1, state = "running", timeout = 600,
          started_ago_s = 7200 })
        assert.are.equal(200, res.status, res.body)
        local id = http.api(s2, "GET", "/v2/sandboxes").json[1].sandboxID
        res = http.api(s2, "POST", "/sandboxes/" .. id .. "/timeout", { timeout = 30 })
        assert.are.equal(400, res.status)
        assert.are.same({ code = 400, message = "Max instance length exceeded" }, res.json)
      end)
      s2:stop()
      assert(ok, err)
    end)

    it("answers 404 for a paused or unknown sandbox, 400 without a timeout", function()
      local id = create(srv).sandboxID
      assert.are.equal(400, http.api(srv, "POST", "/sandboxes/" .. id .. "/timeout", {}).status)
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/pause", {}).status)
      local res = http.api(srv, "POST", "/sandboxes/" .. id .. "/timeout", { timeout = 30 })
      assert.are.equal(404, res.status)
      assert.are.equal(404, res.json.code)
      assert.are.equal(404, http.api(srv, "POST", "/sandboxes/inope/timeout", { timeout = 30 }).status)
    end)

    it("with 0 expires the lease now: the sandbox is killed", function()
      local id = create(srv, { templateID = "base", timeout = 600 }).sandboxID
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/timeout", { timeout = 0 }).status)
      assert.is_truthy(eventually(function() return info(srv, id).status == 404 end))
    end)
  end)

  describe("POST /sandboxes/{id}/refreshes", function()
    it("only extends the lease, at least 15 s", function()
      local id = create(srv, { templateID = "base", timeout = 600 }).sandboxID
      local before = info(srv, id).json.endAt
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/refreshes", { duration = 20 }).status)
      assert.are.equal(before, info(srv, id).json.endAt)
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/refreshes", { duration = 1200 }).status)
      assert.is_true(ts(info(srv, id).json.endAt) - os.time() > 1100)
      -- 10 s (under the 15 s floor), so a loaded machine's slow refresh still finds it
      local id2 = create(srv, { templateID = "base", timeout = 10 }).sandboxID
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id2 .. "/refreshes").status)
      local d = info(srv, id2).json
      assert.is_true(ts(d.endAt) - ts(d.startedAt) >= 14.9)
    end)

    it("answers 404 for unknown and 400 above 3600", function()
      local id = create(srv).sandboxID
      assert.are.equal(400, http.api(srv, "POST", "/sandboxes/" .. id .. "/refreshes", { duration = 3601 }).status)
      assert.are.equal(404, http.api(srv, "POST", "/sandboxes/inope/refreshes", { duration = 30 }).status)
    end)
  end)

  describe("POST /sandboxes/{id}/pause", function()
    it("answers 204, then 409 with E2B's message", function()
      local id = create(srv).sandboxID
      local res = http.api(srv, "POST", "/sandboxes/" .. id .. "/pause", { memory = true })
      assert.are.equal(204, res.status)
      res = http.api(srv, "POST", "/sandboxes/" .. id .. "/pause")
      assert.are.equal(409, res.status)
      assert.are.same({ code = 409, message = "Error pausing sandbox - sandbox '" .. id .. "' is already paused" },
        res.json)
    end)

    it("reports paused with endAt = the time it paused", function()
      local id = create(srv, { templateID = "base", timeout = 3600 }).sandboxID
      local t0 = os.time()
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/pause", {}).status)
      local d = info(srv, id).json
      assert.are.equal("paused", d.state)
      assert.is_true(ts(d.endAt) >= ts(d.startedAt))
      assert.is_true(ts(d.endAt) <= os.time() + 1 and ts(d.endAt) >= t0 - 1)
    end)

    it("answers 404 for unknown, 400 for a bad body", function()
      local res = http.api(srv, "POST", "/sandboxes/inope/pause", {})
      assert.are.equal(404, res.status)
      assert.are.equal(not_found_msg("inope"), res.json.message)
      local id = create(srv).sandboxID
      assert.are.equal(400, http.api(srv, "POST", "/sandboxes/" .. id .. "/pause", { memory = "yes" }).status)
    end)
  end)

  describe("POST /sandboxes/{id}/connect and /v2/sandboxes/{id}/connect", function()
    it("on a running sandbox answers 200 and only extends the lease", function()
      local sb = create(srv, { templateID = "base", timeout = 600, secure = true })
      local id = sb.sandboxID
      local before = info(srv, id).json
      for _, path in ipairs({ "/sandboxes/", "/v2/sandboxes/" }) do
        local res = http.api(srv, "POST", path .. id .. "/connect", { timeout = 10 })
        assert.are.equal(200, res.status)
        assert.are.equal(id, res.json.sandboxID)
        assert.are.equal(sb.envdAccessToken, res.json.envdAccessToken)
        assert.are.equal(before.endAt, info(srv, id).json.endAt)
      end
      local res = http.api(srv, "POST", "/sandboxes/" .. id .. "/connect", { timeout = 1200 })
      assert.are.equal(200, res.status)
      local after = info(srv, id).json
      assert.are.equal(before.startedAt, after.startedAt)
      assert.is_true(ts(after.endAt) - os.time() > 1100)
    end)

    it("on a paused sandbox answers 201 and resumes it, keeping token, metadata and lifecycle", function()
      local sb = create(srv, { templateID = "base", timeout = 600, secure = true, metadata = { m = "1" },
        autoPause = true, autoResume = { enabled = true } })
      local id = sb.sandboxID
      local before = info(srv, id).json
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/pause", {}).status)
      wbd.sleep(0.01)
      local res = http.api(srv, "POST", "/sandboxes/" .. id .. "/connect", { timeout = 120 })
      assert.are.equal(201, res.status)
      assert.are.equal(id, res.json.sandboxID)
      assert.are.equal(sb.envdAccessToken, res.json.envdAccessToken)
      local d = info(srv, id).json
      assert.are.equal("running", d.state)
      assert.are_not.equal(before.startedAt, d.startedAt)
      assert.is_true(ts(d.startedAt) > ts(before.startedAt))
      assert.are.equal(120, math.floor(ts(d.endAt) - ts(d.startedAt) + 0.5))
      assert.are.same({ m = "1" }, d.metadata)
      assert.are.same({ autoResume = true, onTimeout = "pause" }, d.lifecycle)
      assert.are.equal(sb.envdAccessToken, d.envdAccessToken)
    end)

    it("v2 takes an optional timeout and memory:false", function()
      local id = create(srv, { templateID = "base", timeout = 600 }).sandboxID
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/pause", {}).status)
      local res = http.api(srv, "POST", "/v2/sandboxes/" .. id .. "/connect", { memory = false })
      assert.are.equal(201, res.status)
      local d = info(srv, id).json
      assert.are.equal(15, math.floor(ts(d.endAt) - ts(d.startedAt) + 0.5))
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/pause", {}).status)
      res = http.api(srv, "POST", "/v2/sandboxes/" .. id .. "/connect", nil, { body = "" })
      assert.are.equal(201, res.status)
    end)

    it("answers 404 for unknown, 400 for a missing (v1) or too long timeout", function()
      local res = http.api(srv, "POST", "/sandboxes/inope/connect", { timeout = 10 })
      assert.are.equal(404, res.status)
      assert.are.equal(404, res.json.code)
      assert.are.equal(404, http.api(srv, "POST", "/v2/sandboxes/inope/connect", {}).status)
      local id = create(srv).sandboxID
      assert.are.equal(400, http.api(srv, "POST", "/sandboxes/" .. id .. "/connect", {}).status)
      res = http.api(srv, "POST", "/sandboxes/" .. id .. "/connect", { timeout = 24 * 3600 + 1 })
      assert.are.equal(400, res.status)
      assert.are.equal("Timeout cannot be greater than 24 hours", res.json.message)
    end)
  end)

  describe("POST /sandboxes/{id}/resume (deprecated)", function()
    it("answers 409 when running and 201 when paused", function()
      local id = create(srv).sandboxID
      local res = http.api(srv, "POST", "/sandboxes/" .. id .. "/resume", { timeout = 60 })
      assert.are.equal(409, res.status)
      assert.are.same({ code = 409, message = "Sandbox " .. id .. " is already running" }, res.json)
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/pause", {}).status)
      res = http.api(srv, "POST", "/sandboxes/" .. id .. "/resume", { timeout = 60 })
      assert.are.equal(201, res.status)
      assert.are.equal(id, res.json.sandboxID)
      assert.are.equal("running", info(srv, id).json.state)
      assert.are.equal(404, http.api(srv, "POST", "/sandboxes/inope/resume", { timeout = 60 }).status)
    end)
  end)

  describe("GET /sandboxes (v1 list)", function()
    it("lists running sandboxes only, newest first, filtered by metadata", function()
      local s2 = new_srv()
      local ok, err = pcall(function()
        local a = create(s2, { templateID = "base", metadata = { g = "v1" } }).sandboxID
        wbd.sleep(0.01)
        local b = create(s2, { templateID = "base", metadata = { g = "v1" } }).sandboxID
        local c = create(s2, { templateID = "base", metadata = { g = "v1" } }).sandboxID
        create(s2, { templateID = "base", metadata = { g = "other" } })
        assert.are.equal(204, http.api(s2, "POST", "/sandboxes/" .. c .. "/pause", {}).status)
        local res = http.api(s2, "GET", "/sandboxes?metadata=g%3Dv1")
        assert.are.equal(200, res.status)
        assert.are.equal(2, #res.json)
        assert.are.equal(b, res.json[1].sandboxID)
        assert.are.equal(a, res.json[2].sandboxID)
        assert.are.equal("running", res.json[1].state)
        assert.is_nil(res.headers["x-next-token"])
        assert.are.equal(3, #http.api(s2, "GET", "/sandboxes").json)
      end)
      s2:stop()
      assert(ok, err)
    end)
  end)

  describe("unknown routes", function()
    it("answer 404 with an error body", function()
      local res = http.api(srv, "GET", "/nope")
      assert.are.equal(404, res.status)
      assert.are.equal(404, res.json.code)
    end)
  end)
end)
