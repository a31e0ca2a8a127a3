-- warmboxd's sandbox metrics over real HTTP, in E2B's shapes (spec/openapi.yml
-- of e2b-dev/E2B): GET /sandboxes/{id}/metrics?start&end -> SandboxMetric[],
-- GET /sandboxes/metrics?sandbox_ids=a,b -> {"sandboxes": {id: SandboxMetric}},
-- read from the jail's cgroups and disk; and envd's own GET /metrics, of the same.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local nd = require "spec.helpers.ndjson"

local FIELDS = { "timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "memCache",
  "diskUsed", "diskTotal" }

describe("warmboxd metrics", function()
  local srv, sb, as_root

  local function metrics(id, query) return http.api(srv, "GET", "/sandboxes/" .. id .. "/metrics" .. (query or "")) end

  local function py(box, code)
    local res = http.sandbox(srv, box, 49999, "POST", "/execute", { json = { code = code }, timeout = 120 })
    assert.are.equal(200, res.status, res.body)
    assert.is_nil(nd.error_in(res.body), res.body)
  end

  lazy_setup(function()
    srv = wbd.start{}
    as_root = wbd.read_all("/proc/self/status"):match("\nUid:%s+0%s") ~= nil
    sb = http.create_interp(srv)
    -- CPU for a second (measured CPU time, not a timed assertion), 100 MB
    -- held, 20 MB written to the home
    py(sb, "import time\nt = time.process_time()\nwhile time.process_time() - t < 1: pass\n"
      .. "held = bytearray(100 << 20)\nopen('/home/user/f', 'wb').write(b'a' * (20 << 20))")
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("answers a SandboxMetric series from the jail: its size, CPU used, memory held, disk written", function()
    local res = metrics(sb.sandboxID)
    assert.are.equal(200, res.status, res.body)
    assert.are.equal(1, #res.json)
    local m = res.json[1]
    for _, f in ipairs(FIELDS) do assert.is_not_nil(m[f], f) end
    assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d+Z$", m.timestamp)
    assert.are.equal(math.floor(wbd.utc(m.timestamp)), m.timestampUnix)
    assert.are.same({ 2, 2048 * 1024 * 1024 }, { m.cpuCount, m.memTotal })
    if not as_root then return end   -- no cgroups or disk tmpfs without root: those read 0
    assert.is_true(m.cpuUsedPct > 0, tostring(m.cpuUsedPct))
    assert.is_true(m.cpuUsedPct <= 100, tostring(m.cpuUsedPct))
    assert.is_true(m.memUsed >= 100 * 1024 * 1024, tostring(m.memUsed))
    assert.is_true(m.memUsed <= m.memTotal)
    assert.is_true(m.diskUsed >= 20 * 1024 * 1024, tostring(m.diskUsed))
    assert.are.equal(1024 * 1024 * 1024, m.diskTotal)
  end)

  it("keeps a sample per second asked, and start/end (Unix seconds) select from them", function()
    local first = metrics(sb.sandboxID).json
    srv:advance(5)
    local series = metrics(sb.sandboxID).json
    assert.are.equal(#first + 1, #series)
    local t0, t1 = math.tointeger(series[1].timestampUnix), math.tointeger(series[#series].timestampUnix)
    assert.is_true(t1 >= t0 + 5)
    -- A query takes a sample of its own when its second is a new one (under
    -- load a second boundary may pass between two queries): one is made to
    -- pass here, so start=t1 gives t1's sample, then the query's own, newer.
    srv:advance(1)
    local tail = metrics(sb.sandboxID, "?start=" .. t1).json
    assert.are.equal(2, #tail)
    assert.are.same(series[#series], tail[1])
    assert.is_true(tail[2].timestampUnix > t1)
    local early = metrics(sb.sandboxID, "?start=" .. t0 .. "&end=" .. (t1 - 1)).json
    assert.are.equal(#series - 1, #early)
    assert.are.same({}, metrics(sb.sandboxID, "?start=0&end=" .. (t0 - 3600)).json)
  end)

  it("gives a base sandbox its own size, and a paused one its history without new samples", function()
    local base = http.create(srv, { templateID = "base", timeout = 300 })
    local before = metrics(base.sandboxID).json
    assert.are.same({ 2, 512 * 1024 * 1024 }, { before[1].cpuCount, before[1].memTotal })
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. base.sandboxID .. "/pause", {}).status)
    srv:advance(2)
    assert.are.same(before, metrics(base.sandboxID).json)
    local many = http.api(srv, "GET", "/sandboxes/metrics?sandbox_ids=" .. base.sandboxID .. "," .. sb.sandboxID)
    assert.are.equal(200, many.status, many.body)
    assert.is_nil(many.json.sandboxes[base.sandboxID])
  end)

  it("GET /sandboxes/metrics gives each running sandbox of the team its newest sample", function()
    local other = http.create_interp(srv)
    local res = http.api(srv, "GET", "/sandboxes/metrics?sandbox_ids=" .. sb.sandboxID .. "," .. other.sandboxID
      .. ",iunknown00000000000")
    assert.are.equal(200, res.status, res.body)
    local got = res.json.sandboxes
    assert.are.same({ [other.sandboxID] = true, [sb.sandboxID] = true },
      { [other.sandboxID] = got[other.sandboxID] ~= nil, [sb.sandboxID] = got[sb.sandboxID] ~= nil })
    for _, f in ipairs(FIELDS) do assert.is_not_nil(got[sb.sandboxID][f], f) end
    assert.are.same({ 2, 2048 * 1024 * 1024 }, { got[sb.sandboxID].cpuCount, got[sb.sandboxID].memTotal })
    -- it is the series' newest (taken then), the series' next one is of that second or later
    local series = metrics(sb.sandboxID).json
    assert.is_true(series[#series].timestampUnix >= got[sb.sandboxID].timestampUnix)
    -- another team sees nothing of them
    local stranger = { url = srv.url, api_key = wbd.new_key() }
    res = http.api(stranger, "GET", "/sandboxes/metrics?sandbox_ids=" .. sb.sandboxID)
    assert.are.same({ sandboxes = {} }, res.json)
    assert.are.equal(404, http.api(stranger, "GET", "/sandboxes/" .. sb.sandboxID .. "/metrics").status)
  end)

  it("refuses bad queries: 400 for start/end that are not Unix seconds, sandbox_ids missing or over 100; "
    .. "404 for an unknown sandbox", function()
    assert.are.equal(400, metrics(sb.sandboxID, "?start=yesterday").status)
    assert.are.equal(400, metrics(sb.sandboxID, "?end=-1").status)
    assert.are.equal(400, http.api(srv, "GET", "/sandboxes/metrics").status)
    local ids = {}
    for i = 1, 101 do ids[i] = "i" .. i end
    assert.are.equal(400, http.api(srv, "GET", "/sandboxes/metrics?sandbox_ids=" .. table.concat(ids, ",")).status)
    assert.are.equal(404, metrics("iunknown00000000000").status)
  end)

  it("envd's own GET /metrics (port 49983) reports the sandbox, not the host", function()
    local res = http.sandbox(srv, sb, 49983, "GET", "/metrics")
    assert.are.equal(200, res.status, res.body)
    local m = res.json
    for _, f in ipairs({ "ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "mem_cache", "mem_total_mib",
      "mem_used_mib", "disk_used", "disk_total" }) do
      assert.is_not_nil(m[f], f)
    end
    -- one of the sandbox's samples (warmboxd's clock)
    local series = metrics(sb.sandboxID).json
    assert.is_true(math.abs(m.ts - series[#series].timestampUnix) <= 2, tostring(m.ts))
    -- the template's size (2 vCPU, 2048 MiB), whatever the host has
    assert.are.same({ 2, 2048 * 1024 * 1024, 2048 }, { m.cpu_count, m.mem_total, m.mem_total_mib })
    assert.are.equal(m.mem_used >> 20, m.mem_used_mib)
    -- envd checks the access token of a secure sandbox here, as on every route but /health and /files
    local bare = { sandboxID = sb.sandboxID }
    assert.are.equal(401, http.sandbox(srv, bare, 49983, "GET", "/metrics").status)
    if not as_root then return end   -- no cgroups or disk tmpfs without root: those read 0
    -- the jail's memory group (the 100 MB the kernel holds) and disk tmpfs (the 20 MB file)
    assert.is_true(m.mem_used >= 100 * 1024 * 1024 and m.mem_used <= m.mem_total, tostring(m.mem_used))
    assert.is_true(m.disk_used >= 20 * 1024 * 1024, tostring(m.disk_used))
    assert.are.equal(1024 * 1024 * 1024, m.disk_total)
  end)
end)
