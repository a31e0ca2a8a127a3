-- warmbox.e2b with a fake transport: request building (URLs, bodies,
-- headers), the metadata encoding, lifecycle mapping and validation, error
-- mapping, streamed data-plane calls. No server involved.
local cjson = require("cjson.safe").new()

-- A fake warmbox.core: records requests, answers from a script.
local function fake_core()
  local fake = { requests = {}, responses = {} }
  local Http = {}
  Http.__index = Http
  function Http:request(req) -- luacheck: ignore self
    fake.requests[#fake.requests + 1] = req
    local r = table.remove(fake.responses, 1)
    assert(r, "no scripted response for " .. tostring(req.method) .. " " .. tostring(req.url))
    if type(r) == "function" then return r(req) end
    if r.error then return nil, r.error, r.code end
    if r.frames and req.on_chunk then
      for _, f in ipairs(r.frames) do
        if type(f) == "table" then req.on_chunk(f[1], f[2]) else req.on_chunk(f, 0) end
      end
      if r.break_after then return nil, "connection reset", "TRANSPORT" end
    end
    if r.fail then return nil, r.fail[1], r.fail[2], r.fail[3] end
    return { status = r.status or 200, headers = r.headers or {}, body = r.body or "", attempts = 1 }
  end
  function Http:close() end -- luacheck: ignore self
  fake.core = { _VERSION = require("spec.helpers.fakes").VERSION, http = function(opts)
    fake.http_opts = opts
    return setmetatable({}, Http)
  end }
  return fake
end

local function load(fake)
  package.loaded["warmbox.core"] = fake.core
  package.loaded["warmbox.e2b"] = nil
  package.loaded["warmbox.e2b.sandbox"] = nil
  return require "warmbox.e2b"
end

local KEY = "e2b_00112233445566778899aabbccddeeff00112233"

insulate("warmbox.e2b", function()
  local fake, e2b, c

  before_each(function()
    fake = fake_core()
    e2b = load(fake)
    c = e2b.new{ api_key = KEY, api_url = "http://api.test", sandbox_url = "http://sb.test" }
  end)

  local function push(r) fake.responses[#fake.responses + 1] = r end
  local function last() return fake.requests[#fake.requests] end

  describe("new()", function()
    it("rejects unknown options and wrong types", function()
      assert.has_error(function() e2b.new{ api_key = KEY, nope = 1 } end,
        "bad argument #1 to 'new' (unknown option 'nope')")
      assert.has_error(function() e2b.new{ api_key = 1 } end,
        "bad argument #1 to 'new' (option 'api_key': string expected, got number)")
      assert.has_error(function() e2b.new{ api_key = KEY, retries = "3" } end,
        "bad argument #1 to 'new' (option 'retries': number expected, got string)")
      assert.has_error(function() e2b.new("x") end, "bad argument #1 to 'new' (table expected, got string)")
    end)

    it("defaults the api url from the domain and uses per-port hosts", function()
      local c2 = e2b.new{ api_key = KEY, domain = "example.org" }
      assert.equals("https://api.example.org", c2.api_url)
      local s = c2:sandbox("iabc", { access_token = "tok" })
      assert.equals("https://49983-iabc.example.org", s.envd_url)
      assert.equals("https://49999-iabc.example.org", s.interp_url)
      local s2 = c2:sandbox({ sandbox_id = "iabc", domain = "other.dev" })
      assert.equals("https://49983-iabc.other.dev", s2.envd_url)
    end)

    it("never shows the key in tostring", function()
      assert.falsy(tostring(c):find(KEY, 1, true))
    end)

    it("passes timeouts to the transport", function()
      e2b.new{ api_key = KEY, request_timeout = 7, connect_timeout = 2 }
      assert.equals(7, fake.http_opts.timeout)
      assert.equals(2, fake.http_opts.connect_timeout)
    end)

    it(":with_transport() makes a client whose requests go through that transport, the first one unchanged",
      function()
      local via = {}
      local tp = { request = function(_, req)
        via[#via + 1] = req.url
        return { status = 204, headers = {}, body = "", attempts = 1 }
      end }
      local c2 = c:with_transport(tp)
      assert.equals(getmetatable(c), getmetatable(c2))
      assert.equals(c.http, c2.http)
      assert.is_nil(c.transport)
      assert.is_true((c2:kill("sb1")))
      assert.same({ "http://api.test/sandboxes/sb1" }, via)
      assert.equals(0, #fake.requests)
      push{ status = 204 }
      assert.is_true((c:kill("sb2")))
      assert.equals(1, #fake.requests)
      assert.equals(1, #via)
    end)

    it("gives retry_after_max to every retry of the client, none by default", function()
      local function caps(cl)
        local n, all = 0, {}
        for k, v in pairs(cl) do
          if type(v) == "table" and v.attempts then n = n + 1; all[k] = v.retry_after_max end
        end
        return n, all
      end
      local n, all = caps(e2b.new{ api_key = KEY, retry_after_max = 0.25 })
      assert.is_true(n >= 6)
      for k, v in pairs(all) do assert.equals(0.25, v, k) end
      local n0, none = caps(e2b.new{ api_key = KEY })
      assert.equals(n, n0)
      assert.same({}, none)
    end)
  end)

  describe("metadata encoding", function()
    it("matches the SDK's worked example", function()
      assert.equals("app%3Dprod%26user%3Dalice%252520smith",
        e2b.encode_metadata{ user = "alice smith", app = "prod" })
    end)

    it("escapes &, =, %, + and non-ASCII three times", function()
      -- encodeURIComponent(form(encodeURIComponent(x)))
      assert.equals("k%3Da%252526b%25253Dc%252525d%25252Be%252520f",
        e2b.encode_metadata{ k = "a&b=c%d+e f" })
      assert.equals("k%3D%2525C3%2525A9", e2b.encode_metadata{ k = "é" })
      assert.equals("a%252526b%3Dv", e2b.encode_metadata{ ["a&b"] = "v" })
    end)

    it("form-encodes what encodeURIComponent keeps but URLSearchParams does not", function()
      assert.equals("k%3Da-_.%2521%257E*%2527%2528%2529", e2b.encode_metadata{ k = "a-_.!~*'()" })
    end)

    it("decodes back to the original with the server's steps", function()
      local function unescape(s, plus)
        if plus then s = s:gsub("+", " ") end
        return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
      end
      local meta = { ["we ird&key="] = "v%al+ue é&=x", plain = "yes" }
      local wire = e2b.encode_metadata(meta)
      local once = unescape(wire)              -- the HTTP framework
      local whole = unescape(once, true)       -- url.QueryUnescape on the whole string
      local got = {}
      for pair in whole:gmatch("[^&]+") do
        local k, v = pair:match("^([^=]*)=([^=]*)$")
        assert.truthy(k, "pair splits in exactly two: " .. pair)
        got[unescape(k, true)] = unescape(v, true)
      end
      assert.same(meta, got)
    end)
  end)

  describe(":create()", function()
    local sb = { templateID = "base", sandboxID = "i0123456789abcdefghij", clientID = "6532622b",
      envdVersion = "0.6.13", envdAccessToken = "tok", alias = "base" }

    it("sends the SDK's body and returns a snake_case sandbox", function()
      push{ status = 201, body = cjson.encode(sb) }
      local s = assert(c:create{ template = "base", timeout = 599.5, metadata = { user = "abc" },
        lifecycle = { on_timeout = "pause", auto_resume = true } })
      local req = last()
      assert.equals("POST", req.method)
      assert.equals("http://api.test/sandboxes", req.url)
      assert.equals(KEY, req.headers["X-API-Key"])
      assert.equals("application/json", req.headers["Content-Type"])
      assert.same({ templateID = "base", timeout = 600, secure = true, allow_internet_access = true,
        metadata = { user = "abc" }, autoPause = true, autoResume = { enabled = true } }, cjson.decode(req.body))
      assert.same({ sandbox_id = sb.sandboxID, template_id = "base", client_id = "6532622b", envd_version = "0.6.13",
        envd_access_token = "tok", alias = "base" }, s)
    end)

    it("sends only what was given (defaults: base, 300 s)", function()
      push{ status = 201, body = cjson.encode(sb) }
      assert(c:create())
      assert.same({ templateID = "base", timeout = 300, secure = true, allow_internet_access = true },
        cjson.decode(last().body))
    end)

    it("maps kill, keep_memory and auto_resume = false", function()
      push{ status = 201, body = cjson.encode(sb) }
      assert(c:create{ lifecycle = { on_timeout = "kill" } })
      assert.equals(false, cjson.decode(last().body).autoPause)
      push{ status = 201, body = cjson.encode(sb) }
      assert(c:create{ lifecycle = { on_timeout = "pause", keep_memory = false, auto_resume = false } })
      local b = cjson.decode(last().body)
      assert.equals(true, b.autoPause)
      assert.equals(false, b.autoPauseMemory)
      assert.same({ enabled = false }, b.autoResume)
      push{ status = 201, body = cjson.encode(sb) }
      assert(c:create{ env_vars = { A = "1" }, secure = false, allow_internet_access = false })
      b = cjson.decode(last().body)
      assert.same({ A = "1" }, b.envVars)
      assert.equals(false, b.secure)
      assert.equals(false, b.allow_internet_access)
    end)

    it("applies the SDK's validation rules without sending", function()
      local n = #fake.requests
      local function bad(lc, want)
        local s, msg, code = c:create{ lifecycle = lc }
        assert.is_nil(s)
        assert.equals("BAD_REQUEST", code)
        assert.truthy(msg:find(want, 1, true), msg)
      end
      bad({ auto_resume = true }, "auto_resume requires on_timeout 'pause'")
      bad({ on_timeout = "kill", auto_resume = true }, "auto_resume requires on_timeout 'pause'")
      bad({ keep_memory = true }, "keep_memory requires on_timeout 'pause'")
      bad({ on_timeout = "pause", keep_memory = false, auto_resume = true }, "keep_memory = false cannot")
      bad({ on_timeout = "sleep" }, "on_timeout must be 'pause' or 'kill'")
      local s, _, code = c:create{ timeout = 0 }
      assert.is_nil(s)
      assert.equals("BAD_REQUEST", code)
      assert.equals(n, #fake.requests)
    end)

    it("raises on misuse", function()
      assert.has_error(function() c:create{ tmpl = "x" } end, "bad argument #1 to 'create' (unknown option 'tmpl')")
      assert.has_error(function() c:create{ metadata = { a = 1 } } end,
        "bad argument #1 to 'create' (option 'metadata': a table of strings to strings expected)")
      assert.has_error(function() c:create{ lifecycle = { on_timeout = "pause", resume = true } } end,
        "bad argument #1 to 'create' (unknown option 'lifecycle.resume')")
      assert.has_error(function() c:create{ timeout = "5" } end,
        "bad argument #1 to 'create' (option 'timeout': number expected, got string)")
    end)

    it("maps errors with status and E2B's message", function()
      push{ status = 429, body = '{"code":429,"message":"Rate limit exceeded"}' }
      local s, msg, code, detail = c:create()
      assert.is_nil(s)
      assert.equals("RATE_LIMITED", code)
      assert.equals("create sandbox: http 429: rate limit exceeded", msg)
      assert.equals(429, detail.status)
      assert.equals("Rate limit exceeded", detail.message)
      for status, want in pairs({ [401] = "AUTH", [403] = "AUTH", [400] = "BAD_REQUEST", [404] = "NOT_FOUND",
        [500] = "HTTP", [502] = "HTTP", [409] = "CONFLICT" }) do
        push{ status = status, body = '{"code":' .. status .. ',"message":"X"}' }
        local _, _, got = c:create()
        assert.equals(want, got)
      end
      push{ error = "timed out", code = "TIMEOUT" }
      local _, m2, c2 = c:create()
      assert.equals("TIMEOUT", c2)
      assert.equals("create sandbox: timed out", m2)
    end)
  end)

  describe(":list()", function()
    local function item(id, meta)
      return { sandboxID = id, templateID = "base", clientID = "6532622b", startedAt = "2026-01-01T00:00:00Z",
        endAt = "2026-01-01T00:05:00Z", cpuCount = 2, memoryMB = 512, diskSizeMB = 1024, state = "running",
        envdVersion = "0.6.13", metadata = meta }
    end

    it("builds the query and follows pages", function()
      push{ body = cjson.encode({ item("a", { t = "x" }), item("b", { t = "x" }) }),
        headers = { ["x-next-token"] = "n1" } }
      push{ body = cjson.encode({ item("c", { t = "x" }) }) }
      local ids = {}
      for it in c:list{ state = { "running", "paused" }, metadata = { t = "x" }, limit = 2, order = "asc" } do
        ids[#ids + 1] = it.sandbox_id
        assert.equals(2, it.cpu_count)
        assert.equals(512, it.memory_mb)
        assert.equals("2026-01-01T00:05:00Z", it.end_at)
      end
      assert.same({ "a", "b", "c" }, ids)
      assert.equals("http://api.test/v2/sandboxes?state=running,paused&metadata=t%3Dx&limit=2&order=asc",
        fake.requests[1].url)
      assert.equals("http://api.test/v2/sandboxes?state=running,paused&metadata=t%3Dx&limit=2&order=asc&nextToken=n1",
        fake.requests[2].url)
    end)

    it("re-checks the metadata filter exactly", function()
      push{ body = cjson.encode({ item("a", { t = "x" }), item("b", { t = "xy" }), item("c") }) }
      local all = assert(c:list_all{ metadata = { t = "x" } })
      assert.equals(1, #all)
      assert.equals("a", all[1].sandbox_id)
    end)

    it("lists without a query when no options are given", function()
      push{ body = "[]" }
      assert.same({}, assert(c:list_all()))
      assert.equals("http://api.test/v2/sandboxes", last().url)
    end)

    it("gives the loop false, msg, code, token on an error", function()
      push{ body = cjson.encode({ item("a") }), headers = { ["x-next-token"] = "n1" } }
      push{ status = 400, body = '{"code":400,"message":"Invalid next token"}' }
      local got = {}
      for it, msg, code, token, detail in c:list{} do
        if it == false then
          got.err = { msg, code, token, detail.status }
        else
          got[#got + 1] = it.sandbox_id
        end
      end
      assert.same({ "a", err = { "list sandboxes: http 400: invalid next token", "BAD_REQUEST", "n1", 400 } }, got)
      push{ error = "refused", code = "TRANSPORT" }
      local items, msg, code = c:list_all()
      assert.is_nil(items)
      assert.equals("TRANSPORT", code)
      assert.equals("list sandboxes: refused", msg)
    end)

    it("says PROTOCOL for a list answer of the wrong shape, never an empty list", function()
      for _, body in ipairs({ "{}", '{"sandboxes":[]}', "[1, 2]", '["a"]', "[{}]", '[{"sandboxID": 7}]',
        '[{"sandboxID":"a"}, null]' }) do
        push{ body = body }
        local items, msg, code = c:list_all()
        assert.is_nil(items, body)
        assert.equals("PROTOCOL", code, body)
        assert.matches("^list sandboxes: ", msg)
      end
      push{ body = "[]" }
      assert.same({}, assert(c:list_all()))
      push{ body = "not json" }
      local _, _, code = c:list_all()
      assert.equals("HTTP", code)
    end)

    it("pages expose the next token", function()
      push{ body = cjson.encode({ item("a") }), headers = { ["x-next-token"] = "n1" } }
      local it = c:list_pages{ limit = 1 }
      local items, used, nxt = it()
      assert.equals(1, #items)
      assert.equals(false, used)
      assert.equals("n1", nxt)
      -- a page resumed from a token: the token is escaped into the query, the retry policy kept
      push{ body = cjson.encode({ item("b") }) }
      it = c:list_pages{ limit = 1, next_token = "a/b+c=" }
      items, used, nxt = it()
      assert.equals("b", items[1].sandbox_id)
      assert.equals("a/b+c=", used)
      assert.is_nil(nxt)
      assert.equals("http://api.test/v2/sandboxes?limit=1&nextToken=a%2Fb%2Bc%3D", last().url)
      assert.equals("GET", last().method)
      assert.is_nil(it())
    end)

    it("raises on misuse", function()
      assert.has_error(function() c:list{ states = "running" } end,
        "bad argument #1 to 'list' (unknown option 'states')")
      assert.has_error(function() c:list{ limit = "10" } end,
        "bad argument #1 to 'list' (option 'limit': number expected, got string)")
      assert.has_error(function() c:list_all{ state = { 1 } } end,
        "bad argument #1 to 'list_all' (option 'state': a list of strings expected)")
    end)
  end)

  describe("info/connect/pause/kill/set_timeout", function()
    local detail = { sandboxID = "iabc", templateID = "base", clientID = "6532622b", startedAt = "s", endAt = "e",
      cpuCount = 2, memoryMB = 512, diskSizeMB = 0, state = "paused", envdVersion = "0.6.13",
      metadata = { a = "b" }, lifecycle = { onTimeout = "pause", autoResume = true }, domain = cjson.null }

    it("info maps the detail and 404", function()
      push{ body = cjson.encode(detail) }
      local d = assert(c:info("iabc"))
      assert.equals("http://api.test/sandboxes/iabc", last().url)
      assert.equals("GET", last().method)
      assert.same({ on_timeout = "pause", auto_resume = true }, d.lifecycle)
      assert.equals("paused", d.state)
      assert.is_nil(d.domain)
      assert.same({ a = "b" }, d.metadata)
      push{ status = 404, body = '{"code":404,"message":"Sandbox \\"iabc\\" doesn\'t exist"}' }
      local n, msg, code, det = c:info("iabc")
      assert.is_nil(n)
      assert.equals("sandbox 'iabc' not found", msg)
      assert.equals("NOT_FOUND", code)
      assert.equals(404, det.status)
    end)

    it("connect tells resumed from running", function()
      push{ status = 201, body = cjson.encode(detail) }
      local sb, resumed = c:connect("iabc", { timeout = 60 })
      assert.equals("iabc", sb.sandbox_id)
      assert.is_true(resumed)
      assert.equals("http://api.test/sandboxes/iabc/connect", last().url)
      assert.same({ timeout = 60 }, cjson.decode(last().body))
      push{ status = 200, body = cjson.encode(detail) }
      local _, resumed2 = c:connect("iabc")
      assert.is_false(resumed2)
      assert.same({ timeout = 300 }, cjson.decode(last().body))
      push{ status = 404, body = "{}" }
      local _, _, code = c:connect("iabc")
      assert.equals("NOT_FOUND", code)
    end)

    it("pause is true, false when already paused, an error when unknown", function()
      push{ status = 204 }
      assert.is_true(c:pause("iabc"))
      assert.same({ memory = true }, cjson.decode(last().body))
      push{ status = 409, body = '{"code":409,"message":"already paused"}' }
      assert.is_false(c:pause("iabc", { memory = false }))
      assert.same({ memory = false }, cjson.decode(last().body))
      push{ status = 404, body = "{}" }
      local ok, _, code = c:pause("iabc")
      assert.is_nil(ok)
      assert.equals("NOT_FOUND", code)
    end)

    it("kill is true, false when gone", function()
      push{ status = 204 }
      assert.is_true(c:kill("iabc"))
      assert.equals("DELETE", last().method)
      push{ status = 404, body = "{}" }
      assert.is_false(c:kill("iabc"))
      push{ status = 500, body = '{"code":500,"message":"boom"}' }
      local ok, msg, code = c:kill("iabc")
      assert.is_nil(ok)
      assert.equals("HTTP", code)
      assert.equals("kill sandbox 'iabc': http 500: boom", msg)
    end)

    it("set_timeout sends whole seconds", function()
      push{ status = 204 }
      assert.is_true(c:set_timeout("iabc", 12.2))
      assert.same({ timeout = 13 }, cjson.decode(last().body))
      assert.equals("http://api.test/sandboxes/iabc/timeout", last().url)
      push{ status = 404, body = "{}" }
      local ok, _, code = c:set_timeout("iabc", 5)
      assert.is_nil(ok)
      assert.equals("NOT_FOUND", code)
    end)

    it("escapes ids in paths and checks arguments", function()
      push{ status = 404, body = "{}" }
      c:info("a/b")
      assert.equals("http://api.test/sandboxes/a%2Fb", last().url)
      assert.has_error(function() c:info() end, "bad argument #1 to 'info' (sandbox id expected, got nil)")
      assert.has_error(function() c:set_timeout("x", -1) end)
      assert.has_error(function() c:pause("x", { keep = true }) end)
    end)
  end)

  describe("snapshots", function()
    it("snapshot posts the name and maps the answer; 404, 409 and a missing id are errors", function()
      push{ status = 201, body = '{"snapshotID":"cp-1:default","names":["cp-1:default"]}' }
      local snap = assert(c:snapshot("iabc", { name = "cp-1" }))
      assert.same({ snapshot_id = "cp-1:default", names = { "cp-1:default" } }, snap)
      assert.equals("POST", last().method)
      assert.equals("http://api.test/sandboxes/iabc/snapshots", last().url)
      assert.same({ name = "cp-1" }, cjson.decode(last().body))
      assert.is_nil(last().retry.idempotent)
      push{ status = 201, body = '{"snapshotID":"t1"}' }
      assert.same({ snapshot_id = "t1", names = {} }, c:snapshot("iabc"))
      assert.same({}, cjson.decode(last().body))
      push{ status = 404, body = "{}" }
      local n, msg, code = c:snapshot("iabc")
      assert.is_nil(n)
      assert.equals("NOT_FOUND", code)
      assert.equals("sandbox 'iabc' not found or not running", msg)
      push{ status = 409, body = '{"code":409,"message":"Sandbox is being snapshotted"}' }
      assert.equals("CONFLICT", select(3, c:snapshot("iabc")))
      push{ status = 201, body = '{"names":[]}' }
      assert.equals("PROTOCOL", select(3, c:snapshot("iabc")))
      push{ fail = { "connection reset", "TRANSPORT", true } }
      local _, tmsg, tcode, det = c:snapshot("iabc")
      assert.equals("TRANSPORT", tcode)
      assert.equals("snapshot sandbox 'iabc': connection reset", tmsg)
      assert.is_true(det.sent)
      assert.has_error(function() c:snapshot("iabc", { label = "x" }) end)
    end)

    it("list_snapshots follows X-Next-Token with the filters", function()
      push{ body = '[{"snapshotID":"b","names":["b:default"]},{"snapshotID":"a"}]',
        headers = { ["x-next-token"] = "T1" } }
      push{ body = '[{"snapshotID":"z"}]' }
      local all = assert(c:list_snapshots{ sandbox_id = "i/1", name = "cp-1", limit = 2 })
      assert.same({ { snapshot_id = "b", names = { "b:default" } }, { snapshot_id = "a", names = {} },
        { snapshot_id = "z", names = {} } }, all)
      assert.equals("http://api.test/snapshots?sandboxID=i%2F1&name=cp-1&limit=2", fake.requests[1].url)
      assert.equals("http://api.test/snapshots?sandboxID=i%2F1&name=cp-1&limit=2&nextToken=T1",
        fake.requests[2].url)
      push{ body = "[]" }
      assert.same({}, c:list_snapshots())
      assert.equals("http://api.test/snapshots", last().url)
      push{ body = '{"snapshotID":"a"}' }
      assert.equals("PROTOCOL", select(3, c:list_snapshots()))
      push{ status = 500, body = '{"message":"boom"}' }
      local n, msg, code = c:list_snapshots()
      assert.is_nil(n)
      assert.equals("HTTP", code)
      assert.equals("list snapshots: http 500: boom", msg)
      assert.has_error(function() c:list_snapshots{ limit = 0 } end)
      assert.has_error(function() c:list_snapshots{ sandboxID = "x" } end)
    end)

    it("delete_snapshot is true, false when gone, an error otherwise", function()
      push{ status = 204 }
      assert.is_true(c:delete_snapshot("cp-1:default"))
      assert.equals("DELETE", last().method)
      assert.equals("http://api.test/templates/cp-1%3Adefault", last().url)
      push{ status = 404, body = "{}" }
      assert.is_false(c:delete_snapshot({ snapshot_id = "x" }))
      push{ status = 500, body = "{}" }
      assert.equals("HTTP", select(3, c:delete_snapshot("x")))
      assert.has_error(function() c:delete_snapshot() end,
        "bad argument #1 to 'delete_snapshot' (snapshot id expected, got nil)")
    end)

    it("create from a snapshot sends its id as the template, with new metadata", function()
      push{ status = 201, body = '{"sandboxID":"i2","templateID":"cp-1:default","clientID":"c"}' }
      local sb = assert(c:create{ template = "cp-1:default", metadata = { conv = "b" } })
      assert.equals("i2", sb.sandbox_id)
      local body = cjson.decode(last().body)
      assert.equals("cp-1:default", body.templateID)
      assert.same({ conv = "b" }, body.metadata)
    end)
  end)

  describe("data plane", function()
    local s
    before_each(function()
      s = c:sandbox({ sandbox_id = "iabc", envd_access_token = "tok" })
    end)

    it("routes with the E2B headers and the access token", function()
      push{ body = "bytes" }
      assert.equals("bytes", s:read_file("/home/user/a b.txt"))
      local req = last()
      assert.equals("http://sb.test/files?path=%2Fhome%2Fuser%2Fa%20b.txt", req.url)
      assert.equals("iabc", req.headers["E2b-Sandbox-Id"])
      assert.equals("49983", req.headers["E2b-Sandbox-Port"])
      assert.equals("tok", req.headers["X-Access-Token"])
      assert.is_nil(req.headers["X-API-Key"])
    end)

    it("maps file errors; 502 is SANDBOX_GONE", function()
      push{ status = 404, body = '{"code":404,"message":"path does not exist"}' }
      local _, _, code = s:read_file("x")
      assert.equals("NOT_FOUND", code)
      push{ status = 502, body = '{"sandboxId":"iabc","message":"The sandbox was not found","code":502}' }
      local r, msg, code2, detail = s:read_file("x")
      assert.is_nil(r)
      assert.equals("SANDBOX_GONE", code2)
      assert.equals(502, detail.status)
      assert.equals("The sandbox was not found", detail.message)
      assert.truthy(msg:find("sandbox was not found", 1, true))
    end)

    it("writes with octet-stream and with multipart", function()
      push{ body = '[{"path":"/home/user/a","name":"a","type":"file"}]' }
      local e = assert(s:write_file("a", "\0data"))
      assert.equals("/home/user/a", e.path)
      assert.equals("application/octet-stream", last().headers["Content-Type"])
      assert.equals("\0data", last().body)
      assert.equals("http://sb.test/files?path=a", last().url)
      push{ body = '[{"path":"/home/user/x","name":"x","type":"file"},'
        .. '{"path":"/home/user/y","name":"y","type":"file"}]' }
      local es = assert(s:write_files{ { path = "x", data = "1" }, { path = "y", data = "2\r\n" } })
      assert.equals(2, #es)
      local req = last()
      assert.equals("http://sb.test/files", req.url)
      local boundary = req.headers["Content-Type"]:match("^multipart/form%-data; boundary=(.+)$")
      assert.truthy(boundary)
      assert.truthy(req.body:find('name="file"; filename="x"\r\nContent-Type: application/octet-stream\r\n\r\n1\r\n',
        1, true))
      assert.truthy(req.body:find("2\r\n\r\n--" .. boundary .. "--\r\n", 1, true))
    end)

    it("calls Filesystem RPCs with Connect unary JSON", function()
      push{ body = '{"entry":{"name":"d","type":"FILE_TYPE_DIRECTORY","path":"/home/user/d","size":"4096"}}' }
      local e = assert(s:stat("/home/user/d"))
      assert.equals("dir", e.type)
      assert.equals(4096, e.size)
      local req = last()
      assert.equals("http://sb.test/filesystem.Filesystem/Stat", req.url)
      assert.equals("application/json", req.headers["Content-Type"])
      assert.equals("1", req.headers["Connect-Protocol-Version"])
      assert.same({ path = "/home/user/d" }, cjson.decode(req.body))
      push{ status = 409, body = '{"code":"already_exists","message":"exists"}' }
      assert.is_false(s:make_dir("d"))
      push{ body = "{}" }
      assert.is_true(s:make_dir("e"))
      push{ body = "{}" }
      assert.same({}, s:list_dir("/empty"))
      assert.same({ path = "/empty", depth = 1 }, cjson.decode(last().body))
      push{ status = 404, body = '{"code":"not_found","message":"no such file"}' }
      local r, _, code, detail = s:stat("nope")
      assert.is_nil(r)
      assert.equals("NOT_FOUND", code)
      assert.equals("not_found", detail.rpc_code)
      push{ body = "{}" }
      assert.is_true(s:remove("x"))
      push{ body = '{"entry":{"name":"b","type":"FILE_TYPE_FILE","path":"/b"}}' }
      assert.equals("/b", s:move("/a", "/b").path)
      assert.same({ source = "/a", destination = "/b" }, cjson.decode(last().body))
    end)

    local function env(flags, t)
      return { cjson.encode(t), flags }
    end
    local function b64(x) return require("warmbox.util").b64_encode(x) end

    it("run_command collects and streams output from Process.Start", function()
      push{ frames = {
        env(0, { event = { start = { pid = 7 } } }),
        env(0, { event = { data = { stdout = b64("hel") } } }),
        env(0, { event = { data = { stderr = b64("warn\n") } } }),
        env(0, { event = { keepalive = {} } }),
        env(0, { event = { data = { stdout = b64("lo\n") } } }),
        env(0, { event = { ["end"] = { exitCode = 3, exited = true, status = "exit status 3" } } }),
        env(2, {}),
      } }
      local seen = {}
      local r = assert(s:run_command("echo hello", { envs = { A = "1" }, cwd = "/tmp", timeout = 5,
        on_stdout = function(t) seen[#seen + 1] = t end }))
      assert.same({ "hel", "lo\n" }, seen)
      assert.equals("hello\n", r.stdout)
      assert.equals("warn\n", r.stderr)
      assert.equals(3, r.exit_code)
      assert.equals(7, r.pid)
      local req = last()
      assert.equals("connect", req.stream)
      assert.equals("application/connect+json", req.headers["Content-Type"])
      assert.equals("5000", req.headers["Connect-Timeout-Ms"])
      local body = req.body
      assert.equals(0, body:byte(1))
      local n = (body:byte(2) << 24) | (body:byte(3) << 16) | (body:byte(4) << 8) | body:byte(5)
      assert.equals(#body - 5, n)
      assert.same({ process = { cmd = "/bin/bash", args = { "-l", "-c", "echo hello" }, envs = { A = "1" },
        cwd = "/tmp" }, stdin = false }, cjson.decode(body:sub(6)))
    end)

    it("run_command: exit code 0 is omitted on the wire", function()
      push{ frames = { env(0, { event = { start = { pid = 1 } } }), env(0, { event = { ["end"] = { exited = true } } }),
        env(2, {}) } }
      assert.equals(0, assert(s:run_command("true")).exit_code)
    end)

    it("run_command: a trailer error maps to a code", function()
      push{ frames = { env(2, { error = { code = "deadline_exceeded", message = "timeout" } }) } }
      local r, _, code = s:run_command("sleep 10")
      assert.is_nil(r)
      assert.equals("TIMEOUT", code)
      push{ frames = { env(2, { error = { code = "unauthenticated", message = "bad user" } }) } }
      local _, _, code2 = s:run_command("x")
      assert.equals("AUTH", code2)
    end)

    it("run_command: a stream broken after output is STREAM_BROKEN", function()
      push{ frames = { env(0, { event = { start = { pid = 1 } } }),
        env(0, { event = { data = { stdout = b64("x") } } }) },
        break_after = true }
      local r, _, code, detail = s:run_command("x")
      assert.is_nil(r)
      assert.equals("STREAM_BROKEN", code)
      assert.equals("x", detail.partial.stdout)
    end)

    local function line(t) return cjson.encode(t) end

    it("run_code streams NDJSON to callbacks and returns everything", function()
      push{ frames = {
        line{ type = "number_of_executions", execution_count = 4 },
        line{ type = "stdout", text = "hi\n", timestamp = "t" },
        line{ type = "keepalive" },
        line{ type = "stderr", text = "w\n", timestamp = "t" },
        line{ type = "result", text = "2", is_main_result = true, extra = {} },
        line{ type = "result", png = "iVBO", is_main_result = false },
        line{ type = "error", name = "ValueError", value = "bad", traceback = "tb" },
        line{ type = "unknown_future_type" },
        '{"type": "end_of_execution"}',
      } }
      local out, results, errs = {}, {}, {}
      local r = assert(s:run_code("print('hi')", { language = "python", env_vars = { A = "1" },
        on_stdout = function(t) out[#out + 1] = t end, on_result = function(x) results[#results + 1] = x end,
        on_error = function(e) errs[#errs + 1] = e end }))
      assert.same({ "hi\n" }, out)
      assert.same({ "hi\n" }, r.stdout)
      assert.same({ "w\n" }, r.stderr)
      assert.equals(4, r.execution_count)
      assert.equals("integer", math.type(r.execution_count)) -- 4, not 4.0 (lua-cjson decodes floats)
      assert.equals(2, #r.results)
      assert.equals("2", r.results[1].text)
      assert.is_true(r.results[1].is_main_result)
      assert.equals("iVBO", r.results[2].png)
      assert.same({ name = "ValueError", value = "bad", traceback = "tb" }, r.error)
      assert.equals(2, #results)
      assert.equals(1, #errs)
      local req = last()
      assert.equals("http://sb.test/execute", req.url)
      assert.equals("49999", req.headers["E2b-Sandbox-Port"])
      assert.equals("lines", req.stream)
      -- the run's timeout travels in the body: the server interrupts the cell then
      assert.same({ code = "print('hi')", language = "python", env_vars = { A = "1" }, timeout = 300 },
        cjson.decode(req.body))
      assert.equals(300 + require("warmbox.e2b.sandbox").EXEC_GRACE, req.timeout)
      -- no status is retried: an intermediary may answer any after forwarding (the session asks the sandbox)
      assert.same({}, req.retry.refused)
      assert.same({}, req.retry.statuses)
      assert.is_nil(req.retry.idempotent)
    end)

    it("run_code decodes lone surrogates and invalid UTF-8 to U+FFFD and keeps unparsable lines", function()
      push{ frames = {
        '{"type": "stdout", "text": "a\\udcff b\\n"}',
        '{"type": "stdout", "text": "' .. "c\255d" .. '"}',
        '{"type": "stdout", "text": "pair \\ud83d\\ude00 and \\\\udcff"}',
        "this is not json",
        '{"type": "error", "name": "ValueError", "value": "bad \\udcff value", "traceback": ["l1", "l2"]}',
        '{"type": "end_of_execution"}',
      } }
      local r = assert(s:run_code("x"))
      assert.same({ "a\xEF\xBF\xBD b\n", "c\xEF\xBF\xBDd", "pair \xF0\x9F\x98\x80 and \\udcff" }, r.stdout)
      assert.same({ "this is not json" }, r.undecoded)
      assert.same({ name = "ValueError", value = "bad \xEF\xBF\xBD value", traceback = "l1\nl2" }, r.error)
      assert.equals(2, r.replaced)
    end)

    it("run_code keeps at most max_output bytes, drops the rest and says so", function()
      local frames = {}
      for i = 1, 10 do frames[i] = line{ type = "stdout", text = "0123456789" } end
      frames[#frames + 1] = { "cut line prefix", 1 }
      frames[#frames + 1] = line{ type = "result", text = "big result" }
      frames[#frames + 1] = line{ type = "result", text = "private", extra = { p = 1 } }
      frames[#frames + 1] = '{"type": "end_of_execution"}'
      push{ frames = frames }
      local seen, private = {}, 0
      local r = assert(s:run_code("x", { max_output = 25, on_stdout = function(t) seen[#seen + 1] = t end,
        is_private = function(res) return res.extra.p == 1 end,
        on_result = function(res) if res.extra.p == 1 then private = private + 1 end end }))
      assert.same({ "0123456789", "0123456789", "01234" }, r.stdout)
      assert.same(r.stdout, seen)
      assert.is_true(r.truncated)
      assert.same({}, r.results)
      assert.equals(1, private)
      -- room for a kernel's cut result (8 MiB) whatever the cap
      assert.equals(9 * 1048576, last().max_frame)
    end)

    it("run_code: an error that ends the run at its timeout is TIMEOUT with started = true", function()
      local now = 0
      package.loaded["warmbox.core"].now = function() now = now + 1 return now end
      push{ frames = { line{ type = "number_of_executions", execution_count = 1 },
        line{ type = "error", name = "KeyboardInterrupt", value = "", traceback = "" },
        '{"type": "end_of_execution"}' } }
      local r, msg, code, detail = s:run_code("x", { timeout = 1 })
      package.loaded["warmbox.core"].now = nil
      assert.is_nil(r)
      assert.equals("TIMEOUT", code)
      assert.matches("timed out", msg)
      assert.is_true(detail.started)
      assert.equals("KeyboardInterrupt", detail.partial.error.name)
    end)

    it("run_code: a run that reached its timeout is TIMEOUT whatever the kernel says of the cell", function()
      -- an interrupt can land where the kernel ends the cell
      -- without an error (an empty, "successful" cell), or with another error
      for _, err in ipairs({ false, { name = "TimeoutError", value = "restarted" } }) do
        local now = 0
        package.loaded["warmbox.core"].now = function() now = now + 1 return now end
        local frames = { line{ type = "number_of_executions", execution_count = 1 } }
        if err then frames[#frames + 1] = line{ type = "error", name = err.name, value = err.value, traceback = "" } end
        frames[#frames + 1] = '{"type": "end_of_execution"}'
        push{ frames = frames }
        local r, _, code, detail = s:run_code("sleep 30", { language = "bash", timeout = 1 })
        package.loaded["warmbox.core"].now = nil
        assert.is_nil(r)
        assert.equals("TIMEOUT", code)
        assert.is_true(detail.started)
      end
      -- the same stream ended before the timeout: a result
      push{ frames = { line{ type = "number_of_executions", execution_count = 1 }, '{"type": "end_of_execution"}' } }
      assert(s:run_code("true", { language = "bash", timeout = 1000 }))
    end)

    it("run_code: a client-side timeout says started whenever the request may have reached the kernel", function()
      -- an answer that trickles (no line yet) is a cell that may run
      push{ frames = {}, fail = { "operation timed out", "TIMEOUT", true } }
      local _, _, code, detail = s:run_code("x", { timeout = 1 })
      assert.equals("TIMEOUT", code)
      assert.is_true(detail.started)
      assert.is_true(detail.sent)
      -- only a request the core knows never left (a connect timeout) did not start
      push{ frames = {}, fail = { "connection timed out", "TIMEOUT", false } }
      _, _, code, detail = s:run_code("x", { timeout = 1 })
      assert.equals("TIMEOUT", code)
      assert.is_false(detail.started)
      assert.is_false(detail.sent)
      push{ frames = { line{ type = "number_of_executions", execution_count = 1 } },
        fail = { "operation timed out", "TIMEOUT" } }
      _, _, code, detail = s:run_code("x", { timeout = 1 })
      assert.equals("TIMEOUT", code)
      assert.is_true(detail.started)
    end)

    it("run_code: a connection that failed before sending says sent = false", function()
      push{ fail = { "couldn't connect", "TRANSPORT", false } }
      local _, _, code, detail = s:run_code("x")
      assert.equals("TRANSPORT", code)
      assert.is_false(detail.sent)
      assert.is_false(detail.started)
      push{ fail = { "empty reply", "TRANSPORT", true } }
      _, _, code, detail = s:run_code("x")
      assert.equals("TRANSPORT", code)
      assert.is_true(detail.sent)
      -- sent: the cell may have started (only the sandbox can tell), no output came
      assert.is_true(detail.started)
      assert.is_false(detail.output_started)
    end)

    it("run_code: a bare status may come after the cell started (an intermediary after forwarding)", function()
      for _, st in ipairs({ 502, 503, 429, 404, 500 }) do
        push{ status = st, body = "no" }
        local r, _, _, detail = s:run_code("1")
        assert.is_nil(r)
        assert.is_true(detail.started)
        assert.is_false(detail.output_started)
        assert.is_true(detail.sent)
      end
    end)

    it("run_code: `fence` goes as X-Warmbox-Fence; a bad one raises", function()
      push{ frames = { '{"type": "end_of_execution"}' } }
      assert(s:run_code("1", { fence = 1234567890123 }))
      assert.equals("1234567890123", last().headers["X-Warmbox-Fence"])
      push{ frames = { '{"type": "end_of_execution"}' } }
      assert(s:run_code("1"))
      assert.is_nil(last().headers["X-Warmbox-Fence"])
      assert.has_error(function() s:run_code("1", { fence = 1.5 }) end,
        "bad argument #2 to 'run_code' (option 'fence': an integer >= 0 expected)")
    end)

    it("run_code: 502 before output is SANDBOX_GONE", function()
      push{ status = 502, body = '{"message":"The sandbox was not found","code":502}' }
      local r, _, code = s:run_code("1")
      assert.is_nil(r)
      assert.equals("SANDBOX_GONE", code)
    end)

    it("run_code: broken after output is STREAM_BROKEN", function()
      push{ frames = { line{ type = "stdout", text = "a" } }, break_after = true }
      local r, _, code, detail = s:run_code("1")
      assert.is_nil(r)
      assert.equals("STREAM_BROKEN", code)
      assert.same({ "a" }, detail.partial.stdout)
      push{ frames = { line{ type = "stdout", text = "a" } } }
      local _, _, code2 = s:run_code("1")
      assert.equals("STREAM_BROKEN", code2)
    end)

    it("run_code: unknown context is NOT_FOUND; misuse raises", function()
      push{ status = 404, body = "Context abc not found" }
      local _, msg, code = s:run_code("1", { context_id = "abc" })
      assert.equals("NOT_FOUND", code)
      assert.truthy(msg:find("context abc not found", 1, true))
      assert.has_error(function() s:run_code("1", { language = "python", context_id = "x" }) end,
        "bad argument #2 to 'run_code' (options 'language' and 'context_id' are mutually exclusive)")
      assert.has_error(function() s:run_code(1) end)
      assert.has_error(function() s:run_code("1", { on_stdout = 1 }) end)
    end)

    it("says PROTOCOL for a data-plane list of the wrong shape (ListDir, contexts, uploads)", function()
      for _, body in ipairs({ '{"entries":"x"}', '{"entries":[1]}', '{"entries":{"a":{}}}', "[]", "oops" }) do
        push{ body = body }
        local r, _, code = s:list_dir("/home/user/output")
        assert.is_nil(r, body)
        assert.equals("PROTOCOL", code, body)
      end
      push{ body = '{"entries":[{"name":"a","type":"FILE_TYPE_FILE","size":"1"}]}' }
      assert.equals("a", assert(s:list_dir("/d"))[1].name)
      for _, body in ipairs({ "{}", "[1]" }) do
        push{ body = body }
        local r, _, code = s:list_contexts()
        assert.is_nil(r, body)
        assert.equals("PROTOCOL", code, body)
        push{ body = body }
        r, _, code = s:write_files{ { path = "a", data = "x" } }
        assert.is_nil(r, body)
        assert.equals("PROTOCOL", code, body)
      end
    end)

    it("contexts", function()
      push{ body = '{"id":"k1","language":"python","cwd":"/home/user"}' }
      assert.same({ id = "k1", language = "python", cwd = "/home/user" }, s:create_context{ language = "python" })
      assert.equals("http://sb.test/contexts", last().url)
      push{ body = '[{"id":"k1","language":"python","cwd":"/home/user"}]' }
      assert.equals("k1", s:list_contexts()[1].id)
      push{ body = "null" }
      assert.is_true(s:restart_context("k1"))
      assert.equals("http://sb.test/contexts/k1/restart", last().url)
      push{ body = "null" }
      assert.is_true(s:delete_context("k1"))
      assert.equals("DELETE", last().method)
      push{ status = 404, body = "Context k2 not found" }
      local ok, _, code = s:delete_context("k2")
      assert.is_nil(ok)
      assert.equals("NOT_FOUND", code)
    end)
  end)
end)

describe("warmbox.e2b environment defaults", function()
  local function run(env, code)
    local cmd = ("env -u E2B_API_KEY -u E2B_API_URL -u E2B_SANDBOX_URL -u E2B_DOMAIN %s lua5.4 -e %q 2>&1"):format(
      env, "package.path = 'lua/?.lua;lua/?/init.lua;' .. package.path; package.cpath = "
        .. ("%q"):format(package.cpath) .. " .. ';' .. package.cpath; " .. code)
    local p = assert(io.popen(cmd))
    local out = p:read("a")
    p:close()
    return (out:gsub("%s+$", ""))
  end

  it("reads E2B_API_KEY, E2B_DOMAIN, E2B_API_URL and E2B_SANDBOX_URL", function()
    local probe = "local c = require('warmbox.e2b').new(); local s = c:sandbox('iabc'); "
      .. "io.write(c.api_url, ' ', s.envd_url, ' ', tostring(c.api_headers['X-API-Key']))"
    assert.equals("https://api.e2b.app https://49983-iabc.e2b.app e2b_1", run("E2B_API_KEY=e2b_1", probe))
    assert.equals("https://api.example.com https://49983-iabc.example.com e2b_1",
      run("E2B_API_KEY=e2b_1 E2B_DOMAIN=example.com", probe))
    assert.equals("http://127.0.0.1:9 http://127.0.0.1:8 e2b_1",
      run("E2B_API_KEY=e2b_1 E2B_API_URL=http://127.0.0.1:9/ E2B_SANDBOX_URL=http://127.0.0.1:8", probe))
    assert.equals("http://x e2b_2", run("E2B_API_KEY=e2b_1 E2B_API_URL=http://y",
      "local c = require('warmbox.e2b').new{ api_key = 'e2b_2', api_url = 'http://x' }; "
        .. "io.write(c.api_url, ' ', c.api_headers['X-API-Key'])"))
  end)

  it("raises without an api key", function()
    local out = run("", "print(pcall(require('warmbox.e2b').new))")
    assert.truthy(out:find("an api_key is required", 1, true), out)
  end)
end)

describe("warmbox.json", function()
  local json = require "warmbox.json"
  it("encodes empty arrays as [] and keeps null", function()
    assert.equals('{"a":[]}', json.encode({ a = json.empty_array() }))
    assert.equals("[[]]", json.encode(json.array({ json.empty_array() })))
    assert.equals("{}", json.encode({}))
    local v = json.decode('{"a":null}')
    assert.is_true(json.is_null(v.a))
    assert.is_nil(json.value(v.a))
    assert.equals("[1,2]", json.encode({ 1, 2 }))
  end)

  it("is a private instance", function()
    local cj = require "cjson"
    local before = cj.encode_sparse_array()
    json.encode({})
    assert.equals(before, cj.encode_sparse_array())
  end)

  it("returns nil, err on invalid input", function()
    local v, err = json.decode("{")
    assert.is_nil(v)
    assert.is_string(err)
    assert.is_nil(json.decode(nil))
  end)
end)
