-- warmboxd's lifecycle events over real HTTP, as E2B's API serves them:
-- GET /events/sandboxes[/{id}] with the schema of infra's SandboxEvent
-- (packages/shared/pkg/events/sandbox.go, as the API writes it: camelCase),
-- E2B's paging (offset, limit, orderAsc, types), the retention, a restart on
-- the data directory; webhooks signed as E2B signs them, retried, sometimes
-- delivered twice, to loopback URLs only.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cjson = require "cjson.safe"

-- infra's SandboxEvent's JSON fields, camelCase as the API answers
-- (events_ttl_days is omitempty and internal: never served).
local SCHEMA = { "id", "version", "type", "timestamp", "eventCategory", "eventLabel", "eventData", "sandboxId",
  "sandboxExecutionId", "sandboxTemplateId", "sandboxBuildId", "sandboxTeamId" }
local UUID = "^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"

local function events(srv, query, key)
  local res = http.request{ url = srv.url .. "/events/sandboxes" .. (query or ""),
    headers = { ["X-API-Key"] = key or srv.api_key } }
  return res
end

local function all_asc(srv, sid)
  local res = events(srv, (sid and "/" .. sid or "") .. "?orderAsc=true&limit=100")
  assert.are.equal(200, res.status, res.body)
  return res.json
end

local function types_of(list)
  local t = {}
  for i, e in ipairs(list) do t[i] = e.type:gsub("^sandbox%.lifecycle%.", "") end
  return t
end

-- A webhook receiver (spec/helpers/webhook_sink.py) on a loopback port.
local function sink(secret, fail_first)
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p " .. dir)
  local out = dir .. "/out"
  local p = io.popen(("env -u LD_PRELOAD python3 %s/spec/helpers/webhook_sink.py %s %s %d >%s 2>&1 & echo $!"):format(
    wbd.root(), wbd.sh_quote(dir .. "/log"), wbd.sh_quote(secret), fail_first or 0, wbd.sh_quote(out)))
  local pid = tonumber(p:read("l"))
  p:close()
  local port = wbd.eventually(function() return (wbd.read_all(out) or ""):match("listening (%d+)") end)
  assert(port, "the webhook sink did not start")
  local s = { pid = pid, url = "http://127.0.0.1:" .. port .. "/hook", dir = dir }
  function s.received()
    local got = {}
    for line in (wbd.read_all(dir .. "/log") or ""):gmatch("[^\n]+") do got[#got + 1] = cjson.decode(line) end
    return got
  end
  function s.stop() os.execute("kill " .. pid .. "; rm -rf " .. wbd.sh_quote(dir)) end
  return s
end

describe("warmboxd lifecycle events", function()
  local srv

  lazy_setup(function() srv = wbd.start{ args = { "--rtt-ms", "0" } } end)
  lazy_teardown(function() srv:stop() end)

  it("records create, pause, resume, update, checkpoint and kill with E2B's schema", function()
    local sb = http.create_interp(srv, { metadata = { warmboxSessionId = "wb1.x.conv" } })
    local id = sb.sandboxID
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/pause").status)
    assert.are.equal(201, http.api(srv, "POST", "/sandboxes/" .. id .. "/connect", { timeout = 60 }).status)
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/timeout", { timeout = 120 }).status)
    assert.are.equal(201, http.api(srv, "POST", "/sandboxes/" .. id .. "/snapshots", {}).status)
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. id).status)
    local list = all_asc(srv, id)
    assert.are.same({ "created", "paused", "resumed", "updated", "checkpointed", "killed" }, types_of(list))
    local seen_ids = {}
    for _, e in ipairs(list) do
      local want = {}
      for _, f in ipairs(SCHEMA) do want[f] = true end
      if e.type:match("checkpointed") then want.eventCategory, want.eventLabel = nil, nil end
      for k in pairs(e) do assert.is_true(want[k] ~= nil, "a field outside E2B's schema: " .. k) end
      for k in pairs(want) do assert.is_not_nil(e[k], "missing " .. k .. " on " .. e.type) end
      assert.are.equal("v2", e.version)
      assert.matches(UUID, e.id)
      assert.is_nil(seen_ids[e.id])
      seen_ids[e.id] = true
      for _, f in ipairs{ "sandboxExecutionId", "sandboxBuildId", "sandboxTeamId" } do assert.matches(UUID, e[f]) end
      assert.are.equal(id, e.sandboxId)
      assert.are.equal("code-interpreter-v1", e.sandboxTemplateId)
      assert.are.equal("wb1.x.conv", e.eventData.sandbox_metadata.warmboxSessionId)
      wbd.utc(e.timestamp)
    end
    assert.are.equal("lifecycle", list[2].eventCategory)
    assert.are.equal("pause", list[2].eventLabel)
    -- pause and kill carry the execution that ended; a resume starts a new one
    for _, i in ipairs{ 2, 6 } do
      local x = list[i].eventData.execution
      assert.are.same({ "execution_time", "memory_mb", "started_at", "vcpu_count" },
        (function() local k = {} for n in pairs(x) do k[#k + 1] = n end table.sort(k) return k end)())
      assert.are.equal(2, x.vcpu_count)
      assert.are.equal(2048, x.memory_mb)
      assert.is_true(x.execution_time == math.floor(x.execution_time) and x.execution_time >= 0)
      assert.matches("^%d+%-%d+%-%d+T%d+:%d+:%d+Z$", x.started_at)
    end
    assert.are.equal(list[1].sandboxExecutionId, list[2].sandboxExecutionId)
    assert.are_not.equal(list[2].sandboxExecutionId, list[3].sandboxExecutionId)
    assert.are.equal(list[3].sandboxExecutionId, list[6].sandboxExecutionId)
    assert.is_nil(list[3].eventData.execution)
    assert.is_string(list[4].eventData.set_timeout)
  end)

  it("bills a lease that ran out up to its end, whatever the clock jumped past it", function()
    local sb = http.create_interp(srv, { timeout = 30, autoPause = true })
    srv:advance(3600)
    local list = all_asc(srv, sb.sandboxID)
    assert.are.same({ "created", "paused" }, types_of(list))
    local ms = list[2].eventData.execution.execution_time
    assert.is_true(ms >= 29000 and ms <= 31000, tostring(ms))
    assert.is_true(wbd.utc(list[2].timestamp) - wbd.utc(list[1].timestamp) < 31)
  end)

  it("pages as E2B does: newest first by default, offset, limit, orderAsc, types, per sandbox, per team", function()
    local ids = {}
    for i = 1, 12 do ids[i] = http.create(srv, { templateID = "base", timeout = 600 }).sandboxID end
    local newest = events(srv)
    assert.are.equal(200, newest.status)
    assert.are.equal(10, #newest.json)                     -- default limit
    assert.are.equal(ids[12], newest.json[1].sandboxId)    -- newest first
    assert.are.equal(ids[3], newest.json[10].sandboxId)
    local second = events(srv, "?offset=10&limit=2").json
    assert.are.same({ ids[2], ids[1] }, { second[1].sandboxId, second[2].sandboxId })
    local asc = events(srv, "?orderAsc=true&limit=100").json
    for i = 2, #asc do assert.is_true(asc[i - 1].timestamp <= asc[i].timestamp) end
    local kills = events(srv, "?types=sandbox.lifecycle.paused&types=sandbox.lifecycle.killed&limit=100").json
    assert.is_true(#kills > 0)
    for _, e in ipairs(kills) do
      assert.is_true(e.type == "sandbox.lifecycle.paused" or e.type == "sandbox.lifecycle.killed", e.type)
    end
    assert.are.equal(1, #events(srv, "/" .. ids[5]).json)
    for _, q in ipairs{ "?limit=0", "?limit=101", "?offset=-1", "?orderAsc=maybe", "?types=sandbox.lifecycle.nope" } do
      assert.are.equal(400, events(srv, q).status, q)
    end
    assert.are.equal(401, events(srv, "", "nope").status)
    -- another team sees none of them
    local other = wbd.new_key()
    assert.are.same({}, events(srv, "?limit=100", other).json)
    assert.are.same({}, events(srv, "/" .. ids[5], other).json)
  end)

  it("keeps events across a restart on the data directory, for the retention", function()
    local sb = http.create(srv, { templateID = "base", timeout = 600, autoPause = true })
    local before = all_asc(srv, sb.sandboxID)
    assert.are.same({ "created" }, types_of(before))
    local key = srv.api_key
    assert.is_true(srv:kill("TERM"))          -- a graceful stop pauses what pauses at its timeout
    srv = wbd.start{ dir = srv.dir, api_key = key, args = { "--rtt-ms", "0" } }
    local after = all_asc(srv, sb.sandboxID)
    assert.are.same({ "created", "paused" }, types_of(after))
    assert.are.equal(before[1].id, after[1].id)
    -- E2B keeps events 7 days
    srv:advance(8 * 86400)
    assert.are.same({}, all_asc(srv, sb.sandboxID))
  end)
end)

describe("warmboxd lifecycle webhooks", function()
  local srv

  lazy_setup(function() srv = wbd.start{ args = { "--rtt-ms", "0" } } end)
  lazy_teardown(function() srv:stop() end)

  local function register(url, extra)
    local body = { name = "hook", url = url, enabled = true, signatureSecret = "s3cret",
      events = { "sandbox.lifecycle.created", "sandbox.lifecycle.killed" } }
    for k, v in pairs(extra or {}) do body[k] = v end
    return http.api(srv, "POST", "/events/webhooks", body)
  end

  it("registers loopback URLs only, and lists, reads, updates and deletes them", function()
    for _, url in ipairs{ "http://10.0.0.1/x", "http://example.com/x", "ftp://127.0.0.1/x", "not a url" } do
      assert.are.equal(400, register(url).status, url)
    end
    assert.are.equal(400, register("http://127.0.0.1:9/x", { events = { "nope" } }).status)
    local res = register("http://127.0.0.1:9/x")
    assert.are.equal(201, res.status, res.body)
    local w = res.json
    assert.matches(UUID, w.id)
    assert.matches(UUID, w.teamID)
    assert.is_nil(w.signatureSecret)
    assert.are.same({ "sandbox.lifecycle.created", "sandbox.lifecycle.killed" }, w.events)
    assert.are.equal(1, #http.api(srv, "GET", "/events/webhooks").json)
    local p = http.api(srv, "PATCH", "/events/webhooks/" .. w.id, { enabled = false })
    assert.are.equal(200, p.status)
    assert.is_false(p.json.enabled)
    assert.are.equal("http://127.0.0.1:9/x", http.api(srv, "GET", "/events/webhooks/" .. w.id).json.url)
    local other = http.request{ url = srv.url .. "/events/webhooks/" .. w.id,
      headers = { ["X-API-Key"] = wbd.new_key() } }
    assert.are.equal(404, other.status)
    assert.are.equal(200, http.api(srv, "DELETE", "/events/webhooks/" .. w.id).status)
    assert.are.equal(404, http.api(srv, "GET", "/events/webhooks/" .. w.id).status)
  end)

  it("delivers signed events, retries a failed delivery and sometimes delivers twice", function()
    srv:config{ webhook_retry_ms = 100 }
    local s = sink("s3cret", 2)
    finally(s.stop)
    local w = register(s.url).json
    local sb = http.create(srv, { templateID = "base", timeout = 600 })
    -- two 500s, then the third attempt of the same event succeeds
    local got = wbd.eventually(function() local g = s.received() return #g >= 3 and g end)
    assert.are.equal(3, #got)
    local ids, deliveries = {}, {}
    for _, r in ipairs(got) do
      assert.is_true(r.valid, "a bad e2b-signature")
      assert.are.equal("v1", r.headers["e2b-signature-version"])
      assert.are.equal(w.id, r.headers["e2b-webhook-id"])
      local e = cjson.decode(r.body)
      ids[e.id] = true
      deliveries[r.headers["e2b-delivery-id"]] = true
      assert.are.equal(sb.sandboxID, e.sandboxId)
      assert.are.equal("sandbox.lifecycle.created", e.type)
    end
    assert.are.same({ 500, 500, 200 }, { got[1].status, got[2].status, got[3].status })
    assert.are.equal(1, (function() local n = 0 for _ in pairs(ids) do n = n + 1 end return n end)())
    assert.are.equal(3, (function() local n = 0 for _ in pairs(deliveries) do n = n + 1 end return n end)())
    -- the body delivered is the event the API serves
    assert.are.same(all_asc(srv, sb.sandboxID)[1], cjson.decode(got[3].body))
    -- a type the webhook did not ask for is not sent; a duplicate is the same event again
    srv:config{ webhook_duplicates = true }
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause").status)
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
    wbd.eventually(function() return #s.received() >= 5 end)
    wbd.sleep(0.3)   -- nothing more comes: the paused event was not asked for
    got = s.received()
    assert.are.equal(5, #got)
    local a, b = cjson.decode(got[4].body), cjson.decode(got[5].body)
    assert.are.equal("sandbox.lifecycle.killed", a.type)
    assert.are.equal(a.id, b.id)
    assert.are_not.equal(got[4].headers["e2b-delivery-id"], got[5].headers["e2b-delivery-id"])
    assert.is_true(got[5].valid)
  end)
end)
