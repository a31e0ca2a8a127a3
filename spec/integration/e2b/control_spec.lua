-- warmbox.e2b's control plane against a real warmboxd: every call and its
-- error cases, metadata filters with awkward bytes, pagination, retries with
-- warmboxd's fault injection, the API key never in a message.
local wbd = require "spec.helpers.warmboxd"
local core = require "warmbox.core"
local json = require "warmbox.json"
local e2b = require "warmbox.e2b"

-- Knobs through warmbox.core rather than the curl-CLI helper: these specs
-- depend on core anyway, and the curl tool hangs under an LD_PRELOADed ASan.
local knob_http
local function knob(srv, method, path, body, key)
  knob_http = knob_http or core.http{ timeout = 120 }
  local headers = { ["Content-Type"] = "application/json", ["X-Warmboxd-Token"] = srv.admin_token }
  if key then headers["X-API-Key"] = key end
  local res = assert(knob_http:request{ method = method, url = srv.url .. "/_warmboxd" .. path, headers = headers,
    body = body ~= nil and assert(json.encode(body)) or nil, retry = false })
  res.json = json.decode(res.body)
  return res
end

local function stats(srv)
  return knob(srv, "GET", "/stats").json
end

local function count(srv, route)
  return stats(srv).requests[route] or 0
end

local function fault(srv, f)
  local res = knob(srv, "POST", "/faults", f)
  assert.equals(204, res.status, res.body)
end

describe("warmbox.e2b control plane against warmboxd", function()
  local srv, c

  lazy_setup(function()
    srv = wbd.start{ args = { "--rtt-ms", "0" } }
    c = e2b.new{ api_key = srv.api_key, api_url = srv.url, sandbox_url = srv.url, retries = 3 }
  end)

  lazy_teardown(function()
    if c then c:close() end
    if srv then srv:stop() end
  end)

  before_each(function()
    knob(srv, "DELETE", "/faults")
  end)

  describe(":create()", function()
    it("creates with the lifecycle and reads it back", function()
      local sb = assert(c:create{ template = "base", timeout = 120, metadata = { user = "a b" },
        lifecycle = { on_timeout = "pause", auto_resume = true } })
      assert.truthy(sb.sandbox_id:match("^i[a-z0-9]+$"))
      assert.equals("6532622b", sb.client_id)
      assert.truthy(sb.envd_access_token)
      assert.truthy(sb.envd_version)
      local d = assert(c:info(sb.sandbox_id))
      assert.equals("running", d.state)
      assert.same({ on_timeout = "pause", auto_resume = true }, d.lifecycle)
      assert.same({ user = "a b" }, d.metadata)
      assert.truthy(d.started_at:match("^%d%d%d%d%-%d%d%-%d%dT"))
      assert.truthy(d.end_at)
      assert.is_number(d.cpu_count)
      assert.is_number(d.memory_mb)
      assert.is_true(c:kill(sb.sandbox_id))
    end)

    it("on_timeout = kill maps to no pause", function()
      local sb = assert(c:create{ lifecycle = { on_timeout = "kill" } })
      assert.equals("kill", assert(c:info(sb.sandbox_id)).lifecycle.on_timeout)
      c:kill(sb.sandbox_id)
    end)

    it("returns BAD_REQUEST for an invalid timeout from the server", function()
      local sb, msg, code, detail = c:create{ timeout = 10 * 24 * 3600 }
      assert.is_nil(sb)
      assert.equals("BAD_REQUEST", code)
      assert.equals(400, detail.status)
      assert.is_string(detail.message)
      assert.equals(msg:lower(), msg)
    end)

    it("returns AUTH for a bad key, without the key in the message", function()
      local bad = "e2b_ffffffffffffffffffffffffffffffffffffffff"
      local c2 = e2b.new{ api_key = bad, api_url = srv.url }
      local ok, msg, code, detail = c2:create()
      -- warmboxd gives each key its own team; an unknown key may be accepted.
      if ok then
        c2:kill(ok.sandbox_id)
      else
        assert.equals("AUTH", code)
        assert.equals(401, detail.status)
        assert.falsy(msg:find(bad, 1, true))
      end
      local c3 = e2b.new{ api_key = "not-a-key", api_url = srv.url }
      local r, m3, code3 = c3:info("iabc")
      assert.is_nil(r)
      assert.equals("AUTH", code3)
      assert.falsy(m3:find("not-a-key", 1, true))
      c2:close()
      c3:close()
    end)
  end)

  describe("info/connect/pause/kill/set_timeout", function()
    it("walks the lifecycle: running -> paused -> resumed -> killed", function()
      local sb = assert(c:create{ timeout = 300, lifecycle = { on_timeout = "pause" } })
      local id = sb.sandbox_id
      local s2, resumed = c:connect(id, { timeout = 300 })
      assert.equals(id, s2.sandbox_id)
      assert.is_false(resumed)
      assert.is_true(c:pause(id))
      assert.equals("paused", assert(c:info(id)).state)
      assert.is_false(c:pause(id))
      local ok, _, code = c:set_timeout(id, 30)
      assert.is_nil(ok)
      assert.equals("NOT_FOUND", code)
      local s3, resumed2 = c:connect(id, { timeout = 60 })
      assert.is_true(resumed2)
      assert.equals(sb.envd_access_token, s3.envd_access_token)
      assert.equals("running", assert(c:info(id)).state)
      assert.is_true(c:set_timeout(id, 120))
      assert.is_true(c:kill(id))
      assert.is_false(c:kill(id))
      local d, msg, code2, detail = c:info(id)
      assert.is_nil(d)
      assert.equals("NOT_FOUND", code2)
      assert.equals(("sandbox '%s' not found"):format(id), msg)
      assert.equals(404, detail.status)
      local _, _, code3 = c:connect(id)
      assert.equals("NOT_FOUND", code3)
      local _, _, code4 = c:pause(id)
      assert.equals("NOT_FOUND", code4)
    end)

    it("kill works on a paused sandbox", function()
      local sb = assert(c:create{})
      assert.is_true(c:pause(sb.sandbox_id, { memory = false }))
      assert.is_true(c:kill(sb.sandbox_id))
      assert.is_false(c:kill(sb.sandbox_id))
    end)
  end)

  describe(":list()", function()
    local ids = {}
    local weird = {
      ["a&b"] = "x", ["k=1"] = "v=1", pct = "100%", plus = "a+b", space = "a b", utf = "héllo wörld ✓",
      slash = "a/b?c#d", empty_ok = "e",
    }

    lazy_setup(function()
      for i = 1, 3 do
        local meta = { grp = "weird", n = tostring(i) }
        for k, v in pairs(weird) do meta[k] = v end
        local sb = assert(c:create{ metadata = meta })
        ids[#ids + 1] = sb.sandbox_id
      end
      local other = { grp = "weird", n = "4" }
      for k, v in pairs(weird) do other[k] = v end
      other.plus = "a b" -- differs from "a+b" only by the encoding of one byte
      ids[#ids + 1] = assert(c:create{ metadata = other }).sandbox_id
    end)

    it("filters by metadata with &, =, %, +, spaces and non-ASCII exactly", function()
      local filter = { grp = "weird" }
      for k, v in pairs(weird) do filter[k] = v end
      local items = assert(c:list_all{ metadata = filter })
      local got = {}
      for _, it in ipairs(items) do got[#got + 1] = it.metadata.n end
      table.sort(got)
      assert.same({ "1", "2", "3" }, got)
      for _, it in ipairs(items) do
        assert.equals("100%", it.metadata.pct)
        assert.equals("héllo wörld ✓", it.metadata.utf)
      end
      for k, v in pairs(weird) do
        local one = assert(c:list_all{ metadata = { grp = "weird", [k] = v } })
        assert.is_true(#one >= 3, k)
      end
      assert.equals(1, #assert(c:list_all{ metadata = { grp = "weird", plus = "a b" } }))
    end)

    it("filters by state", function()
      local id = ids[1]
      assert.is_true(c:pause(id))
      local paused = assert(c:list_all{ state = { "paused" }, metadata = { grp = "weird" } })
      assert.equals(1, #paused)
      assert.equals(id, paused[1].sandbox_id)
      assert.equals("paused", paused[1].state)
      local running = assert(c:list_all{ state = "running", metadata = { grp = "weird" } })
      assert.equals(3, #running)
      assert.equals(4, #assert(c:list_all{ metadata = { grp = "weird" } }))
      c:connect(id)
    end)

    it("pages with a small limit in both orders", function()
      local seen, pages = {}, 0
      for items in c:list_pages{ metadata = { grp = "weird" }, limit = 1, order = "asc" } do
        assert(items ~= false)
        pages = pages + 1
        for _, it in ipairs(items) do seen[#seen + 1] = it.sandbox_id end
      end
      assert.equals(4, #seen)
      assert.is_true(pages >= 4)
      local desc = {}
      for it in c:list{ metadata = { grp = "weird" }, limit = 3, order = "desc" } do desc[#desc + 1] = it.sandbox_id end
      assert.equals(4, #desc)
      for i = 1, 4 do assert.equals(seen[i], desc[5 - i]) end
    end)

    it("resumes from a next_token", function()
      local it = c:list_pages{ metadata = { grp = "weird" }, limit = 2 }
      local first, _, nxt = it()
      assert.equals(2, #first)
      assert.is_string(nxt)
      local rest = assert(c:list_all{ metadata = { grp = "weird" }, limit = 2, next_token = nxt })
      assert.equals(2, #rest)
      assert.are_not.equal(first[1].sandbox_id, rest[1].sandbox_id)
    end)

    it("gives the loop the error and the token for a bad cursor", function()
      local got
      for item, msg, code, token, detail in c:list{ next_token = "bogus" } do
        if item == false then got = { msg, code, token, detail.status } end
      end
      assert.truthy(got)
      assert.equals("BAD_REQUEST", got[2])
      assert.equals("bogus", got[3])
      assert.equals(400, got[4])
    end)

    it("returns BAD_REQUEST for a limit out of range", function()
      local items, _, code = c:list_all{ limit = 1000 }
      assert.is_nil(items)
      assert.equals("BAD_REQUEST", code)
    end)

    it("re-checks metadata when the server matches loosely", function()
      assert.equals(204, knob(srv, "POST", "/config", { loose_metadata = true }).status)
      local items = assert(c:list_all{ metadata = { grp = "weir" } })
      knob(srv, "POST", "/config", { loose_metadata = false })
      assert.equals(0, #items)
    end)
  end)

  describe("pagination at scale", function()
    it("lists 2,500 seeded records with limit 100, following every page", function()
      local key = wbd.new_key()
      local res = knob(srv, "POST", "/seed", { count = 2500, state = "paused", metadata = { seeded = "yes" } }, key)
      assert.equals(200, res.status, res.body)
      local c2 = e2b.new{ api_key = key, api_url = srv.url }
      knob(srv, "POST", "/stats/reset")
      local n, ids = 0, {}
      for it in c2:list{ limit = 100, state = { "paused" } } do
        assert(it ~= false)
        n = n + 1
        assert.is_nil(ids[it.sandbox_id])
        ids[it.sandbox_id] = true
        assert.equals("yes", it.metadata.seeded)
      end
      assert.equals(2500, n)
      assert.equals(25, count(srv, "GET /v2/sandboxes"))
      c2:close()
    end)
  end)

  describe(":kill_many() (batch)", function()
    it("kills in parallel with a bound and reports each result in order", function()
      local ids = {}
      for i = 1, 12 do ids[i] = assert(c:create{}).sandbox_id end
      assert.is_true(c:kill(ids[3]))
      ids[#ids + 1] = "inotthereatall0000000"
      local out = c:kill_many(ids, { concurrency = 4 })
      assert.equals(13, #out)
      for i = 1, 13 do
        if i == 3 or i == 13 then
          assert.same({ false }, out[i])
        else
          assert.same({ true }, out[i])
        end
      end
      for i = 1, 12 do
        local _, _, code = c:info(ids[i])
        assert.equals("NOT_FOUND", code)
      end
      assert.same({}, c:kill_many({}))
    end)

    it("batches over one client reuse connections", function()
      local h = c.http
      local reqs = {}
      for i = 1, 8 do
        reqs[i] = { url = srv.url .. "/v2/sandboxes?limit=1", headers = { ["X-API-Key"] = srv.api_key } }
      end
      local first = h:batch(reqs, { concurrency = 2 })
      local second = h:batch(reqs, { concurrency = 2 })
      local n1, n2 = 0, 0
      for i = 1, 8 do
        assert.equals(200, first[i][1].status)
        n1 = n1 + first[i][1].new_connections
        n2 = n2 + second[i][1].new_connections
      end
      assert.is_true(n1 <= 8)
      assert.equals(0, n2)
    end)
  end)

  describe("retries (fault injection)", function()
    local sb
    lazy_setup(function() sb = assert(c:create{}) end)
    lazy_teardown(function() c:kill(sb.sandbox_id) end)

    it("retries info on 503 and succeeds", function()
      knob(srv, "POST", "/stats/reset")
      fault(srv, { route = "GET /sandboxes/{id}", count = 2, status = 503 })
      assert(c:info(sb.sandbox_id))
      assert.equals(3, count(srv, "GET /sandboxes/{id}"))
    end)

    it("retries a 429 with Retry-After (retry_after_max 0: at once)", function()
      local c0 = e2b.new{ api_key = srv.api_key, api_url = srv.url, retry_after_max = 0 }
      knob(srv, "POST", "/stats/reset")
      fault(srv, { route = "GET /sandboxes/{id}", count = 1, status = 429, headers = { ["Retry-After"] = "1" } })
      assert(c0:info(sb.sandbox_id))
      assert.equals(2, count(srv, "GET /sandboxes/{id}"))
      c0:close()
    end)

    it("refuses a retry_after_max out of range", function()
      for _, v in ipairs({ -1, 1 / 0, 0 / 0, 86401 }) do
        local ok, err = pcall(e2b.new, { api_key = "k", api_url = srv.url, retry_after_max = v })
        assert.is_false(ok)
        assert.matches("bad argument #1 to 'new' (option 'retry_after_max': seconds in [0, 86400]", err, 1, true)
      end
      assert.has_error(function() e2b.new{ api_key = "k", retry_after_max = "1" } end)
    end)

    it("gives up after the attempts with the last status", function()
      local c1 = e2b.new{ api_key = srv.api_key, api_url = srv.url, retries = 1 }
      fault(srv, { route = "GET /sandboxes/{id}", count = 5, status = 503 })
      local d, _, code, detail = c1:info(sb.sandbox_id)
      assert.is_nil(d)
      assert.equals("HTTP", code)
      assert.equals(503, detail.status)
      c1:close()
    end)

    it("retries a dropped connection on an idempotent call", function()
      knob(srv, "POST", "/stats/reset")
      fault(srv, { route = "GET /sandboxes/{id}", count = 1, drop = true })
      assert(c:info(sb.sandbox_id))
    end)

    it("retries a create answered 429 (honouring Retry-After) or 503: nothing was created", function()
      knob(srv, "POST", "/stats/reset")
      fault(srv, { route = "POST /sandboxes", count = 1, status = 429, headers = { ["Retry-After"] = "1" } })
      local t0 = os.time()
      local s1 = assert(c:create{})
      assert.is_true(os.time() - t0 >= 1)
      assert.equals(2, count(srv, "POST /sandboxes"))
      c:kill(s1.sandbox_id)
      knob(srv, "POST", "/stats/reset")
      fault(srv, { route = "POST /sandboxes", count = 1, status = 503 })
      local s2 = assert(c:create{})
      assert.equals(2, count(srv, "POST /sandboxes"))
      c:kill(s2.sandbox_id)
    end)

    it("gives up on a create whose Retry-After is past the retry budget", function()
      knob(srv, "POST", "/stats/reset")
      fault(srv, { route = "POST /sandboxes", count = 1, status = 429, headers = { ["Retry-After"] = "120" } })
      local s1, _, code, detail = c:create{}
      assert.is_nil(s1)
      assert.equals("RATE_LIMITED", code)
      assert.equals(429, detail.status)
      assert.equals(1, count(srv, "POST /sandboxes"))
    end)

    it("does not retry a create on 500 or a dropped connection", function()
      knob(srv, "POST", "/stats/reset")
      fault(srv, { route = "POST /sandboxes", count = 1, status = 500 })
      local s1, _, code = c:create{}
      assert.is_nil(s1)
      assert.equals("HTTP", code)
      assert.equals(1, count(srv, "POST /sandboxes"))
      knob(srv, "POST", "/stats/reset")
      fault(srv, { route = "POST /sandboxes", count = 1, drop = true })
      local s2, _, code2 = c:create{}
      assert.is_nil(s2)
      assert.equals("TRANSPORT", code2)
      assert.equals(1, count(srv, "POST /sandboxes"))
    end)

    it("times out a slow response with TIMEOUT", function()
      local c1 = e2b.new{ api_key = srv.api_key, api_url = srv.url, request_timeout = 0.3, retries = 0 }
      fault(srv, { route = "GET /sandboxes/{id}", count = 1, delay_ms = 2000 })
      local d, msg, code = c1:info(sb.sandbox_id)
      assert.is_nil(d)
      assert.equals("TIMEOUT", code)
      assert.falsy(msg:find(srv.api_key, 1, true))
      c1:close()
    end)

    it("retries an idempotent call that timed out, within the budget", function()
      local c1 = e2b.new{ api_key = srv.api_key, api_url = srv.url, request_timeout = 0.5, retries = 2 }
      knob(srv, "POST", "/stats/reset")
      fault(srv, { route = "GET /sandboxes/{id}", count = 1, delay_ms = 1500 })
      assert(c1:info(sb.sandbox_id))
      assert.equals(2, count(srv, "GET /sandboxes/{id}"))
      c1:close()
    end)

    it("keeps connections alive across calls", function()
      local h = c.http
      local r1 = assert(h:request{ url = srv.url .. "/sandboxes/" .. sb.sandbox_id,
        headers = { ["X-API-Key"] = srv.api_key } })
      local r2 = assert(h:request{ url = srv.url .. "/sandboxes/" .. sb.sandbox_id,
        headers = { ["X-API-Key"] = srv.api_key } })
      assert.equals(200, r1.status)
      assert.equals(0, r2.new_connections)
    end)
  end)
end)
