-- warmboxd's GET /v2/sandboxes: state and metadata filters (decoded exactly
-- as E2B decodes the SDK's three layers), limit, order, cursors, headers.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

-- JS encodeURIComponent.
local function uri_component(s)
  return (s:gsub("[^%w%-_%.!~%*'%(%)]", function(c) return string.format("%%%02X", c:byte()) end))
end

-- URLSearchParams.toString() for one name or value.
local function form(s)
  return (s:gsub("[^%w%*%-%._ ]", function(c) return string.format("%%%02X", c:byte()) end):gsub(" ", "+"))
end

-- The SDK's three layers: pct(k)=pct(v) form-joined, then the query value encoded.
local function sdk_metadata(pairs_list)
  local parts = {}
  for i, kv in ipairs(pairs_list) do
    parts[i] = form(uri_component(kv[1])) .. "=" .. form(uri_component(kv[2]))
  end
  return uri_component(table.concat(parts, "&"))
end

local function create(srv, body) return http.create(srv, body).sandboxID end

local function list(srv, query)
  return http.api(srv, "GET", "/v2/sandboxes" .. (query and ("?" .. query) or ""))
end

local function ids(items)
  local t = {}
  for i, it in ipairs(items) do t[i] = it.sandboxID end
  return t
end

describe("warmboxd GET /v2/sandboxes", function()
  local srv

  lazy_setup(function() srv = wbd.start() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  describe("state filter", function()
    local key, running, paused
    lazy_setup(function()
      srv.api_key = wbd.new_key()
      key = srv.api_key
      running = create(srv, { templateID = "base", timeout = 600 })
      paused = create(srv, { templateID = "base", timeout = 600 })
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. paused .. "/pause", {}).status)
    end)
    before_each(function() srv.api_key = key end)

    it("lists both states when omitted, with X-Total-Running", function()
      local res = list(srv)
      assert.are.equal(200, res.status)
      assert.are.equal(2, #res.json)
      assert.are.equal("1", res.headers["x-total-running"])
      assert.is_nil(res.headers["x-next-token"])
    end)

    it("takes a comma list, also as %2C", function()
      for _, q in ipairs({ "state=running,paused", "state=running%2Cpaused", "state=paused%2Crunning" }) do
        local res = list(srv, q)
        assert.are.equal(2, #res.json, q)
        assert.are.equal("1", res.headers["x-total-running"])
      end
    end)

    it("filters paused only, without X-Total-Running", function()
      local res = list(srv, "state=paused")
      assert.are.same({ paused }, ids(res.json))
      assert.are.equal("paused", res.json[1].state)
      assert.is_nil(res.headers["x-total-running"])
    end)

    it("filters running only", function()
      local res = list(srv, "state=running")
      assert.are.same({ running }, ids(res.json))
      assert.are.equal("1", res.headers["x-total-running"])
    end)

    it("reports a paused item's endAt as the time it paused", function()
      local d = http.api(srv, "GET", "/sandboxes/" .. paused).json
      local item = list(srv, "state=paused").json[1]
      assert.are.equal(d.endAt, item.endAt)
      assert.is_true(item.endAt >= item.startedAt)
      -- ListedSandbox carries no token or lifecycle
      assert.is_nil(item.envdAccessToken)
      assert.is_nil(item.lifecycle)
      for _, f in ipairs({ "templateID", "sandboxID", "clientID", "startedAt", "endAt", "envdVersion" }) do
        assert.is_string(item[f], f)
      end
      for _, f in ipairs({ "cpuCount", "memoryMB", "diskSizeMB" }) do assert.is_number(item[f], f) end
    end)

    it("answers 400 for an unknown state", function()
      local res = list(srv, "state=running,stopped")
      assert.are.equal(400, res.status)
      assert.are.equal(400, res.json.code)
    end)
  end)

  describe("metadata filter", function()
    local key
    local values = {
      plain = "alice",
      space = "alice smith",
      amp = "a&b=c",
      pct = "100%25 sure %",
      plus = "1+1 = 2",
      unicode = "héllo wörld ✓",
      slash = "a/b?c#d",
    }
    local made = {}
    lazy_setup(function()
      srv.api_key = wbd.new_key()
      key = srv.api_key
      for name, v in pairs(values) do
        made[name] = create(srv, { templateID = "base", timeout = 600, metadata = { tag = v, app = "prod" } })
      end
      -- near misses: prefixes and extensions of the values
      create(srv, { templateID = "base", timeout = 600, metadata = { tag = "alice smith jr", app = "prod" } })
      create(srv, { templateID = "base", timeout = 600, metadata = { tag = "alic", app = "prod" } })
      create(srv, { templateID = "base", timeout = 600, metadata = { tag = "alice" } })
    end)
    before_each(function() srv.api_key = key end)

    for name, v in pairs(values) do
      it("matches exactly a value with " .. name, function()
        local res = list(srv, "metadata=" .. sdk_metadata({ { "tag", v }, { "app", "prod" } }))
        assert.are.equal(200, res.status, res.body)
        assert.are.same({ made[name] }, ids(res.json))
        assert.are.same({ tag = v, app = "prod" }, res.json[1].metadata)
      end)
    end

    it("ANDs the pairs", function()
      local res = list(srv, "metadata=" .. sdk_metadata({ { "tag", "alice" } }))
      assert.are.equal(2, #res.json)
      res = list(srv, "metadata=" .. sdk_metadata({ { "tag", "alice" }, { "app", "prod" } }))
      assert.are.same({ made.plain }, ids(res.json))
      res = list(srv, "metadata=" .. sdk_metadata({ { "tag", "alice" }, { "app", "dev" } }))
      assert.are.same({}, res.json)
      res = list(srv, "metadata=" .. sdk_metadata({ { "nokey", "x" } }))
      assert.are.same({}, res.json)
    end)

    -- a pair that is not UTF-8 was dropped from the
    -- filter (json_object_set refuses the key) and a NUL cut it short, both
    -- widening it to every sandbox; such pairs can match nothing.
    it("matches nothing for a key or value that is not UTF-8 or holds a NUL", function()
      for _, q in ipairs({ sdk_metadata({ { "tag\255", "alice" } }), sdk_metadata({ { "tag", "alice\255" } }),
        sdk_metadata({ { "tag", "alice\0x" } }), sdk_metadata({ { "tag\0x", "alice" } }),
        uri_component("tag=alice") .. "%00", "tag%3Dalice%26app%3Dprod%00%26x%3Dy" }) do
        local res = list(srv, "metadata=" .. q)
        assert.are.equal(200, res.status, q)
        assert.are.same({}, res.json, q)
        local v1 = http.api(srv, "GET", "/sandboxes?metadata=" .. q)
        assert.are.equal(200, v1.status, q)
        assert.are.same({}, v1.json, q)
      end
    end)

    it("counts matching running sandboxes in X-Total-Running", function()
      local res = list(srv, "state=running&metadata=" .. sdk_metadata({ { "tag", "alice" } }))
      assert.are.equal("2", res.headers["x-total-running"])
    end)

    it("decodes a one-layer filter as E2B does ('+' is a space)", function()
      local res = list(srv, "metadata=" .. uri_component("tag=alice+smith&app=prod"))
      assert.are.same({ made.space }, ids(res.json))
    end)

    it("answers 400 'Error parsing metadata' for malformed filters", function()
      for _, q in ipairs({ "metadata=", "metadata=" .. uri_component("tag"), "metadata=" .. uri_component("a=b=c"),
        "metadata=" .. uri_component("a=b&c"), "metadata=" .. uri_component("a=%zz") }) do
        local res = list(srv, q)
        assert.are.equal(400, res.status, q)
        assert.are.equal(400, res.json.code)
        assert.matches("^Error parsing metadata", res.json.message)
        -- the deprecated v1 list decodes the same filter the same way
        local v1 = http.api(srv, "GET", "/sandboxes?" .. q)
        assert.are.equal(400, v1.status, q)
        assert.matches("^Error parsing metadata", v1.json.message)
      end
    end)

    it("in loose mode matches by prefix", function()
      local res = http.request{ method = "POST", url = srv.url .. "/_warmboxd/config",
        json = { loose_metadata = true } }
      assert.are.equal(204, res.status)
      local ok, err = pcall(function()
        res = list(srv, "metadata=" .. sdk_metadata({ { "tag", "alic" } }))
        assert.are.equal(5, #res.json)
        res = list(srv, "metadata=" .. sdk_metadata({ { "tag", "alice smith" } }))
        assert.are.equal(2, #res.json)
      end)
      http.request{ method = "POST", url = srv.url .. "/_warmboxd/config", json = { loose_metadata = false } }
      assert(ok, err)
      res = list(srv, "metadata=" .. sdk_metadata({ { "tag", "alic" } }))
      assert.are.equal(1, #res.json)
    end)
  end)

  describe("limit, order and cursors", function()
    local key
    local N = 53
    lazy_setup(function()
      srv.api_key = wbd.new_key()
      key = srv.api_key
      local res = http.api(srv, "POST", "/_warmboxd/seed", { count = N - 3, state = "paused",
        metadata = { seeded = "yes" } })
      assert.are.equal(200, res.status, res.body)
      assert.are.same({ created = N - 3 }, res.json)
      for _ = 1, 3 do create(srv, { templateID = "base", timeout = 600 }) end
    end)
    before_each(function() srv.api_key = key end)

    local function walk(order, limit)
      local seen, all, pages, token = {}, {}, 0, nil
      repeat
        local q = "limit=" .. limit .. (order and ("&order=" .. order) or "")
        if token then q = q .. "&nextToken=" .. uri_component(token) end
        local res = list(srv, q)
        assert.are.equal(200, res.status, res.body)
        pages = pages + 1
        assert.is_true(#res.json <= limit)
        for _, it in ipairs(res.json) do
          assert.is_nil(seen[it.sandboxID], "duplicate " .. it.sandboxID)
          seen[it.sandboxID] = true
          all[#all + 1] = it
        end
        token = res.headers["x-next-token"]
        if token then assert.are.equal(limit, #res.json) end
      until not token
      return all, pages
    end

    local function sorted(all, desc)
      for i = 2, #all do
        local a, b = all[i - 1], all[i]
        if desc then
          assert.is_true(a.startedAt > b.startedAt or (a.startedAt == b.startedAt and a.sandboxID < b.sandboxID))
        else
          assert.is_true(a.startedAt < b.startedAt or (a.startedAt == b.startedAt and a.sandboxID > b.sandboxID))
        end
      end
    end

    it("pages through everything newest first by default, no dupes or misses", function()
      local all, pages = walk(nil, 7)
      assert.are.equal(N, #all)
      assert.are.equal(math.ceil(N / 7), pages)
      sorted(all, true)
      assert.are.equal("running", all[1].state)
      assert.are.equal("paused", all[N].state)
    end)

    it("pages in ascending order as the exact reverse", function()
      local desc = walk("desc", 10)
      local asc = walk("asc", 6)
      assert.are.equal(N, #asc)
      sorted(asc, false)
      for i = 1, N do assert.are.equal(desc[i].sandboxID, asc[N + 1 - i].sandboxID) end
    end)

    it("sets X-Next-Token only when more items exist", function()
      local res = list(srv, "limit=" .. N)
      assert.are.equal(N, #res.json)
      assert.is_nil(res.headers["x-next-token"])
      res = list(srv, "limit=" .. (N - 1))
      assert.is_string(res.headers["x-next-token"])
      res = list(srv, "limit=100")
      assert.are.equal(N, #res.json)
      assert.is_nil(res.headers["x-next-token"])
    end)

    it("mints base64url cursors of '<RFC3339Nano>__<id>' (+ '__asc')", function()
      local res = list(srv, "limit=2")
      local tok = res.headers["x-next-token"]
      assert.matches("^[%w%-_]+=*$", tok)
      assert.are.equal(0, #tok % 4)
      res = list(srv, "limit=2&order=asc")
      assert.matches("^[%w%-_]+=*$", res.headers["x-next-token"])
    end)

    it("answers 400 'Invalid next token' for garbage or the other order's token", function()
      local desc_tok = list(srv, "limit=2").headers["x-next-token"]
      local asc_tok = list(srv, "limit=2&order=asc").headers["x-next-token"]
      for _, q in ipairs({ "nextToken=%21%21%21", "nextToken=abc",
        "nextToken=" .. uri_component(desc_tok) .. "&order=asc",
        "nextToken=" .. uri_component(asc_tok) .. "&order=desc", "nextToken=" .. uri_component(asc_tok) }) do
        local res = list(srv, q)
        assert.are.equal(400, res.status, q)
        assert.are.same({ code = 400, message = "Invalid next token" }, res.json)
      end
    end)

    it("refuses a token whose id is longer than any sandbox id, rather than cutting it", function()
      local util = require "warmbox.util"
      local tok = list(srv, "limit=2").headers["x-next-token"]
      local raw = assert(util.b64_decode((tok:gsub("[-_]", { ["-"] = "+", ["_"] = "/" }))))
      local ts, id = raw:match("^(.-)__([a-z0-9]+)$")
      assert.is_string(id)
      -- 41 characters: it fitted the old 64-byte buffer and was cut to 31 in the walk.
      local long = util.b64_encode(ts .. "__" .. id .. string.rep("z", 20)):gsub("[+/]", { ["+"] = "-", ["/"] = "_" })
      local res = list(srv, "limit=2&nextToken=" .. uri_component(long))
      assert.are.equal(400, res.status)
      assert.are.same({ code = 400, message = "Invalid next token" }, res.json)
      -- The token as minted still pages.
      assert.are.equal(200, list(srv, "limit=2&nextToken=" .. uri_component(tok)).status)
    end)

    it("answers 400 for limit outside 1..100 and a bad order", function()
      for _, q in ipairs({ "limit=0", "limit=101", "limit=-1", "limit=abc", "order=up" }) do
        local res = list(srv, q)
        assert.are.equal(400, res.status, q)
        assert.are.equal(400, res.json.code)
      end
    end)

    it("pages a metadata-filtered listing", function()
      local all, token = {}, nil
      repeat
        local q = "state=paused&limit=9&metadata=" .. sdk_metadata({ { "seeded", "yes" } })
        if token then q = q .. "&nextToken=" .. uri_component(token) end
        local res = list(srv, q)
        assert.are.equal(200, res.status)
        for _, it in ipairs(res.json) do all[#all + 1] = it.sandboxID end
        token = res.headers["x-next-token"]
      until not token
      assert.are.equal(N - 3, #all)
    end)

    it("filters by startedAfter (inclusive) and template", function()
      local all = walk(nil, 100)
      local pivot = all[2].startedAt
      local res = list(srv, "startedAfter=" .. uri_component(pivot))
      assert.are.equal(200, res.status)
      assert.are.equal(2, #res.json)
      assert.are.equal(N, #list(srv, "template=base").json)
      assert.are.equal(0, #list(srv, "template=other").json)
    end)
  end)

  describe("seed", function()
    it("needs an API key", function()
      local res = http.request{ method = "POST", url = srv.url .. "/_warmboxd/seed", json = { count = 5 } }
      assert.are.equal(401, res.status)
    end)

    it("creates running records too", function()
      srv.api_key = wbd.new_key()
      local res = http.api(srv, "POST", "/_warmboxd/seed", { count = 5, state = "running", timeout = 600 })
      assert.are.equal(200, res.status)
      res = list(srv, "state=running")
      assert.are.equal(5, #res.json)
      assert.are.equal("5", res.headers["x-total-running"])
      assert.are.equal(400, http.api(srv, "POST", "/_warmboxd/seed", { count = 0 }).status)
      assert.are.equal(400, http.api(srv, "POST", "/_warmboxd/seed", { count = 1, state = "gone" }).status)
    end)

    it("backdates records and sets their lifecycle", function()
      srv.api_key = wbd.new_key()
      local res = http.api(srv, "POST", "/_warmboxd/seed", { count = 2, state = "paused", started_ago_s = 86400 * 3,
        paused_ago_s = 86400 * 2, autoPause = true, autoResume = true })
      assert.are.equal(200, res.status, res.body)
      local items = list(srv).json
      assert.are.equal(2, #items)
      local d = http.api(srv, "GET", "/sandboxes/" .. items[1].sandboxID).json
      assert.are.same({ autoResume = true, onTimeout = "pause" }, d.lifecycle)
      local y, mo, day = d.endAt:match("^(%d+)-(%d+)-(%d+)T")
      local ended = os.time{ year = tonumber(y), month = tonumber(mo), day = tonumber(day), hour = 12 }
      local days = (os.time() - ended) / 86400
      assert.is_true(days > 1 and days < 3, tostring(days))
      assert.is_true(items[1].startedAt < items[1].endAt)
      assert.are.equal(400, http.api(srv, "POST", "/_warmboxd/seed", { count = 1, started_ago_s = 5,
        paused_ago_s = 10 }).status)
    end)
  end)
end)
