-- Observable where users work: `on_event` and `log`
-- accepted by warmbox.new and wb:session, the run events, `r.timings` on
-- every result and failure, wb:stats() (runs by outcome and code, reuse /
-- resume / create, latency quantiles in bounded memory), the low-level
-- client's options passed through, the lock chosen by the environment.
local warmbox = require "warmbox"
local metrics = require "warmbox.metrics"
local fake_e2b = require "spec.helpers.fake_e2b"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local seq = 0
local function new_wb(extra)
  local client = fake_e2b.new{ clock = os.time }
  seq = seq + 1
  local o = { client = client, lock = "memory", secret = "observe-secret-" .. seq }
  for k, v in pairs(extra or {}) do o[k] = v end
  return assert(warmbox.new(o)), client
end

local function names(events)
  local out = {}
  for _, e in ipairs(events) do out[#out + 1] = e[1] end
  return out
end

-- `want` appears in `list` in this order (other names may come between).
local function in_order(list, want)
  local i = 1
  for _, n in ipairs(list) do
    if n == want[i] then i = i + 1 end
  end
  return i > #want
end

local function contains(list, name)
  for _, n in ipairs(list) do if n == name then return true end end
  return false
end

describe("on_event and log hooks", function()
  it("warmbox.new takes both; a run sends lock_wait, lease, create, run_start, outputs, run_end", function()
    local events, logs = {}, {}
    local wb = new_wb{ on_event = function(name, info) events[#events + 1] = { name, info } end,
      log = function(level, msg, fields) logs[#logs + 1] = { level, msg, fields } end }
    assert(wb:session("obs-1"):run("x = 1"))
    local n = names(events)
    assert.is_true(in_order(n, { "lock_wait", "lease", "create", "run_start", "outputs", "run_end" }),
      table.concat(n, ","))
    local last = events[#events][2]
    assert.is_true(last.ok)
    assert.is_table(last.timings)
    -- log: one line per event, the event's info as fields
    assert.equal(#events, #logs)
    for i, l in ipairs(logs) do
      assert.truthy(({ debug = true, info = true, warn = true })[l[1]])
      assert.truthy(l[2]:find(events[i][1], 1, true))
      assert.equal(events[i][2], l[3])
    end
    -- (a client without the engine's transport: no watchdog, so "lease_floor" comes first
    -- with the defaults' 30 s idle window under a 300 s exec_timeout)
    for i, name in ipairs(n) do
      if name == "create" then assert.equal("info", logs[i][1]) end
      if name == "lease_floor" then assert.equal("warn", logs[i][1]) end
    end
  end)

  it("a second run sends reuse; a paused sandbox found sends resume", function()
    local events = {}
    local wb, client = new_wb{ on_event = function(name) events[#events + 1] = { name } end }
    local s = wb:session("obs-2")
    assert(s:run("x = 1"))
    events = {}
    assert(s:run("x = 2"))
    assert.is_true(contains(names(events), "reuse"))
    assert.is_false(contains(names(events), "create"))
    -- another conversation whose sandbox is paused, nothing remembered: found and resumed
    local s3 = wb:session("obs-3")
    client:add("sb-paused", s3.tag_value, "paused")
    events = {}
    local r = assert(s3:run("x = 3"))
    assert.is_true(r.resumed)
    assert.equal(1, wb:stats().resume)
    assert.is_true(in_order(names(events), { "resume", "run_start", "run_end" }))
  end)

  it("wb:session's on_event and log replace warmbox.new's for that session", function()
    local from_wb, from_s, logged = 0, 0, 0
    local wb = new_wb{ on_event = function() from_wb = from_wb + 1 end }
    assert(wb:session("obs-4", { on_event = function() from_s = from_s + 1 end,
      log = function() logged = logged + 1 end }):run("x = 1"))
    assert.equal(0, from_wb)
    assert.is_true(from_s > 0)
    assert.equal(from_s, logged)
    assert.has_error(function() wb:session("obs-4", { log = "loud" }) end)
  end)

  it("a failed run sends run_end with its code, logged as a warning", function()
    local events, logs = {}, {}
    local wb, client = new_wb{ on_event = function(name, info) events[#events + 1] = { name, info } end,
      log = function(level, msg) logs[#logs + 1] = { level, msg } end }
    local s = wb:session("obs-5")
    assert(s:run("x = 1"))
    client.fail.run = { { "boom", "HTTP", { status = 500, started = true } } }
    assert.is_nil(s:run("x = 2"))
    local last = events[#events]
    assert.equal("run_end", last[1])
    assert.is_false(last[2].ok)
    assert.equal("HTTP", last[2].code)
    assert.equal("warn", logs[#logs][1])
  end)

  it("wb:gc's kills are gc_kill events of the warmbox object", function()
    local events = {}
    local wb, client = new_wb{ on_event = function(name, info) events[#events + 1] = { name, info } end }
    local s = wb:session("obs-gc")
    -- a sandbox of this session that nothing remembers and that is paused long ago: GC's to kill
    client:add("sb-old", s.tag_value, "paused", {})
    client.sb["sb-old"].end_at = "2001-01-01T00:00:00Z"
    client.sb["sb-old"].started_at = "2001-01-01T00:00:00Z"
    local report = assert(wb:gc{ max_age = 1 })
    assert.equal(1, report.killed)
    local ev
    for _, e in ipairs(events) do if e[1] == "gc_kill" then ev = e[2] end end
    assert.is_table(ev)
    assert.equal("sb-old", ev.sandbox_id)
    assert.equal("kill", ev.action)
  end)
end)

describe("r.timings", function()
  local FIELDS = { "lock_wait", "resolve", "lease", "execute", "outputs", "total" }
  local function check(t)
    assert.is_table(t)
    for _, f in ipairs(FIELDS) do
      assert.is_number(t[f], f)
      assert.is_true(t[f] >= 0, f)
    end
    local parts = t.lock_wait + t.resolve + t.lease + t.execute + t.outputs
    assert.is_true(t.total >= parts - 1e-9)
  end

  it("is on every result: lock wait, resolve, lease, execute, outputs, total (seconds)", function()
    local wb = new_wb()
    local s = wb:session("tm-1")
    check(assert(s:run("x = 1")).timings)
    check(assert(s:run("x = 2")).timings)
  end)

  it("each field covers its own phase (the time a slowed step takes is in its field)", function()
    local core = require "warmbox.core"
    local SLOW = 0.05
    -- the remembered sandbox is used as it is (no connect): a run longer than its lease is extended first
    local wb, client = new_wb{ exec_timeout = 200, policy = { should_refresh = function() return false end } }
    local function slowed(name)
      local f = client[name]
      client[name] = function(...) core.sleep(SLOW) return f(...) end
    end
    slowed("create")
    slowed("set_timeout")
    local s = wb:session("tm-phases")
    local t1 = assert(s:run("x = 1")).timings
    assert.is_true(t1.resolve >= SLOW, "resolve " .. t1.resolve)  -- the create
    client.exec = function() core.sleep(SLOW) end
    local t2 = assert(s:run("x = 2", { timeout = 300 })).timings
    assert.is_true(t2.lease >= SLOW, "lease " .. t2.lease)        -- the extension to 305 s
    assert.is_true(t2.execute >= SLOW, "execute " .. t2.execute)
    assert.is_true(t2.total >= t2.lease + t2.execute)
    -- lock_wait: a task waits while another holds the session
    local runner = require "warmbox.runner"
    local r = assert(runner.new())
    local waited
    client.exec = nil
    r:spawn(function()
      local lk = require("warmbox.lock").new{ backend = "memory" }
      assert(lk:lock(s.tag_value))
      r.sched:sleep(SLOW)
      lk:unlock()
    end)
    r:spawn(function() waited = assert(s:run("x = 3")).timings.lock_wait end)
    assert(r:loop())
    r:close()
    assert.is_true(waited >= SLOW, "lock_wait " .. tostring(waited))
  end)

  it("is on a failure's detail, also when the lock was never had", function()
    local wb, client = new_wb{ lock = { backend = "memory", timeout = 0 } }
    local s = wb:session("tm-2")
    assert(s:run("x = 1"))
    client.fail.run = { { "boom", "HTTP", { status = 500, started = true } } }
    local r, _, code, detail = s:run("x = 2")
    assert.is_nil(r)
    assert.equal("HTTP", code)
    check(detail.timings)
    -- BUSY: another holder keeps the session's lock
    local lock = require "warmbox.lock"
    local lk = lock.new{ backend = "memory" }
    assert(lk:lock(s.tag_value))
    local r2, _, code2, detail2 = s:run("x = 3")
    lk:unlock()
    assert.is_nil(r2)
    assert.equal("BUSY", code2)
    check(detail2.timings)
    assert.equal(detail2.timings.total, detail2.timings.lock_wait)
  end)
end)

describe("wb:stats()", function()
  it("counts runs by outcome and code, reuse / resume / create, and keeps latency quantiles", function()
    local wb, client = new_wb()
    local s = wb:session("st-1")
    assert(s:run("x = 1"))                       -- create
    assert(s:run("x = 2"))                       -- reuse
    client.exec = function(_, _, out) out.error = { name = "ValueError", value = "no", traceback = "" } end
    assert.is_table(assert(s:run("raise ValueError('no')")).error) -- ran, raised
    client.exec = nil
    client.fail.run = { { "boom", "HTTP", { status = 500, started = true } } }
    assert.is_nil(s:run("x = 3"))                -- warmbox failed
    local st = wb:stats()
    assert.equal(4, st.runs)
    assert.equal(2, st.runs_ok)
    assert.equal(1, st.runs_error)
    assert.equal(1, st.runs_failed)
    assert.same({ HTTP = 1 }, st.codes)
    assert.equal(1, st.create)
    assert.equal(2, st.reuse)
    assert.equal(0, st.resume)
    assert.equal(4, st.latency.count)
    assert.is_true(st.latency.p50 <= st.latency.p90 and st.latency.p90 <= st.latency.p99)
    assert.equal(0, st.prewarms) -- the prewarm counters stay
    -- a copy: changing it changes nothing
    st.codes.HTTP = 99
    assert.equal(1, wb:stats().codes.HTTP)
    assert.same(wb:stats(), s:stats())
  end)

  it("quantiles are within the histogram's ratio of the true ones, in bounded memory", function()
    local c = {}
    for i = 1, 10000 do metrics.count_run(c, { reused = true }, nil, (i % 100 + 1) / 1000) end
    local lat = metrics.stats(c).latency
    assert.equal(10000, lat.count)
    local function near(got, want) return got >= want and got <= want * metrics.RATIO + 1e-12 end
    assert.is_true(near(lat.p50, 0.050), tostring(lat.p50))
    assert.is_true(near(lat.p90, 0.090), tostring(lat.p90))
    assert.is_true(near(lat.p99, 0.099), tostring(lat.p99))
    local keys = 0
    for _ in pairs(c.latency) do keys = keys + 1 end
    assert.is_true(keys <= metrics.BUCKETS + 1)
    metrics.count_run(c, nil, "BUSY", 1e9) -- beyond the last bucket: counted there
    assert.equal(10001, metrics.stats(c).latency.count)
  end)
end)

describe("warmbox.new passes the low-level client's options", function()
  it("retries, connect_timeout, proxy, ca_file, user_agent, max_connections reach warmbox.e2b.new", function()
    local wb = assert(warmbox.new{ api_key = "k", api_url = "https://api.example.invalid", retries = 0,
      connect_timeout = 2, proxy = false, ca_file = "/etc/ssl/certs/ca-certificates.crt" })
    assert.equal(1, wb.client.retry.attempts)
    wb:close()
    -- checked by the client: its message names the option
    assert.has_error(function()
      warmbox.new{ api_key = "k", api_url = "https://api.example.invalid", retries = 101 }
    end,
      "bad argument #1 to 'new' (option 'retries': integer 0..100 expected, got 101)")
    assert.has_error(function() warmbox.new{ api_key = "k", retries = "3" } end)
    assert.has_error(function()
      warmbox.new{ api_key = "k", api_url = "https://api.example.invalid", max_connections = 0 }
    end, "bad argument #1 to 'new' (option 'max_connections': 1..10000 expected, got 0)")
    assert(warmbox.new{ api_key = "k", api_url = "https://api.example.invalid", user_agent = "host/1" }):close()
  end)
end)

describe("warmbox.new's client and its transport, set when each is made", function()
  it("makes its own client with the engine's transport, and leaves a caller's warmbox.e2b client as it is", function()
    local e2b = require "warmbox.e2b"
    local wb = assert(warmbox.new{ api_key = "k", api_url = "https://api.example.invalid" })
    assert.is_table(wb.client.transport)
    assert.is_function(wb.parallel)
    wb:close()
    local own = e2b.new{ api_key = "k", api_url = "https://api.example.invalid" }
    local wb2 = assert(warmbox.new{ client = own })
    assert.is_nil(own.transport, "the caller's client was changed")
    assert.are_not.equal(own, wb2.client)
    assert.equal(own.http, wb2.client.http) -- the same connection
    assert.is_table(wb2.client.transport)
    assert.is_function(wb2.parallel)
    wb2:close()
    assert.is_nil(own.transport)
    -- a client with a transport of its own is used as it is
    local wb3 = assert(warmbox.new{ client = wb2.client })
    assert.equal(wb2.client, wb3.client)
    assert.is_nil(wb3.parallel)
    own:close()
  end)

  it("warmbox.e2b.new takes a transport: an object, or a function of the client's connection", function()
    local e2b = require "warmbox.e2b"
    local seen
    local tp = { request = function(_, req)
      seen = req.url
      return { status = 200, headers = {}, body = '{"sandboxID":"i1","state":"running"}' }
    end }
    local c = e2b.new{ api_key = "k", api_url = "https://api.example.invalid", transport = tp }
    assert.equal(tp, c.transport)
    assert.truthy(c:info("i1"))
    assert.equal("https://api.example.invalid/sandboxes/i1", seen)
    local given
    local c2 = e2b.new{ api_key = "k", api_url = "https://api.example.invalid",
      transport = function(http) given = http return tp end }
    assert.equal(c2.http, given)
    assert.equal(tp, c2.transport)
    assert.has_error(function() e2b.new{ api_key = "k", transport = 1 } end)
    c:close()
    c2:close()
  end)
end)

describe("the environment", function()
  -- a child Lua with the given environment: prints what warmbox.new chose as the lock
  local function lock_with(env)
    local code = [[
      local warmbox = require "warmbox"
      local ok, wb = pcall(warmbox.new, { client = {} })
      if not ok then io.write("error: ", tostring(wb)) return end
      local l = wb.lock
      if type(l) == "table" then
        io.write(l.backend, " ", l.redis.host, " ", l.redis.port, " ", tostring(l.redis.prefix))
      else io.write(tostring(l)) end
    ]]
    local p = assert(io.popen(string.format("env %s LUA_PATH=%s LUA_CPATH=%s lua5.4 -e %s 2>&1", env,
      q(package.path), q(package.cpath), q(code))))
    local out = p:read("a")
    p:close()
    return out
  end

  it("WARMBOX_LOCK and WARMBOX_REDIS_URL choose the lock when new is given none", function()
    assert.equal("file", lock_with("-u WARMBOX_LOCK -u WARMBOX_REDIS_URL"))
    assert.equal("memory", lock_with("WARMBOX_LOCK=memory"))
    assert.equal("redis 10.0.0.5 6390 tenant:", lock_with("WARMBOX_REDIS_URL=redis://10.0.0.5:6390/tenant:"))
    assert.equal("redis redis.local 6379 nil", lock_with("WARMBOX_LOCK=redis WARMBOX_REDIS_URL=redis://redis.local"))
    assert.truthy(lock_with("WARMBOX_LOCK=nfs"):find('WARMBOX_LOCK: "file", "redis" or "memory" expected', 1, true))
    assert.truthy(lock_with("WARMBOX_REDIS_URL=http://x"):find("WARMBOX_REDIS_URL: redis://", 1, true))
  end)

  it("WARMBOX_REDIS_URL may name Sentinel or a Cluster; the password may come from WARMBOX_REDIS_PASSWORD", function()
    local function ha_with(env)
      local code = [[
        local l = require("warmbox").new{ client = {} }.lock
        local r = l.redis
        io.write(table.concat(r.sentinels or r.nodes, ","), " ", tostring(r.master), " ", tostring(r.username), " ",
          tostring(r.password), " ", tostring(r.db), " ", tostring(r.prefix))
      ]]
      local p = assert(io.popen(string.format("env %s LUA_PATH=%s LUA_CPATH=%s lua5.4 -e %s 2>&1", env,
        q(package.path), q(package.cpath), q(code))))
      local out = p:read("a")
      p:close()
      return out
    end
    assert.equal("10.0.0.1:26379,10.0.0.2:26380 mymaster nil s3cret 2 t:",
      ha_with("WARMBOX_REDIS_URL='redis-sentinel://10.0.0.1,10.0.0.2:26380/mymaster/t:?db=2' "
        .. "WARMBOX_REDIS_PASSWORD=s3cret"))
    assert.equal("10.0.0.1:7000,10.0.0.2:7001 nil app p%w nil nil",
      ha_with("WARMBOX_REDIS_URL='redis-cluster://app:p%25w@10.0.0.1:7000,10.0.0.2:7001' WARMBOX_REDIS_PASSWORD=x"))
  end)
end)
