-- warmbox.sim: the policy simulator drives the real session, policy and GC
-- code against a virtual-time model of E2B (no sleeping, no network).
local sim = require "warmbox.sim"
local model_mod = require "warmbox.sim.model"
local session = require "warmbox.session"

local FIXTURE = "spec/fixtures/sim_trace.jsonl"

local function turns(key, times, duration)
  local t = {}
  for i, at in ipairs(times) do t[i] = { t = at, session = key, duration = duration or 1 } end
  return t
end

-- A small well-formedness check: every tag is closed in order, attributes are quoted.
local function well_formed(xml)
  local stack = {}
  local body = xml:gsub("<!%-%-.-%-%->", "")
  for slash, name, attrs, selfclose in body:gmatch("<(/?)([%w:%-]+)(.-)(/?)>") do
    if slash == "/" then
      if stack[#stack] ~= name then return false, "unexpected </" .. name .. ">" end
      stack[#stack] = nil
    else
      local rest = attrs:gsub('%s+[%w:%-]+="[^"<]*"', "")
      if rest:find("%S") then return false, "bad attributes in <" .. name .. ">: " .. rest end
      if selfclose == "" then stack[#stack + 1] = name end
    end
  end
  if #stack > 0 then return false, "unclosed <" .. stack[#stack] .. ">" end
  return true
end

local function sink()
  local buf = {}
  return { write = function(self, ...)
    for _, s in ipairs({ ... }) do buf[#buf + 1] = tostring(s) end
    return self
  end, flush = function() end, text = function() return table.concat(buf) end }
end

describe("warmbox.sim", function()
  describe(".run()", function()
    it("gives one cold start then warm hits to turns closer than idle_timeout, and no resume", function()
      local r = assert(sim.run{ trace = turns("a", { 0, 60, 120, 180, 240 }), exec_timeout = 60, idle_timeout = 300 })
      assert.same({ 5, 5, 0 }, { r.runs, r.ok, r.failed })
      assert.equal(1, r.cold_starts)
      assert.equal(4, r.warm_hits)
      assert.equal(0, r.resumes)
      assert.equal(1, r.created)
      -- the first run paid list + create + kernel start; warm ones a fraction of a round trip
      assert.is_true(r.p99_ms >= 1500)
      assert.is_true(r.p50_ms <= 40)
    end)

    it("resumes (not cold-starts) turns further apart than the lease: the sandbox paused", function()
      local r = assert(sim.run{ trace = turns("a", { 0, 1000, 2000, 3000 }), exec_timeout = 60, idle_timeout = 300,
        details = true })
      assert.equal(1, r.cold_starts)
      assert.equal(3, r.resumes)
      assert.equal(0, r.warm_hits)
      assert.equal(1, r.created)
      assert.is_true(r.auto_pauses >= 3)
      -- the model resumed the same sandbox: one was ever made
      assert.equal(1, #r.sandboxes)
      -- a resume costs about resume_ms plus round trips, far less than a cold start
      assert.is_true(r.p50_ms >= 1000 and r.p50_ms < 1200, tostring(r.p50_ms))
    end)

    it("drives the real warmbox.session: the model holds the session's tag value", function()
      local r = assert(sim.run{ trace = turns("ws:1", { 0, 10 }), details = true, template = "tpl-x" })
      assert.equal(1, #r.sandboxes)
      assert.equal(session.tag_value("ws:1", { template = "tpl-x" }), r.sandboxes[1].metadata.warmboxSessionId)
      -- the session's own events were seen
      assert.equal(r.cold_starts, r.events.create)
    end)

    it("grows compute cost with idle_timeout while resumes shrink (sweep of three values)", function()
      local rows = assert(sim.sweep({ workload = { sessions = 20, turns = { 3, 8 }, gap = 400, seed = 3 },
        exec_timeout = 60 }, { param = "idle_timeout", values = { 60, 300, 900 } }))
      assert.equal(3, #rows)
      for i, row in ipairs(rows) do
        assert.equal("idle_timeout", row.param)
        assert.equal(({ 60, 300, 900 })[i], row.value)
        assert.equal(0, row.failed)
        assert.equal(rows[1].runs, row.runs) -- the same workload each time
      end
      assert.is_true(rows[1].compute_cost < rows[2].compute_cost and rows[2].compute_cost < rows[3].compute_cost)
      assert.is_true(rows[1].resumes > rows[2].resumes and rows[2].resumes > rows[3].resumes)
    end)

    it("lets GC with a short max_age kill abandoned paused sandboxes (storage stops growing)", function()
      local trace = { { t = 0, session = "a" }, { t = 5, session = "b" }, { t = 10, session = "c" } }
      local base = { trace = trace, exec_timeout = 60, idle_timeout = 60, max_age = 600, gc_every = 300 }
      local function with(extra)
        local o = {}
        for k, v in pairs(base) do o[k] = v end
        for k, v in pairs(extra) do o[k] = v end
        return assert(sim.run(o))
      end
      local short, long = with{ tail = 7200 }, with{ tail = 14400 }
      assert.equal(3, short.gc_kills)
      assert.equal(0, short.alive)
      assert.equal(short.paused_seconds, long.paused_seconds)
      assert.is_true(short.paused_seconds > 0 and short.paused_seconds < 3 * 1200)
      local none1, none2 = with{ tail = 7200, gc_every = false }, with{ tail = 14400, gc_every = false }
      assert.equal(0, none1.gc_kills)
      assert.equal(3, none1.alive_paused)
      assert.is_true(none2.paused_seconds > none1.paused_seconds)
      assert.is_true(none1.paused_seconds > short.paused_seconds)
    end)

    it("gives the same report for the same seed (and another for another seed)", function()
      local w = { sessions = 15, turns = { 1, 6 }, gap = 200, duration = { 0.5, 5 }, seed = 42 }
      local a = assert(sim.run{ workload = w, details = true })
      local b = assert(sim.run{ workload = w, details = true })
      assert.same(a, b)
      local w2 = {}
      for k, v in pairs(w) do w2[k] = v end
      w2.seed = 43
      local c = assert(sim.run{ workload = w2 })
      assert.is_not.equal(a.compute_seconds, c.compute_seconds)
    end)

    it("counts runs failing with POLICY when the lease hook raises, and does not crash", function()
      local r = assert(sim.run{ trace = turns("a", { 0, 10, 20 }),
        policy = { lease = function() error("boom") end } })
      assert.equal(3, r.runs)
      assert.equal(0, r.ok)
      assert.equal(3, r.failed)
      assert.same({ POLICY = 3 }, r.failures)
      assert.matches("hook 'lease' failed", r.errors[1].message)
      assert.equal(0, r.created)
    end)

    it("loads a policy file given as a path and reports a policy that does not load", function()
      local path = os.tmpname()
      local f = assert(io.open(path, "w"))
      f:write("return { name = 'long', lease = function(ctx) return 3600 end }\n")
      f:close()
      local r = assert(sim.run{ trace = turns("a", { 0, 1000, 2000 }), exec_timeout = 60, policy = path })
      os.remove(path)
      assert.equal("long", r.policy)
      assert.equal(2, r.warm_hits)
      local r2, err, code = sim.run{ trace = turns("a", { 0 }), policy = "/nonexistent/p.lua" }
      assert.is_nil(r2)
      assert.matches("cannot read policy", err)
      assert.equal("POLICY", code)
    end)

    it("never lets a lease run out under a long run", function()
      local r = assert(sim.run{ trace = turns("a", { 0, 400, 800 }, 200), exec_timeout = 300, idle_timeout = 30 })
      assert.equal(3, r.ok)
      assert.equal(0, r.paused_during_run)
    end)

    it("follows the maximum session length: the session recycles the run before the cap", function()
      local times = {}
      for i = 0, 150 do times[#times + 1] = i * 60 end -- one turn a minute for 2.5 h
      local r = assert(sim.run{ trace = turns("a", times), exec_timeout = 60, idle_timeout = 300,
        model = { max_length_hours = 1 } })
      assert.equal(1, r.cold_starts)
      assert.is_true(r.warm_hits > 100)
      -- The session knows the cap (max_run_length): before a run could cross it, it
      -- pauses (memory kept) and connects, so no run is ever paused underneath.
      assert.equal(0, r.paused_during_run)
      assert.equal(0, r.failed)
      assert.is_true(r.events.recycle >= 2, tostring(r.events.recycle))
    end)

    it("counts timeouts of runs longer than their timeout", function()
      local r = assert(sim.run{ trace = { { t = 0, session = "a", duration = 90, timeout = 30 } } })
      assert.same({ TIMEOUT = 1 }, r.failures)
    end)

    it("prices compute per running sandbox-second (configurable)", function()
      local r = assert(sim.run{ trace = turns("a", { 0 }), gc_every = false, tail = 1000,
        prices = { paused_second = 0.001 } })
      local per_s = 2 * 0.000014 + 0.5 * 0.0000045
      assert.near(r.compute_seconds * per_s, r.compute_cost, 1e-12)
      assert.near(300, r.compute_seconds, 5) -- created with a 300 s lease, then paused
      assert.near(r.paused_seconds * 0.001, r.storage_cost, 1e-12)
      assert.near(r.compute_cost + r.storage_cost, r.cost, 1e-12)
    end)

    it("raises on misuse", function()
      assert.has_error(function() sim.run{ trace = {}, bogus = 1 } end,
        "bad argument #1 to 'run' (unknown option 'bogus')")
      assert.has_error(function() sim.run{ idle_timeout = 5 } end,
        "bad argument #1 to 'run' (exactly one of 'trace' and 'workload' expected)")
      assert.has_error(function() sim.run{ workload = { sessions = 1, nope = 2 } } end)
      assert.has_error(function() sim.run{ trace = {}, model = { warp = 1 } } end)
      assert.has_error(function() sim.run{ trace = {}, prices = { gold = 1 } } end)
      assert.has_error(function() sim.sweep({ trace = {} }, { param = "template", values = { 1 } }) end)
      assert.has_error(function() sim.sweep({ trace = {} }, { param = "idle_timeout", values = {} }) end)
      -- errors point at the caller
      for _, fn in ipairs{
        function() sim.run{ trace = {}, bogus = 1 } end,
        function() sim.run{ workload = { sessions = 1, gap = "x" } } end,
        function() sim.run{ trace = {}, policy = { bogus = 1 } } end,
        function() sim.sweep({ trace = {} }, { param = "x", values = { 1 } }) end,
        function() sim.chart({}, { q = 1 }) end,
      } do
        local ok, err = pcall(fn)
        assert.is_false(ok)
        assert.matches("sim_spec%.lua:%d+: bad argument", err)
      end
    end)
  end)

  describe("traces", function()
    it("parses the fixture, sorted by time", function()
      local t = assert(sim.load_trace(FIXTURE))
      assert.equal(10, #t)
      for i = 2, #t do assert.is_true(t[i - 1].t <= t[i].t) end
      assert.same({ t = 0, session = "ws-1:thread-1", duration = 2 }, t[1])
      assert.equal("bash", t[8].language)
      local r = assert(sim.run{ trace = FIXTURE })
      assert.equal(10, r.runs)
      assert.equal(0, r.failed)
      assert.equal(3, r.cold_starts)
    end)

    it("reports a bad line or a missing file as nil, msg, code", function()
      local t, err, code = sim.parse_trace('{"t": 0, "session": "a"}\n{"t": "x", "session": "a"}\n')
      assert.is_nil(t)
      assert.equal("trace line 2: 't' must be a number of seconds >= 0", err)
      assert.equal("BAD_REQUEST", code)
      t, err, code = sim.parse_trace("{oops\n")
      assert.is_nil(t)
      assert.matches("^trace line 1: invalid json", err)
      assert.equal("BAD_REQUEST", code)
      local r
      r, err, code = sim.run{ trace = "/nonexistent/trace.jsonl" }
      assert.is_nil(r)
      assert.matches("cannot read trace", err)
      assert.equal("NOT_FOUND", code)
    end)
  end)

  describe(".workload()", function()
    it("is deterministic and honours its ranges", function()
      local w = { sessions = 10, turns = { 2, 4 }, gap = 60, duration = { 1, 3 }, span = 100, seed = 9 }
      local a, b = sim.workload(w), sim.workload(w)
      assert.same(a, b)
      local per = {}
      for _, e in ipairs(a) do
        per[e.session] = (per[e.session] or 0) + 1
        assert.is_true(e.duration >= 1 and e.duration <= 3)
      end
      local n = 0
      for _, c in pairs(per) do
        n = n + 1
        assert.is_true(c >= 2 and c <= 4)
      end
      assert.equal(10, n)
    end)
  end)

  describe(".chart()", function()
    it("is a well-formed SVG with one point per row", function()
      local rows = assert(sim.sweep({ workload = { sessions = 5, seed = 1 }, exec_timeout = 60 },
        { param = "idle_timeout", values = { 60, 300, 900, 1800 } }))
      local svg = sim.chart(rows)
      assert.matches("^<svg xmlns=\"http://www.w3.org/2000/svg\"", svg)
      assert.matches("</svg>\n$", svg)
      assert.is_true(well_formed(svg))
      local _, circles = svg:gsub("<circle ", "")
      assert.equal(4, circles)
      assert.matches("idle_timeout=900", svg, 1, true)
      assert.matches("p95 added latency", svg, 1, true)
      local svg2 = sim.chart(rows, { x = "value", y = "resumes", title = "a < b & c" })
      assert.is_true(well_formed(svg2))
      assert.matches("a &lt; b &amp; c", svg2, 1, true)
      assert.has_error(function() sim.chart(rows, { x = "nope" }) end)
    end)
  end)

  describe("the model", function()
    it("pauses at the lease end, resumes on connect with a new started_at, keeps paused ones", function()
      local m = model_mod.new{ rtt_ms = 0, create_ms = 0, resume_ms = 0 }
      local sb = assert(m:create{ template = "t", timeout = 60,
        lifecycle = { on_timeout = "pause", auto_resume = true } })
      m:advance_to(m.now + 61)
      local d = assert(m:info(sb.sandbox_id))
      assert.equal("paused", d.state)
      local _, resumed = assert(m:connect(sb.sandbox_id, { timeout = 30 }))
      assert.is_true(resumed)
      assert.equal("running", assert(m:info(sb.sandbox_id)).state)
      assert.is_nil((m:set_timeout("nope", 5)))
      m:advance_to(m.now + 1e6)
      assert.equal("paused", assert(m:info(sb.sandbox_id)).state)
      assert.is_true(m:kill(sb.sandbox_id))
      assert.is_false(m:kill(sb.sandbox_id))
      local _, _, code = m:info(sb.sandbox_id)
      assert.equal("NOT_FOUND", code)
      -- onTimeout = kill (the API default) removes it for good
      local k = assert(m:create{ timeout = 10 })
      m:advance_to(m.now + 11)
      assert.is_nil((m:info(k.sandbox_id)))
    end)
  end)

  describe("the CLI", function()
    it("runs `simulate` on the fixture with a sweep and writes a chart", function()
      local out, err = sink(), sink()
      local chart = os.tmpname()
      local status = require("warmbox.cli").main({ "simulate", "--trace", FIXTURE, "--exec-timeout", "60",
        "--idle-timeout", "60,300,900", "--chart", chart }, { stdout = out, stderr = err })
      assert.equal("warmbox: chart written to " .. chart .. "\n", err:text())
      assert.equal(0, status)
      local text = out:text()
      assert.matches("idle_timeout%s+runs%s+cold", text)
      assert.matches("\n900 ", text)
      local f = assert(io.open(chart))
      local svg = f:read("a")
      f:close()
      os.remove(chart)
      local _, circles = svg:gsub("<circle ", "")
      assert.equal(3, circles)
    end)

    it("runs a generated workload and rejects bad arguments", function()
      local out, err = sink(), sink()
      local status = require("warmbox.cli").main({ "simulate", "--sessions", "5", "--turns", "2-3", "--gap", "120",
        "--seed", "4" }, { stdout = out, stderr = err })
      assert.equal(0, status)
      assert.matches("policy%s+runs", out:text())
      out, err = sink(), sink()
      status = require("warmbox.cli").main({ "simulate", "--turns", "x" }, { stdout = out, stderr = err })
      assert.equal(2, status)
      assert.matches("turns", err:text())
    end)
  end)
end)
