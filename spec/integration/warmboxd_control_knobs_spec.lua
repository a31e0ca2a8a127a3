-- warmboxd's lifecycle (lease expiry, auto-resume through the data-plane
-- router, --max-running), its knobs (stats, faults, config) and its exit.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local create = http.create

local function info(srv, id)
  return http.api(srv, "GET", "/sandboxes/" .. id)
end

local function knob(srv, method, path, json)
  return http.request{ method = method, url = srv.url .. "/_warmboxd" .. path, json = json }
end

local eventually = wbd.eventually

local ts = wbd.utc

-- the data-plane request used to poke a sandbox (envd's health check)
local function poke(srv, sb, how)
  if how == "host" then
    return http.request{ url = srv.url .. "/health",
      headers = { Host = "49983-" .. sb.sandboxID .. ".localhost:" .. srv.port } }
  end
  return http.sandbox(srv, sb, 49983, "GET", "/health")
end

describe("warmboxd lifecycle", function()
  local srv
  lazy_setup(function() srv = wbd.start() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  it("kills a sandbox when its lease expires", function()
    local sb = create(srv, { templateID = "base", timeout = 1 })
    assert.is_truthy(eventually(function() return info(srv, sb.sandboxID).status == 404 end))
    assert.are.equal(404, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
  end)

  it("pauses an autoPause sandbox when its lease expires, and pauses it again after a resume", function()
    local sb = create(srv, { templateID = "base", timeout = 1, autoPause = true })
    local id = sb.sandboxID
    assert.is_truthy(eventually(function() return info(srv, id).json.state == "paused" end))
    local res = http.api(srv, "POST", "/sandboxes/" .. id .. "/connect", { timeout = 1 })
    assert.are.equal(201, res.status)
    assert.is_truthy(eventually(function() return info(srv, id).json.state == "paused" end))
    assert.are.same({ autoResume = false, onTimeout = "pause" }, info(srv, id).json.lifecycle)
  end)

  describe("data-plane routing", function()
    it("answers 502 'The sandbox was not found' for an unknown sandbox, by headers or Host", function()
      local ghost = { sandboxID = "inotthereatall0000000" }
      for _, how in ipairs({ "headers", "host" }) do
        local res = poke(srv, ghost, how)
        assert.are.equal(502, res.status, how)
        assert.are.same({ sandboxId = ghost.sandboxID, message = "The sandbox was not found", code = 502 }, res.json)
      end
    end)

    it("routes a running sandbox's traffic to the data plane", function()
      local sb = create(srv, { templateID = "base", timeout = 600, secure = true })
      for _, how in ipairs({ "headers", "host" }) do
        local res = poke(srv, sb, how)
        assert.are_not.equal(502, res.status, how)
        assert.is_true(res.status >= 200 and res.status < 300, res.status .. " " .. res.body)
      end
    end)

    it("answers 502 for a killed sandbox and for a paused one without autoResume", function()
      local sb = create(srv, { templateID = "base", timeout = 600, autoPause = true })
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {}).status)
      local res = poke(srv, sb)
      assert.are.equal(502, res.status)
      assert.are.equal("The sandbox was not found", res.json.message)
      assert.are.equal("paused", info(srv, sb.sandboxID).json.state)
      assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
      assert.are.equal(502, poke(srv, sb).status)
    end)

    it("auto-resumes a paused autoResume sandbox with a lease of at least 300 s", function()
      local sb = create(srv, { templateID = "base", timeout = 10, autoPause = true, autoResume = { enabled = true } })
      local id = sb.sandboxID
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/pause", {}).status)
      local res = poke(srv, sb, "host")
      assert.are_not.equal(502, res.status)
      local d = info(srv, id).json
      assert.are.equal("running", d.state)
      assert.are.equal(300, math.floor(ts(d.endAt) - ts(d.startedAt) + 0.5))
    end)

    it("answers 502 for a filesystem-only snapshot even with autoResume", function()
      local sb = create(srv, { templateID = "base", timeout = 600, autoPause = true, autoResume = { enabled = true } })
      local id = sb.sandboxID
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. id .. "/pause", { memory = false }).status)
      assert.are.equal(502, poke(srv, sb).status)
      assert.are.equal("paused", info(srv, id).json.state)
      -- an explicit connect still resumes it
      assert.are.equal(201, http.api(srv, "POST", "/sandboxes/" .. id .. "/connect", { timeout = 60 }).status)
      assert.are_not.equal(502, poke(srv, sb).status)
    end)
  end)
end)

describe("warmboxd --max-running", function()
  local srv
  lazy_setup(function() srv = wbd.start{ args = { "--max-running", "2" } } end)
  lazy_teardown(function() if srv then srv:stop() end end)

  local msg = "you have reached the maximum number of concurrent E2B sandboxes (2). "
    .. "If you need more, please visit 'https://e2b.dev/docs/billing'"

  it("answers 429 on create, connect, resume and auto-resume beyond N running", function()
    local a = create(srv, { templateID = "base", timeout = 600, autoPause = true, autoResume = { enabled = true } })
    create(srv, { templateID = "base", timeout = 600 })
    local res = http.api(srv, "POST", "/v2/sandboxes", { templateID = "base" })
    assert.are.equal(429, res.status)
    assert.are.same({ code = 429, message = msg }, res.json)
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. a.sandboxID .. "/pause", {}).status)
    local c = create(srv, { templateID = "base", timeout = 600 })
    res = http.api(srv, "POST", "/sandboxes/" .. a.sandboxID .. "/connect", { timeout = 60 })
    assert.are.equal(429, res.status)
    assert.are.equal(msg, res.json.message)
    assert.are.equal(429, http.api(srv, "POST", "/sandboxes/" .. a.sandboxID .. "/resume", { timeout = 60 }).status)
    assert.are.equal(429, http.sandbox(srv, a, 49983, "GET", "/health").status)
    assert.are.equal("paused", info(srv, a.sandboxID).json.state)
    -- another team has its own cap
    local other = { url = srv.url, api_key = wbd.new_key() }
    assert.are.equal(201, http.api(other, "POST", "/sandboxes", { templateID = "base" }).status)
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. c.sandboxID).status)
    assert.are.equal(201, http.api(srv, "POST", "/sandboxes/" .. a.sandboxID .. "/connect", { timeout = 60 }).status)
  end)
end)

describe("warmboxd knobs", function()
  local srv
  lazy_setup(function() srv = wbd.start() end)
  lazy_teardown(function() if srv then srv:stop() end end)
  before_each(function()
    assert.are.equal(204, knob(srv, "DELETE", "/faults").status)
    assert.are.equal(204, knob(srv, "POST", "/stats/reset").status)
  end)

  describe("stats", function()
    it("counts requests per route and in total, not knob calls", function()
      local sb = create(srv)
      http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID)
      http.api(srv, "GET", "/sandboxes/" .. sb.sandboxID)
      http.api(srv, "GET", "/v2/sandboxes?limit=5")
      http.sandbox(srv, sb, 49983, "GET", "/health")
      knob(srv, "GET", "/stats")
      local st = knob(srv, "GET", "/stats").json
      assert.are.equal(1, st.requests["POST /sandboxes"])
      assert.are.equal(2, st.requests["GET /sandboxes/{id}"])
      assert.are.equal(1, st.requests["GET /v2/sandboxes"])
      assert.are.equal(1, st.requests["envd GET /health"])
      assert.are.equal(5, st.total_requests)
      assert.are.equal(0, st.counters.kill_during_run)
      assert.are.equal(0, st.counters.pause_during_run)
      assert.are.equal(0, st.counters.exec_overlap)
      assert.is_number(st.sandboxes.running)
      assert.is_number(st.sandboxes.paused)
    end)

    it("resets to zero", function()
      create(srv)
      assert.are.equal(204, knob(srv, "POST", "/stats/reset").status)
      local st = knob(srv, "GET", "/stats").json
      assert.are.equal(0, st.total_requests)
      assert.is_nil(st.requests["POST /sandboxes"])
    end)

    it("counts running and paused sandboxes", function()
      local s2 = wbd.start()
      local ok, err = pcall(function()
        local a = create(s2)
        create(s2)
        assert.are.equal(204, http.api(s2, "POST", "/sandboxes/" .. a.sandboxID .. "/pause", {}).status)
        assert.are.same({ running = 1, paused = 1 }, knob(s2, "GET", "/stats").json.sandboxes)
      end)
      s2:stop()
      assert(ok, err)
    end)
  end)

  describe("faults", function()
    it("gives the next N requests to a route a status with E2B's error body", function()
      local sb = create(srv)
      local path = "/sandboxes/" .. sb.sandboxID
      local fault = { route = "GET /sandboxes/{id}", count = 2, status = 503 }
      assert.are.equal(204, knob(srv, "POST", "/faults", fault).status)
      local res = http.api(srv, "GET", path)
      assert.are.equal(503, res.status)
      assert.are.equal(503, res.json.code)
      assert.is_string(res.json.message)
      assert.are.equal(503, http.api(srv, "GET", path).status)
      assert.are.equal(200, http.api(srv, "GET", path).status)
      -- faulted requests count too
      assert.are.equal(3, knob(srv, "GET", "/stats").json.requests["GET /sandboxes/{id}"])
    end)

    it("uses a given body and headers", function()
      knob(srv, "POST", "/faults", { route = "POST /sandboxes", status = 429,
        body = '{"code":429,"message":"slow down"}',
        headers = { ["Retry-After"] = "1" } })
      local res = http.api(srv, "POST", "/sandboxes", { templateID = "base" })
      assert.are.equal(429, res.status)
      assert.are.same({ code = 429, message = "slow down" }, res.json)
      assert.are.equal("1", res.headers["retry-after"])
      assert.are.equal(201, http.api(srv, "POST", "/sandboxes", { templateID = "base" }).status)
    end)

    it("delays a request, then serves it", function()
      knob(srv, "POST", "/faults", { route = "GET /v2/sandboxes", delay_ms = 50 })
      assert.are.equal(200, http.api(srv, "GET", "/v2/sandboxes").status)
    end)

    it("drops the connection without an answer", function()
      knob(srv, "POST", "/faults", { route = "GET /v2/sandboxes", drop = true })
      local res = http.api(srv, "GET", "/v2/sandboxes")
      assert.are.equal(0, res.status)
      assert.are.equal(200, http.api(srv, "GET", "/v2/sandboxes").status)
    end)

    it("matches every route with '*' and applies to data-plane routes", function()
      local sb = create(srv, { templateID = "base", timeout = 600 })
      knob(srv, "POST", "/faults", { route = "*", count = 1, status = 500 })
      assert.are.equal(500, http.api(srv, "GET", "/v2/sandboxes").status)
      assert.are.equal(200, http.api(srv, "GET", "/v2/sandboxes").status)
      knob(srv, "POST", "/faults", { route = "envd GET /health", status = 503 })
      local res = http.sandbox(srv, sb, 49983, "GET", "/health")
      assert.are.equal(503, res.status)
      assert.are_not.equal(503, http.sandbox(srv, sb, 49983, "GET", "/health").status)
    end)

    it("are cleared by DELETE, and knob calls are never faulted", function()
      knob(srv, "POST", "/faults", { route = "*", count = 100, status = 500 })
      assert.are.equal(200, knob(srv, "GET", "/stats").status)
      assert.are.equal(204, knob(srv, "DELETE", "/faults").status)
      assert.are.equal(200, http.api(srv, "GET", "/v2/sandboxes").status)
    end)

    it("answers 400 for a malformed fault", function()
      assert.are.equal(400, knob(srv, "POST", "/faults", { count = 1 }).status)
      assert.are.equal(400, knob(srv, "POST", "/faults", { route = "*", status = "x" }).status)
      assert.are.equal(400, knob(srv, "POST", "/faults", { route = "*", status = 42 }).status)
    end)
  end)

  describe("config", function()
    it("takes rtt_ms, create_ms, resume_ms and loose_metadata at run time", function()
      assert.are.equal(204, knob(srv, "POST", "/config", { rtt_ms = 5, create_ms = 5, resume_ms = 5 }).status)
      local sb = create(srv)
      assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {}).status)
      assert.are.equal(201, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/connect", { timeout = 9 }).status)
      assert.are.equal(204, knob(srv, "POST", "/config", { rtt_ms = 0, create_ms = 0, resume_ms = 0 }).status)
    end)

    it("answers 400 for an unknown key or a bad value", function()
      assert.are.equal(400, knob(srv, "POST", "/config", { nope = 1 }).status)
      assert.are.equal(400, knob(srv, "POST", "/config", { rtt_ms = -1 }).status)
      assert.are.equal(400, knob(srv, "POST", "/config", { loose_metadata = "yes" }).status)
    end)

    it("answers 404 for an unknown knob", function()
      assert.are.equal(404, knob(srv, "GET", "/nope").status)
    end)
  end)
end)

describe("warmboxd clock (POST /_warmboxd/clock)", function()
  -- A server of its own: moving the clock moves it for every sandbox there.
  local srv
  lazy_setup(function() srv = wbd.start() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  it("moves leases forward: what is due is paused or killed when the call returns", function()
    local keep = create(srv, { templateID = "base", timeout = 900, autoPause = true })
    local paused = create(srv, { templateID = "base", timeout = 300, autoPause = true })
    local killed = create(srv, { templateID = "base", timeout = 300 })
    local before = ts(info(srv, keep.sandboxID).json.endAt)
    local res = knob(srv, "POST", "/clock", { advance_ms = 301000 })
    assert.are.equal(200, res.status)
    assert.are.equal(301000, res.json.offset_ms)
    -- No polling: the move expires what it made due before it answers.
    assert.are.equal("paused", info(srv, paused.sandboxID).json.state)
    assert.are.equal(404, info(srv, killed.sandboxID).status)
    assert.are.equal("running", info(srv, keep.sandboxID).json.state)
    assert.are.equal(before, ts(info(srv, keep.sandboxID).json.endAt))
    -- A connect sets its lease from the moved clock.
    local res2 = http.api(srv, "POST", "/sandboxes/" .. paused.sandboxID .. "/connect", { timeout = 60 })
    assert.are.equal(201, res2.status)
    local now = ts(knob(srv, "GET", "/clock").json.now)
    local end_at = ts(info(srv, paused.sandboxID).json.endAt)
    assert.is_true(end_at - now > 50 and end_at - now <= 60, tostring(end_at - now))
    -- 301 s moved: the server's now stays ahead of the wall clock by about that,
    -- less the seconds this spec spent since (a loaded machine may take several).
    assert.is_true(now - os.time() > 240, "the server's now is ahead of the wall clock")
    assert.are.equal(200, knob(srv, "POST", "/clock", { advance_ms = 600000 }).status)
    assert.are.equal("paused", info(srv, paused.sandboxID).json.state)
    assert.are.equal("paused", info(srv, keep.sandboxID).json.state)
  end)

  it("stands still when frozen, moves only by advance_ms, and runs on from there when thawed", function()
    local f = knob(srv, "POST", "/clock", { freeze = true })
    assert.are.equal(200, f.status)
    assert.is_true(f.json.frozen)
    local sb = create(srv, { templateID = "base", timeout = 2, autoPause = true })
    wbd.sleep(2.5) -- past its lease in wall time: a frozen clock does not expire it
    local now = knob(srv, "GET", "/clock").json.now
    assert.are.equal(f.json.now, now)
    assert.are.equal("running", info(srv, sb.sandboxID).json.state)
    local moved = knob(srv, "POST", "/clock", { advance_ms = 2500 }).json
    assert.are.equal(2.5, ts(moved.now) - ts(now))
    assert.are.equal("paused", info(srv, sb.sandboxID).json.state)
    local thawed = knob(srv, "POST", "/clock", { freeze = false }).json
    assert.is_false(thawed.frozen)
    assert.is_true(ts(thawed.now) >= ts(moved.now))
    wbd.sleep(0.2)
    assert.is_true(ts(knob(srv, "GET", "/clock").json.now) > ts(thawed.now))
    assert.are.equal(400, knob(srv, "POST", "/clock", { freeze = "yes" }).status)
  end)

  it("adds up moves, and answers 400 for anything but a whole advance_ms >= 0", function()
    local o0 = knob(srv, "GET", "/clock").json.offset_ms
    assert.are.equal(200, knob(srv, "POST", "/clock", { advance_ms = 0 }).status)
    assert.are.equal(o0 + 1500, knob(srv, "POST", "/clock", { advance_ms = 1500 }).json.offset_ms)
    for _, bad in ipairs({ { advance_ms = -1 }, { advance_ms = 1.5 }, { advance_ms = "1" }, { back_ms = 1 },
      { advance_ms = 1, other = 2 } }) do
      assert.are.equal(400, knob(srv, "POST", "/clock", bad).status)
    end
    assert.are.equal(405, knob(srv, "DELETE", "/clock").status)
    assert.are.equal(o0 + 1500, knob(srv, "GET", "/clock").json.offset_ms)
  end)
end)

describe("warmboxd process", function()
  local function run(args)
    local p = assert(io.popen(wbd.sh_quote(wbd.bin()) .. " " .. args .. " 2>&1"))
    local out = p:read("a")
    local ok, _, code = p:close()
    return out, ok and 0 or code
  end

  it("prints its version, its help, and refuses bad options", function()
    local out, code = run("--version")
    assert.are.equal(0, code)
    assert.matches("^warmboxd %d+%.%d+%.%d+\n$", out)
    out, code = run("--help")
    assert.are.equal(0, code)
    assert.matches("%-%-max%-running", out)
    out, code = run("--port nope")
    assert.are.equal(2, code)
    assert.matches("%-%-port", out)
    out, code = run("--no-such-option")
    assert.are.equal(2, code, out)
  end)

  -- A warmboxd of its own in the background (args: extra flags): its client
  -- table, its pid, and a reader of the files its shell leaves (out, err, rc).
  local function launch(args)
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. wbd.sh_quote(dir)))
    local cmd = string.format("(%s %s --port 0 --data-dir %s %s >%s 2>%s & echo $! >%s; wait $!; echo $? >%s) &",
      os.getenv("WARMBOXD_WRAPPER") or "", wbd.sh_quote(wbd.bin()), wbd.sh_quote(dir .. "/data"), args or "",
      wbd.sh_quote(dir .. "/out"), wbd.sh_quote(dir .. "/err"), wbd.sh_quote(dir .. "/pid"),
      wbd.sh_quote(dir .. "/rc"))
    assert(os.execute(cmd))
    local function read(name)
      local f = io.open(dir .. "/" .. name)
      if not f then return nil end
      local s = f:read("a")
      f:close()
      return s
    end
    local first = eventually(function()
      local out = read("out")
      return out and out:match("^[^\n]*\n")
    end, 60)
    assert.matches("^warmboxd listening on http://127%.0%.0%.1:%d+\n$", first)
    local srv = { url = first:match("(http://[%d%.:]+)"), api_key = wbd.new_key() }
    local function done() os.execute("rm -rf " .. wbd.sh_quote(dir)) end
    return srv, assert(tonumber(read("pid"))), read, done
  end

  it("prints its address first and exits 0 on SIGTERM and SIGINT", function()
    for _, sig in ipairs({ "TERM", "INT" }) do
      local srv, pid, read, done = launch()
      create(srv, { templateID = "base", timeout = 600 })
      os.execute("kill -" .. sig .. " " .. pid)
      local rc = eventually(function() return read("rc") end, 60)
      assert.are.equal("0", rc and rc:match("%d+"), read("err"))
      done()
    end
  end)

  it("exits 0 on SIGTERM with a stream parked and a handler in flight", function()
    -- the stream waits parked (its reader has nothing to send), the create
    -- blocks a worker: stopping resumes the one and waits for the other
    local srv, pid, read, done = launch("--create-ms 4000")
    local sb = http.create_interp(srv)
    local create_bg = string.format("curl -s -m 60 -H 'X-API-Key: %s' -H 'Content-Type: application/json' "
      .. "-d '{\"templateID\": \"base\"}' %s/sandboxes >/dev/null 2>&1 &", srv.api_key, srv.url)
    assert(os.execute(create_bg))
    local cell_out = os.tmpname()
    local cell = string.format("curl -sN -m 60 -H 'E2b-Sandbox-Id: %s' -H 'E2b-Sandbox-Port: 49999' "
      .. "-H 'X-Access-Token: %s' -H 'Content-Type: application/json' -d '{\"code\": \"import time; "
      .. "print(1, flush=True); time.sleep(600)\"}' %s/execute >%s 2>&1 &", sb.sandboxID, sb.envdAccessToken,
      srv.url, wbd.sh_quote(cell_out))
    assert(os.execute(cell))
    -- the cell printed: its stream now waits parked, and the create (4 s) is under way
    eventually(function() return (wbd.read_all(cell_out) or ""):find('"stdout"', 1, true) end, 30)
    os.remove(cell_out)
    os.execute("kill -TERM " .. pid)
    local rc = eventually(function() return read("rc") end, 60)
    assert.are.equal("0", rc and rc:match("%d+"), read("err"))
    assert.is_nil(read("err"):find("suspended", 1, true), read("err"))
    done()
  end)
end)
