-- warmbox.sim: the policy simulator drives the real session, policy and GC
-- code against a virtual-time model of E2B (no sleeping, no network).
local sim = require "warmbox.sim"
local model_mod = require "warmbox.sim.model"
local tag_mod = require "warmbox.tag"

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
      assert.equal(tag_mod.tag_value("ws:1", { template = "tpl-x" }), r.sandboxes[1].metadata.warmboxSessionId)
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

    it("simulates, by default, long enough for GC to reclaim a sandbox whatever the phase", function()
      -- Passes every 3600 s from 0; max_age 86400; a 305 s lease (the 300 s timeout +
      -- LEASE_MARGIN). a's sandbox: ready at 3296.53 s, paused at 3601.53 s, inactive more
      -- than max_age only at the pass at 93600 s. a's run ends at 3297.60 s (list 20 ms,
      -- create 520, hooks cell 1020, run 20, the create's list after the run 20). The
      -- default tail, max(300 + 5, 300) + 86400 + 3600, ends the simulation at 93602.60 s,
      -- after that pass (a tail counting a 300 s lease ended at 93597.60 s, before it, with
      -- a's sandbox still alive).
      local r = assert(sim.run{ trace = { { t = 0, session = "z", duration = 0 },
        { t = 3296, session = "a", duration = 0 } } })
      assert.same({ 0, 2 }, { r.alive, r.gc_kills })
      assert.near(93602.60, r.simulated_seconds, 1e-6)
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
      -- the default template, code-interpreter-v1, is 2 vCPU / 2048 MiB (as E2B builds it):
      -- 2 vCPU x $0.000014 + 2 GiB x $0.0000045 = $0.000037 per running second
      local per_s = 2 * 0.000014 + 2 * 0.0000045
      assert.near(r.compute_seconds * per_s, r.compute_cost, 1e-12)
      assert.same({ { cpu_count = 2, memory_mb = 2048, seconds = r.compute_seconds, cost = r.compute_cost } },
        r.compute_by_size)
      -- created with a 300 s lease (the idle window: the watchdog keeps a longer run's), then paused
      assert.near(300, r.compute_seconds, 1e-6)
      assert.near(r.paused_seconds * 0.001, r.storage_cost, 1e-12)
      assert.near(r.compute_cost + r.storage_cost, r.cost, 1e-12)
    end)

    it("takes the size from the template, or from `size` (a listing's cpuCount/memoryMB); "
      .. "paused sandboxes cost nothing by default", function()
      local opts = { trace = turns("a", { 0 }), gc_every = false, tail = 1000, details = true }
      local ci = assert(sim.run(opts))
      opts.template = "base"
      local base = assert(sim.run(opts))
      opts.size = { cpu_count = 8, memory_mb = 8192 }
      local big = assert(sim.run(opts))
      -- the same 300 s running in each; base is E2B's default size, 2 vCPU / 512 MiB:
      -- 300 x (2 x 0.000014 + 0.5 x 0.0000045); 8 vCPU / 8 GiB: 300 x (8 x 0.000014 + 8 x 0.0000045)
      assert.near(300, base.compute_seconds, 1e-6)
      assert.near(300 * (2 * 0.000014 + 0.5 * 0.0000045), base.compute_cost, 1e-12)
      assert.near(300 * (8 * 0.000014 + 8 * 0.0000045), big.compute_cost, 1e-12)
      assert.same({ 2, 512 }, { base.compute_by_size[1].cpu_count, base.compute_by_size[1].memory_mb })
      -- the model lists what it bills: cpu_count / memory_mb of the record
      assert.same({ 2, 2048 }, { ci.sandboxes[1].cpu_count, ci.sandboxes[1].memory_mb })
      assert.same({ 8, 8192 }, { big.sandboxes[1].cpu_count, big.sandboxes[1].memory_mb })
      assert.is_true(ci.paused_seconds > 0)
      assert.same({ 0, 0 }, { ci.storage_cost, sim.PRICES.paused_second })
      assert.has_error(function() sim.run{ trace = {}, size = { cpu_count = 0, memory_mb = 512 } } end)
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

  describe("overlapping conversations", function()
    it("runs turns of different conversations at once, one conversation's turns one after another", function()
      local trace = {
        { t = 0, session = "a", duration = 10 },
        { t = 2, session = "a", duration = 1 },   -- due while a's first turn runs
        { t = 1, session = "b", duration = 1 },   -- overlaps a's first turn
      }
      local r = assert(sim.run{ trace = trace, details = true, gc_every = false, tail = 0 })
      assert.equal(3, r.ok)
      local by = {}
      for _, e in ipairs(r.log) do
        by[e.session] = by[e.session] or {}
        table.insert(by[e.session], e)
      end
      local a1, a2, b1 = by.a[1], by.a[2], by.b[1]
      -- b ran while a's first turn was still running (the old simulator made it wait)
      assert.is_true(b1.start < a1.finish and b1.finish < a1.finish)
      assert.equal(1, b1.start)
      -- a's second turn, due at 2, started only when its first ended
      assert.equal(2, a2.due)
      assert.is_true(a2.start >= a1.finish)
      -- both cold starts cost the same (list + create + kernel start): no waiting on each other
      assert.near(a1.code_started - a1.start, b1.code_started - b1.start, 1e-6)
      assert.equal(2, r.peak_running)
    end)

    it("hits E2B's concurrency cap: overlapping turns beyond it get 429 (create retried as the client does)", function()
      local trace = {}
      for i = 1, 5 do trace[i] = { t = i * 0.01, session = "c" .. i, duration = 5 } end
      local r = assert(sim.run{ trace = trace, model = { max_running = 3 }, gc_every = false, tail = 0 })
      -- the first three created and ran; the other two were refused at create, four times
      -- each (three retries, 1 s apart as the 429's Retry-After said: no slot freed meanwhile)
      assert.same({ 5, 3, 2 }, { r.runs, r.ok, r.failed })
      assert.same({ RATE_LIMITED = 2 }, r.failures)
      assert.equal(3, r.created)
      assert.same({ 8, 6, 6 }, { r.rejected_cap, r.retries, r.retry_after_waits })
      assert.equal("exact", r.path)             -- the fast path does not model the cap
      assert.equal(3, r.peak_running)
      -- without the cap, all five run at once
      local free = assert(sim.run{ trace = trace, gc_every = false, tail = 0 })
      assert.same({ 5, 0, 5 }, { free.ok, free.failed, free.peak_running })
    end)

    it("retries a resume refused by the cap as the client does, and succeeds once a slot frees", function()
      -- b's sandbox paused at 60 s; a takes the only slot at 600 s (lease until 660 s)
      local trace = {
        { t = 0, session = "b", duration = 0 },
        { t = 600, session = "a", duration = 0 },
        { t = 600.05, session = "b", duration = 0 },
        { t = 700, session = "b", duration = 0 },
      }
      local r = assert(sim.run{ trace = trace, model = { max_running = 1 }, exec_timeout = 60, idle_timeout = 60,
        gc_every = false, tail = 0 })
      -- b at 600.05: the remembered sandbox's connect is refused 4 times (3 retries); a 429
      -- is transient, so the run fails RATE_LIMITED and the sandbox is kept (no list, no
      -- second candidate, no create that would strand b's kernel state)
      assert.same({ 4, 3 }, { r.rejected_cap, r.retries })
      assert.same({ RATE_LIMITED = 1 }, r.failures)
      -- b at 700 s: a's sandbox paused at 660 s, so b's resumes
      assert.same({ 3, 2, 1 }, { r.ok, r.created, r.resumes })
    end)
  end)

  describe("the fast path and the exact path", function()
    -- what both must agree on (the requests and the seconds differ only by GC's own
    -- time: the fast path's GC pass takes none)
    local KEYS = { "runs", "ok", "failed", "cold_starts", "resumes", "warm_hits", "created", "model_resumes",
      "pauses", "auto_pauses", "kills", "timeout_kills", "gc_kills", "gc_demoted", "conversations_lost_state",
      "turns_lost_state", "peak_running", "p50_ms", "p95_ms", "p99_ms", "max_ms", "alive", "simulated_seconds" }
    local function both(o, counts_only)
      o.exact = true
      local e = assert(sim.run(o))
      o.exact = false
      local f = assert(sim.run(o))
      assert.same({ "exact", "fast" }, { e.path, f.path })
      local ev, fv = {}, {}
      for _, k in ipairs(KEYS) do
        if not (counts_only and (k:match("_ms$") or k == "simulated_seconds")) then ev[k], fv[k] = e[k], f[k] end
      end
      assert.same(ev, fv)
      assert.same(e.failures, f.failures)
      return e, f
    end

    it("give the same counts and latencies for every built-in policy", function()
      for _, p in ipairs(sim.POLICY_ORDER) do
        local e = both{ workload = { sessions = 60, turns = { 1, 12 }, gap = 400, seed = 9, span = 3600 },
          builtin = p, max_age = 3600 }
        assert.is_true(e.runs > 200)
      end
    end)

    it("give the same counts with GC killing and demoting, long runs and timeouts, bash cells", function()
      local e = both{ workload = { sessions = 80, turns = { 1, 20 }, gap = 200, seed = 5, span = 7200 },
        max_age = 600, gc_every = 300 }
      assert.is_true(e.gc_kills > 10, tostring(e.gc_kills))
      -- Demotes take the exact path's GC pass seconds (a resume and a pause each, under
      -- the session's lock): a run due meanwhile waits for it there, not in the fast path,
      -- whose pass takes no time. The counts agree; a few latencies do not.
      -- The exact pass also asks the gc hook after its listing (a round trip, 20 ms, into
      -- the pass), the fast one at the pass's start: a sandbox whose idle time crosses
      -- demote_after inside that window is demoted by one and not the other. Seed 2 has
      -- one since leases cover the timeout + LEASE_MARGIN (305 s, was 300 s): a sandbox
      -- paused at 8400.013 s is 599.987 s idle at the fast pass (9000 s) and 600.007 s at
      -- the exact one (9000.02 s). Seed 3 has no sandbox in such a window.
      local policy = { gc = require("warmbox.policy.rules").gc{ demote_after = "10m", kill_after = "2h" } }
      e = both({ workload = { sessions = 40, turns = { 2, 10 }, gap = 900, seed = 3, span = 3600 }, policy = policy,
        gc_every = 600 }, true)
      assert.is_true(e.gc_demoted > 0, tostring(e.gc_demoted))
      local f
      e, f = both{ workload = { sessions = 20, turns = { 2, 6 }, gap = 100, duration = { 1, 90 }, seed = 4,
        span = 600 }, exec_timeout = 60, idle_timeout = 60 }
      -- cells of up to 90 s under a 60 s timeout: the lease, taken a round trip before the
      -- cell starts, is the timeout + LEASE_MARGIN (65 s), so it outlasts the cell's
      -- timeout: every cell over 60 s ends TIMEOUT and no sandbox pauses under a run (with a
      -- lease of just 60 s they all ended STREAM_BROKEN, the sandbox paused first)
      assert.is_true(e.failed > 0 and e.failures.TIMEOUT == e.failed, tostring(e.failed))
      assert.same({ 0, 0 }, { e.paused_during_run, f.paused_during_run })
      both{ workload = { sessions = 30, turns = { 1, 5 }, gap = 100, seed = 9, span = 600 }, code = "true",
        exec_timeout = 4, idle_timeout = 4 }
      both{ trace = FIXTURE, exec_timeout = 60, idle_timeout = 120 }
    end)

    it("a fast GC pass over the old end only gives the same report as the full pass", function()
      -- The fast path's default-policy GC walks from the oldest sandbox up to the
      -- retention cut-off; gc_full makes it ask the policy about every sandbox.
      for _, o in ipairs{
        { workload = { sessions = 80, turns = { 1, 20 }, gap = 200, seed = 5, span = 7200 }, max_age = 600,
          gc_every = 300 },
        { workload = { sessions = 60, turns = { 1, 8 }, gap = 900, seed = 3, span = 7200, lead = 3 },
          max_age = 1200, gc_every = 120, prewarm = true },
        { workload = { sessions = 40, turns = { 1, 4 }, gap = 60, seed = 8, span = 1800 }, max_age = 60,
          gc_every = 30, exec_timeout = 20, idle_timeout = 20 },
      } do
        o.exact = false
        local short = assert(sim.run(o))
        o.gc_full = true
        local full = assert(sim.run(o))
        assert.is_true(short.gc_kills > 0, tostring(short.gc_kills))
        local sv, fv = {}, {}
        for _, k in ipairs(KEYS) do sv[k], fv[k] = short[k], full[k] end
        assert.same(fv, sv)
        assert.same(full.failures, short.failures)
      end
    end)

    it("are chosen by 'exact'; the fast one is the default unless the cap or the rate limit is set", function()
      local o = { trace = turns("a", { 0, 10 }) }
      assert.equal("fast", assert(sim.run(o)).path)
      o.model = { rate_per_s = 5 }
      assert.equal("exact", assert(sim.run(o)).path)
      o.exact = false
      local r, err, code = sim.run(o)
      assert.is_nil(r)
      assert.equal("BAD_REQUEST", code)
      assert.matches("fast path", err)
      assert.has_error(function() sim.run{ trace = turns("a", { 0 }), exact = "yes" } end,
        "bad argument #1 to 'run' ('exact' must be a boolean)")
    end)
  end)

  describe("prewarm", function()
    -- A conversation's turns start 3 s before their runs (the model thinks); the third
    -- turn runs no code. exec = idle = 60: lease 65 s (the 60 s timeout + LEASE_MARGIN),
    -- model defaults: rtt 20 ms, create 500 ms, kernel start 1000 ms, resume 1000 ms.
    local trace = { { t = 10, session = "a", duration = 1, lead = 3 },
      { t = 200, session = "a", duration = 1, lead = 3 },
      { t = 400, session = "a", duration = 1, lead = 3, run = false } }
    local base = { trace = trace, exec_timeout = 60, idle_timeout = 60, gc_every = false, tail = 600, details = true }

    it("without it: the cold start and the resume sit on the run's path", function()
      local r = assert(sim.run(base))
      -- run 1 at 10 s: list 20, create 20 + 500, hooks cell 20 + 1000 (kernel), half a round trip: 1570 ms
      -- run 2 at 200 s (paused at 70.53 s): connect 20 + 1000 (resume), half a round trip: 1030 ms
      assert.same({ 1030, 1570 }, r.latencies_ms)
      assert.same({ 1030, 1570 }, { r.p50_ms, r.p95_ms })
      assert.same({ 3, 2, 1, 1, 0 }, { r.turns, r.runs, r.cold_starts, r.resumes, r.prewarms })
      -- running 10.53..70.53 (created at 10.03 + 500 ms, a 60 s lease: the idle window) and
      -- 201.01..261.01 (resumed at 200.01 + 1 s): 60 + 60
      assert.near(120, r.compute_seconds, 1e-6)
    end)

    it("with it: each run finds its sandbox warm; an unused prewarm is counted and costs compute", function()
      local o = {}
      for k, v in pairs(base) do o[k] = v end
      o.prewarm = true
      local r = assert(sim.run(o))
      -- each run: half a round trip (the prewarm's lease, 3 s old, needs no refresh)
      assert.same({ 10, 10 }, r.latencies_ms)
      assert.same({ 10, 10 }, { r.p50_ms, r.p95_ms })
      assert.same({ 2, 0, 0, 2 }, { r.runs, r.cold_starts, r.resumes, r.warm_hits })
      -- prewarms at 7 s (create + kernel), 197 s (resume) and 397 s (resume, then no run)
      assert.same({ 3, 1, 1, 2, 0 }, { r.prewarms, r.prewarms_unused, r.prewarm_creates, r.prewarm_resumes,
        r.prewarms_failed })
      -- running 7.53..67.53 (created at 7.53, a 60 s lease: the idle window; run 1 sends
      -- nothing but its execute), 198.01..258.01 (resumed at 198.01) and 398.01..458.01
      -- (the unused one): 60 s each
      assert.near(60 + 60 + 60, r.compute_seconds, 1e-5)
      assert.equal(1, r.created)
    end)

    it("is refused by the exact path; the format shows the prewarm columns", function()
      local o = {}
      for k, v in pairs(base) do o[k] = v end
      o.prewarm, o.exact = true, true
      local r, err, code = sim.run(o)
      assert.is_nil(r)
      assert.equal("BAD_REQUEST", code)
      assert.matches("fast path", err)
      o.exact = nil
      local rows = assert(sim.sweep(o, { param = "prewarm", values = { false, true } }))
      local text = sim.format(rows)
      assert.matches("prewarms", text)
      assert.matches("unused", text)
      local csv = sim.csv(rows)
      assert.matches(",prewarm,prewarms,prewarms_unused,", csv, 1, true)
      assert.matches(",true,3,1,", csv, 1, true)
      assert.equal(0, rows[1].prewarms)
      assert.equal(3, rows[2].prewarms)
    end)
  end)

  describe("Retry-After in a simulation", function()
    it("a create refused by the cap waits what the 429 says, in virtual time, then succeeds", function()
      -- keep-alive: a's sandbox runs until its lease ends (created at 0.53 s, lease 10 s:
      -- the idle window; killed at 10.53 s). b's create at 9.03 s and 10.05 s gets
      -- 429 + Retry-After 1 s; the third attempt, at 11.07 s, finds the slot free.
      local trace = { { t = 0, session = "a", duration = 0 }, { t = 9, session = "b", duration = 0 } }
      local r = assert(sim.run{ trace = trace, builtin = "keep-alive", exec_timeout = 10, idle_timeout = 10,
        model = { max_running = 1 }, gc_every = false, tail = 0, details = true })
      assert.same({ 2, 0 }, { r.ok, r.failed })
      assert.same({ 2, 2, 2 }, { r.rejected_cap, r.retries, r.retry_after_waits })
      local b = r.log[2]
      assert.equal("b", b.session)
      -- list 20 ms, two refused creates 20 ms + 1 s each, create 20 + 500 ms, hooks cell
      -- 20 + 1000 ms (kernel start), half a round trip (no extension before the cell: the
      -- watchdog keeps the lease): 3610 ms before b's code ran
      assert.near(3.61, b.code_started - b.start, 1e-6)
      -- without the header the client backs off 0.1-0.4 s: all four attempts fail before 10.53 s
      local r2 = assert(sim.run{ trace = trace, builtin = "keep-alive", exec_timeout = 10, idle_timeout = 10,
        model = { max_running = 1, retry_after = 0 }, gc_every = false, tail = 0 })
      assert.same({ 1, 1, 4 }, { r2.ok, r2.failed, r2.rejected_cap })
    end)
  end)

  describe("the sim lock", function()
    it("waits for a held key in virtual time inside tasks, in arrival order; answers at once elsewhere", function()
      local task = require "warmbox.task"
      local sched = task.scheduler{ backend = task.virtual(0) }
      local new_lock = require("warmbox.sim.lock").factory(sched)
      local order = {}
      sched:spawn(function()
        local lk = new_lock()
        assert.equal(0, lk:lock("k"))
        sched:sleep(5)
        lk:unlock()
      end)
      for i = 1, 2 do
        sched:spawn(function()
          sched:sleep(i)                              -- arrive at 1, then 2
          local lk = new_lock()
          assert.same({ nil, "busy" }, { lk:try_lock("k") })
          local waited = assert(lk:lock("k"))
          order[#order + 1] = { i, sched:now(), waited }
          sched:sleep(1)
          lk:unlock()
        end)
      end
      assert.is_true(sched:loop())
      assert.same({ { 1, 5, 4 }, { 2, 6, 4 } }, order)
      -- outside a task a held key is not waited for
      local a, b = new_lock(), new_lock()
      assert(a:lock("x"))
      assert.same({ nil, "timeout" }, { b:lock("x") })
    end)
  end)

  describe("the model's rules (hand-computed)", function()
    local function m0(opts)
      local o = { rtt_ms = 0, create_ms = 0, resume_ms = 0, pause_ms = 0, kernel_ms = 0 }
      for k, v in pairs(opts or {}) do o[k] = v end
      return model_mod.new(o)
    end

    it("expires leases from a timer heap at their exact times and books running and paused seconds", function()
      local m = m0()
      local t0 = m.now
      local pause = { on_timeout = "pause", auto_resume = true }
      local a = assert(m:create{ timeout = 10, lifecycle = pause })
      local b = assert(m:create{ timeout = 5, lifecycle = pause })
      assert(m:connect(a.sandbox_id, { timeout = 20 }))      -- extends a to t0 + 20
      assert(m:connect(b.sandbox_id, { timeout = 1 }))       -- never shortens b (still t0 + 5)
      m:advance_to(t0 + 6)
      assert.equal("paused", assert(m:info(b.sandbox_id)).state)
      assert.equal("running", assert(m:info(a.sandbox_id)).state)
      m:advance_to(t0 + 21)
      assert.equal("paused", assert(m:info(a.sandbox_id)).state)
      m:close_books()
      assert.equal(25, m.stats.running_seconds)               -- a 0..20, b 0..5
      assert.equal(17, m.stats.paused_seconds)                -- a 20..21, b 5..21
      assert.equal(2, m.stats.auto_pauses)
      -- set_timeout may shorten a running lease: the earlier end is honoured
      local c = assert(m:create{ timeout = 100, lifecycle = pause })
      assert.is_true(m:set_timeout(c.sandbox_id, 3))
      m:advance_to(t0 + 25)
      assert.equal("paused", assert(m:info(c.sandbox_id)).state)
    end)

    it("refuses a create beyond max_running with 429; the client retries after the Retry-After it names", function()
      local m = m0{ max_running = 1 }          -- the cap's 429 says Retry-After: 1
      local pause = { on_timeout = "pause", auto_resume = true }
      local a = assert(m:create{ timeout = 60, lifecycle = pause })
      local t = m.now
      local sb, err, code = m:create{ timeout = 60 }
      assert.is_nil(sb)
      assert.equal("RATE_LIMITED", code)
      assert.matches("429", err)
      -- four attempts (three retries), each 1 s after the last: exactly what the server said
      assert.same({ 4, 3, 3 }, { m.stats.rejected_cap, m.stats.retries, m.stats.retry_after_waits })
      assert.equal(3, m.now - t)
      assert.is_true(m:pause(a.sandbox_id))
      local b = assert(m:create{ timeout = 60, lifecycle = pause })     -- the slot is free again
      t = m.now
      local _, _, ccode = m:connect(a.sandbox_id, { timeout = 60 })    -- would resume: over the cap
      assert.equal("RATE_LIMITED", ccode)
      assert.same({ 4 + 4, 3 + 3 }, { m.stats.rejected_cap, m.stats.retries })
      assert.equal(3, m.now - t)
      assert.is_true(m:kill(b.sandbox_id))
      local _, resumed = assert(m:connect(a.sandbox_id, { timeout = 60 }))
      assert.is_true(resumed)
      assert.equal(1, m.stats.peak_running)
    end)

    it("without a Retry-After backs off exponentially; no retry may end past the 30 s budget", function()
      local m = m0{ max_running = 1, retry_after = 0 }                  -- no Retry-After header
      assert(m:create{ timeout = 60 })
      local t = m.now
      assert.is_nil(m:create{ timeout = 60 })
      assert.same({ 4, 3, 0 }, { m.stats.rejected_cap, m.stats.retries, m.stats.retry_after_waits })
      -- backoff 0.1, 0.2, 0.4 s, each jittered into [half, full]
      assert.is_true(m.now - t >= 0.35 and m.now - t <= 0.7, tostring(m.now - t))
      -- Retry-After 20 s: the first retry waits it, a second would end at 40 s > 30 s
      local m2 = m0{ max_running = 1, retry_after = 20 }
      assert(m2:create{ timeout = 60 })
      t = m2.now
      assert.is_nil(m2:create{ timeout = 60 })
      assert.same({ 2, 1 }, { m2.stats.rejected_cap, m2.stats.retries })
      assert.equal(20, m2.now - t)
    end)

    it("limits the control plane's request rate with a token bucket; its 429 names the wait for a token", function()
      local m = m0{ rate_per_s = 2, rate_burst = 2 }
      assert(m:create{ timeout = 60 })
      assert(m:create{ timeout = 60 })
      local t = m.now
      -- the bucket is empty: 429 with Retry-After ceil(0.5 s) = 1 s; after it, a token is there
      local sb = assert(m:create{ timeout = 60 })
      assert.truthy(sb.sandbox_id)
      assert.same({ 1, 1, 1 }, { m.stats.rejected_rate, m.stats.retries, m.stats.retry_after_waits })
      assert.equal(1, m.now - t)
      assert.equal(3, m.stats.creates)
    end)

    it("lists by metadata from its index: only the matching live sandboxes, newest first", function()
      local m = m0()
      local ids = {}
      for i = 1, 5 do
        ids[i] = assert(m:create{ timeout = 60, metadata = { k = i % 2 == 0 and "even" or "odd" } }).sandbox_id
        m:advance_to(m.now + 1)
      end
      assert.is_true(m:kill(ids[3]))
      local odd = m:list_all{ metadata = { k = "odd" } }
      assert.same({ ids[5], ids[1] }, { odd[1].sandbox_id, odd[2].sandbox_id })
      assert.equal(2, #odd)
      assert.same({}, m:list_all{ metadata = { k = "none" } })
      assert.equal(4, #m:list_all{})
    end)
  end)

  describe("workloads", function()
    it("draws Poisson arrivals, heavy tails and abandonment, reproducibly from the seed", function()
      local w = { sessions = 400, arrival = "poisson", span = 4000, turns = { dist = "pareto", alpha = 1.5, min = 2 },
        gap = { dist = "lognormal", median = 60, sigma = 1 }, duration = { dist = "exp", mean = 2 }, abandon = 0.2,
        seed = 11 }
      local a, b = sim.workload(w), sim.workload(w)
      assert.same(a, b)
      local per, first = {}, {}
      for _, e in ipairs(a) do
        per[e.session] = (per[e.session] or 0) + 1
        first[e.session] = first[e.session] or e.t
      end
      -- abandonment: the mean number of turns is far below the Pareto mean (3 * min = 6)
      local n, total = 0, 0
      for _, c in pairs(per) do n, total = n + 1, total + c end
      assert.equal(400, n)
      assert.is_true(total / n < 4.5 and total / n > 1.5, tostring(total / n))
      -- Poisson arrivals: the last arrival is near the span, the mean gap near span / sessions
      local starts = {}
      for _, t in pairs(first) do starts[#starts + 1] = t end
      table.sort(starts)
      assert.is_true(starts[#starts] > 3000 and starts[#starts] < 5000, tostring(starts[#starts]))
      -- another seed, another workload
      w.seed = 12
      assert.is_not.same(a, sim.workload(w))
    end)

    it("gives the same report for the same seed with overlap, caps and heavy tails", function()
      local o = { workload = { sessions = 60, arrival = "poisson", span = 600,
        turns = { dist = "lognormal", median = 4, sigma = 0.8 }, gap = { dist = "pareto", alpha = 1.2, min = 5 },
        abandon = 0.1, seed = 5 }, model = { max_running = 20 }, details = true }
      local a, b = assert(sim.run(o)), assert(sim.run(o))
      assert.same(a, b)
      assert.is_true(a.peak_running > 1)
    end)

    it("puts each run `lead` seconds after its turn's start; `no_run` turns run nothing", function()
      local w = { sessions = 5, turns = { 3, 3 }, gap = 100, seed = 1 }
      local a = sim.workload(w)
      w.lead = 2
      local b = sim.workload(w)
      assert.equal(#a, #b)
      -- a fixed lead draws nothing: the same turns, the k-th of a conversation 2k s later
      local k = {}
      for i, e in ipairs(b) do
        k[e.session] = (k[e.session] or 0) + 1
        assert.equal(2, e.lead)
        local same
        for _, x in ipairs(a) do
          if x.session == e.session and math.abs(x.t + 2 * k[e.session] - e.t) < 1e-9 then same = x end
        end
        assert.truthy(same, "turn " .. i)
        assert.is_nil(e.run)
      end
      w.no_run = 0.5
      local c = sim.workload(w)
      local skipped = 0
      for _, e in ipairs(c) do if e.run == false then skipped = skipped + 1 end end
      assert.is_true(skipped > 0 and skipped < #c, tostring(skipped))
      assert.same(c, sim.workload(w))          -- reproducible from the seed
      assert.has_error(function() sim.workload{ sessions = 1, no_run = 2 } end,
        "bad argument #1 to 'workload' ('no_run' must be a probability in [0, 1])")
    end)

    it("rejects bad distributions", function()
      assert.has_error(function() sim.workload{ sessions = 1, gap = { dist = "zipf" } } end)
      assert.has_error(function() sim.workload{ sessions = 1, gap = { dist = "pareto", alpha = 0, min = 1 } } end)
      assert.has_error(function() sim.workload{ sessions = 1, turns = { dist = "lognormal", median = 2 } } end)
      assert.has_error(function() sim.workload{ sessions = 1, abandon = 1 } end)
      assert.has_error(function() sim.workload{ sessions = 1, arrival = "bursty" } end)
    end)
  end)

  describe("built-in policies", function()
    it("compares them on one trace: state lost, sandboxes made, paused hours", function()
      -- one conversation: turns 0 s and 1000 s apart (past the 300 s idle window)
      local rows = assert(sim.compare({ trace = turns("a", { 0, 10, 1000 }), gc_every = false, tail = 3600,
        prices = { paused_second = 1 / 3600 } }))
      local by = {}
      for _, r in ipairs(rows) do by[r.value] = r end
      assert.same({ "reference", "pause-per-turn", "no-reuse", "keep-alive", "default" },
        { rows[1].value, rows[2].value, rows[3].value, rows[4].value, rows[5].value })
      -- no reuse: a fresh sandbox per call, killed after it; every later turn lost its state
      assert.same({ 3, 3, 3, 0 }, { by["no-reuse"].cold_starts, by["no-reuse"].created, by["no-reuse"].kills,
        by["no-reuse"].resumes })
      assert.same({ 1, 2 }, { by["no-reuse"].conversations_lost_state, by["no-reuse"].turns_lost_state })
      -- keep-alive: killed at the end of the idle window, so the turn at 1000 s starts cold
      assert.same({ 2, 1, 0 }, { by["keep-alive"].cold_starts, by["keep-alive"].conversations_lost_state,
        by["keep-alive"].paused_hours })
      -- pause-per-turn: paused after every turn, resumed at every later one, never lost
      assert.same({ 1, 2, 0 }, { by["pause-per-turn"].cold_starts, by["pause-per-turn"].resumes,
        by["pause-per-turn"].conversations_lost_state })
      assert.is_true(by["pause-per-turn"].compute_seconds < by["default"].compute_seconds / 10)
      -- reference and default: paused, then resumed with its state
      for _, name in ipairs{ "reference", "default" } do
        assert.same({ 1, 1, 0 }, { by[name].cold_starts, by[name].resumes, by[name].conversations_lost_state })
        assert.is_true(by[name].paused_hours > 0.5)
        assert.near(by[name].paused_hours, by[name].storage_cost, 1e-9)   -- $1 per paused hour
      end
    end)

    it("reference GC kills by creation age even when the conversation is active; default does not", function()
      local times = {}
      for h = 0, 26, 2 do times[#times + 1] = h * 3600 end
      local rows = assert(sim.compare({ trace = turns("a", times), tail = 0 }, { "reference", "default" }))
      assert.same({ 2, 1 }, { rows[1].cold_starts, rows[1].conversations_lost_state })
      assert.equal(1, rows[1].gc_kills)
      assert.same({ 1, 0, 0 }, { rows[2].cold_starts, rows[2].conversations_lost_state, rows[2].gc_kills })
    end)

    it("rejects unknown names", function()
      assert.has_error(function() sim.compare({ trace = {} }, { "nope" }) end)
      assert.has_error(function() sim.compare({ trace = {}, policy = {} }) end)
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

    it("reads the same trace as CSV (a header naming the columns)", function()
      local a = assert(sim.load_trace(FIXTURE))
      local b = assert(sim.load_trace("spec/fixtures/sim_trace.csv"))
      assert.same(a, b)
      local t, err, code = sim.parse_csv_trace('t,session\n1,"a"\n')
      assert.is_nil(t)
      assert.matches("quoted", err)
      assert.equal("BAD_REQUEST", code)
      t, err = sim.parse_csv_trace("t,who\n1,a\n")
      assert.is_nil(t)
      assert.matches("unknown column 'who'", err)
      t, err = sim.parse_csv_trace("t,session\n1,a,3\n")
      assert.is_nil(t)
      assert.matches("3 fields", err)
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

  describe(".plot()", function()
    local rows
    lazy_setup(function()
      rows = assert(sim.sweep({ trace = FIXTURE, exec_timeout = 60 }, { param = "idle_timeout", values = { 60, 900 } }))
    end)

    it("writes the built-in SVG for a path that is not .png", function()
      local path = os.tmpname()
      assert.equal("svg", sim.plot(rows, path, { gnuplot = "/nonexistent/gnuplot" }))
      local f = assert(io.open(path))
      local svg = f:read("a")
      f:close()
      os.remove(path)
      assert.equal(sim.chart(rows), svg)
      local ok, err, code = sim.plot(rows, "/nonexistent/dir/c.svg", { gnuplot = false })
      assert.is_nil(ok)
      assert.matches("cannot write", err)
      assert.equal("IO", code)
    end)

    it("hands gnuplot a script that plots every row to the given file", function()
      -- a stand-in gnuplot that keeps the script and data it was given and writes the output
      local dir = os.tmpname()
      os.remove(dir)
      os.execute("mkdir -p " .. dir)
      local fake = dir .. "/gnuplot"
      local f = assert(io.open(fake, "w"))
      f:write("#!/bin/sh\ncp \"$1\" " .. dir .. "/got.gp\n"
        .. "data=$(sed -n 's/^plot \"\\([^\"]*\\)\".*/\\1/p' \"$1\")\ncp \"$data\" " .. dir .. "/got.data\n"
        .. "out=$(sed -n 's/^set output \"\\(.*\\)\"$/\\1/p' \"$1\")\necho plotted > \"$out\"\n")
      f:close()
      os.execute("chmod +x " .. fake)
      local out = dir .. "/chart.png"
      assert.equal("gnuplot", sim.plot(rows, out, { gnuplot = fake, python = false }))
      local function read(p)
        local h = assert(io.open(p))
        local t = h:read("a")
        h:close()
        return t
      end
      assert.equal("plotted\n", read(out))
      local gp = read(dir .. "/got.gp")
      assert.matches("set terminal pngcairo", gp, 1, true)
      assert.matches("p95 added latency", gp, 1, true)
      local data = read(dir .. "/got.data")
      local _, n = data:gsub("\n", "")
      assert.equal(2, n)
      assert.matches('"900"', data, 1, true)
      os.execute("rm -rf " .. dir)
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

  describe("checkpoints", function()
    local rules = require "warmbox.policy.rules"
    -- Three turns of one conversation at 0, 100 and 200 s (1 s runs), round trips free.
    -- Turn 1: create 0.5 s + kernel start 1 s + run 1 s ends at 2.5 s; the checkpoint
    -- the hook asks for then takes snapshot_ms (2 s, the default): stored from 4.5 s.
    -- Turns 2 and 3 are warm (the 300 s idle lease): they end at 101 and 201 s, their
    -- checkpoints are stored from 103 and 203 s. GC passes at 1000 and 2000 s (the
    -- horizon: the last run's end 201 + tail 1799). At 1000 s max_checkpoints = 2
    -- deletes the oldest (rank 3); at 2000 s two are left, both kept.
    -- Each stores snapshot_gb (10 GiB, the default) + the sandbox's 2 GiB of RAM = 12 GiB:
    --   (1000 - 4.5) + (2000 - 103) + (2000 - 203) = 4689.5 s x 12 GiB = 15.6316... GiB-hours,
    -- at $0.73 per GiB-month of 730 h: 15.6316... / 730 x 0.73 = $0.0156316...
    local function cp_run(extra)
      local o = { trace = turns("a", { 0, 100, 200 }), model = { rtt_ms = 0 }, gc_every = 1000, tail = 1799,
        policy = { checkpoint = function() return true end,
          checkpoint_gc = rules.checkpoints{ max_checkpoints = 2 } } }
      for k, v in pairs(extra or {}) do o[k] = v end
      return assert(sim.run(o))
    end

    it("takes one after each run the policy's hook asks for, prunes them by the rules and books their storage",
      function()
      local r = cp_run{ prices = { snapshot_gib_month = 0.73 } }
      assert.equal("exact", r.path)
      assert.equal(3, r.ok)
      assert.equal(3, r.checkpoints_taken)
      assert.equal(1, r.checkpoints_deleted)
      assert.equal(3, r.peak_checkpoints)
      assert.equal(2, r.checkpoints_alive)
      assert.near(4689.5 * 12 / 3600, r.checkpoint_gib_hours, 1e-9)
      assert.near(4689.5 * 12 / 3600 / 730 * 0.73, r.checkpoint_cost, 1e-12)
      assert.near(r.compute_cost + r.storage_cost + r.checkpoint_cost, r.cost, 1e-12)
      local text = sim.format(r)
      assert.matches("cp deleted", text, 1, true)
      assert.matches("checkpoint storage: $0.73 per GiB-month (assumed)", text, 1, true)
    end)

    it("stores snapshot_gb plus the RAM, priced 0 by default (E2B publishes no snapshot price)", function()
      -- snapshot_gb = 2: 2 + 2 GiB each, the same times: 4689.5 s x 4 GiB.
      local r = cp_run{ model = { rtt_ms = 0, snapshot_gb = 2 } }
      assert.near(4689.5 * 4 / 3600, r.checkpoint_gib_hours, 1e-9)
      assert.equal(0, r.checkpoint_cost)
      assert.matches("checkpoint storage: $0 per GiB-month (E2B publishes no snapshot price)", sim.format(r), 1, true)
    end)

    it("prunes by age with checkpoint_after, on the simulated clock", function()
      -- Turn 1 ends at 2.5 s: its checkpoint is stored from 4.5 s. The default policy pauses the
      -- sandbox after its idle lease, so turn 2 (due at 1500 s) resumes it (1 s) and ends at
      -- 1502 s: its checkpoint is stored from 1504 s. GC every 1000 s, horizon 1501 + 1499 =
      -- 3000 s, checkpoint_after = 1000 s: at 1000 s the first is 995.5 s old (kept), at 2000 s
      -- deleted; the second is deleted at 3000 s (1496 s old). Stored: 1995.5 + 1496 s x 12 GiB.
      local r = assert(sim.run{ trace = turns("a", { 0, 1500 }), model = { rtt_ms = 0 }, gc_every = 1000,
        tail = 1499, policy = { checkpoint = function() return true end,
          checkpoint_gc = rules.checkpoints{ checkpoint_after = 1000 } } })
      assert.equal(1, r.resumes)
      assert.equal(2, r.checkpoints_taken)
      assert.equal(2, r.checkpoints_deleted)
      assert.equal(2, r.peak_checkpoints)   -- both alive from 1504 to 2000 s
      assert.equal(0, r.checkpoints_alive)
      assert.near((1995.5 + 1496) * 12 / 3600, r.checkpoint_gib_hours, 1e-9)
    end)

    it("makes a turn that comes while one is being taken wait for it (snapshot_ms)", function()
      -- Turn 1 ends at 2.5 s and its checkpoint takes snapshot_ms; turn 2 is due at 3 s and
      -- its code starts when the checkpoint is done: 2.5 + 2 = 4.5 s (1.5 s added), or with
      -- snapshot_ms = 1000 at 3.5 s (0.5 s added); without a checkpoint at once.
      local function wait_of(model, hook)
        local r = assert(sim.run{ trace = turns("a", { 0, 3 }), model = model, details = true,
          gc_every = false, policy = { checkpoint = hook } })
        local second = r.log[2]
        return second.code_started - second.due, r.checkpoints_taken
      end
      local only_first = function(info) return info.turn == 1 end
      local w, n = wait_of({ rtt_ms = 0 }, only_first)
      assert.near(1.5, w, 1e-6)
      assert.equal(1, n)
      assert.near(0.5, (wait_of({ rtt_ms = 0, snapshot_ms = 1000 }, only_first)), 1e-6)
      assert.near(0, (wait_of({ rtt_ms = 0 }, function() return false end)), 1e-6)
    end)

    it("takes the exact path when checkpoints are on; the fast path refuses them", function()
      local r = cp_run()
      assert.equal("exact", r.path)
      local none, msg, code = sim.run{ trace = turns("a", { 0 }), exact = false,
        policy = { checkpoint = function() return true end } }
      assert.is_nil(none)
      assert.equal("BAD_REQUEST", code)
      assert.matches("exact path only", msg, 1, true)
    end)

    it("reads --snapshot-ms, --snapshot-gb and --snapshot-price in the CLI", function()
      local out, err = sink(), sink()
      local policy = os.tmpname()
      local f = assert(io.open(policy, "w"))
      f:write("return { checkpoint = function() return true end }\n")
      f:close()
      local status = require("warmbox.cli").main({ "simulate", "--trace", FIXTURE, "--policy", policy,
        "--snapshot-ms", "500", "--snapshot-gb", "5", "--snapshot-price", "0.1", "--paused-price", "0.02" },
        { stdout = out, stderr = err })
      os.remove(policy)
      assert.equal(0, status, err:text())
      local text = out:text()
      assert.matches("exact path", text, 1, true)
      assert.matches("checkpoints", text, 1, true)
      assert.matches("checkpoint storage: $0.1 per GiB-month (assumed)", text, 1, true)
      assert.matches("paused storage: $0.02 per sandbox-hour (assumed)", text, 1, true)
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

    it("compares the built-in policies and writes the rows as CSV", function()
      local out, err = sink(), sink()
      local csv = os.tmpname()
      local status = require("warmbox.cli").main({ "simulate", "--trace", FIXTURE, "--policies", "all",
        "--paused-price", "0.02", "--csv", csv }, { stdout = out, stderr = err })
      assert.equal(0, status, err:text())
      local text = out:text()
      for _, name in ipairs{ "reference", "pause%-per%-turn", "no%-reuse", "keep%-alive", "default" } do
        assert.matches("\n" .. name .. " ", text)
      end
      assert.matches("lost state", text)
      assert.matches("paused storage: $0.02 per sandbox-hour (assumed)", text, 1, true)
      assert.matches("compute by size: 2 vCPU / 2048 MiB, at $0.000014 per vCPU-second and $0.0000045 per "
        .. "GiB-second (E2B's pricing page)", text, 1, true)
      local f = assert(io.open(csv))
      local lines = {}
      for l in f:lines() do lines[#lines + 1] = l end
      f:close()
      os.remove(csv)
      assert.equal(6, #lines)
      assert.equal(table.concat(sim.CSV_FIELDS, ","), lines[1])
      assert.matches("^pause%-per%-turn,policy,pause%-per%-turn,", lines[3])
      assert.matches("^no%-reuse,policy,no%-reuse,3,10,", lines[4])
      out, err = sink(), sink()
      status = require("warmbox.cli").main({ "simulate", "--trace", FIXTURE, "--policies", "fast" },
        { stdout = out, stderr = err })
      assert.equal(2, status)
      assert.matches("unknown policy 'fast'", err:text())
    end)

    it("takes distributions, arrivals and the cap on the command line", function()
      local out, err = sink(), sink()
      local status = require("warmbox.cli").main({ "simulate", "--sessions", "30", "--arrival", "poisson",
        "--turns", "pareto:1.5:2", "--gap", "lognormal:60:1", "--abandon", "0.1", "--max-running", "5",
        "--seed", "3" }, { stdout = out, stderr = err })
      assert.equal(0, status, err:text())
      assert.matches("30 conversations", out:text())
      out, err = sink(), sink()
      status = require("warmbox.cli").main({ "simulate", "--gap", "lognormal:60" }, { stdout = out, stderr = err })
      assert.equal(2, status)
      assert.matches("lognormal needs median:sigma", err:text())
    end)

    it("compares prewarm off and on with a lead; --exact picks the real session code", function()
      local out, err = sink(), sink()
      local csv = os.tmpname()
      local status = require("warmbox.cli").main({ "simulate", "--sessions", "40", "--turns", "2-6", "--gap", "600",
        "--lead", "3", "--no-run", "0.2", "--idle-timeout", "60", "--prewarm", "off,on", "--seed", "2",
        "--csv", csv }, { stdout = out, stderr = err })
      assert.equal(0, status, err:text())
      local text = out:text()
      assert.matches("fast path", text)
      assert.matches("prewarm%s+runs.*prewarms%s+unused", text)
      local f = assert(io.open(csv))
      local rows = {}
      local header
      for l in f:lines() do
        local cells = {}
        for c in (l .. ","):gmatch("([^,]*),") do cells[#cells + 1] = c end
        if not header then
          header = {}
          for i, h in ipairs(cells) do header[h] = i end
        else
          rows[#rows + 1] = cells
        end
      end
      f:close()
      os.remove(csv)
      local function v(row, k) return tonumber(row[header[k]]) or row[header[k]] end
      local off, on = rows[1], rows[2]
      assert.same({ "false", "true" }, { v(off, "prewarm"), v(on, "prewarm") })
      -- the same turns, some without a run; off: cold starts and resumes on the runs' path
      assert.equal(v(off, "turns"), v(on, "turns"))
      assert.equal(v(off, "runs"), v(on, "runs"))
      assert.is_true(v(off, "runs") < v(off, "turns"))
      assert.equal(40, v(off, "cold_starts"))
      assert.is_true(v(off, "resumes") > 0)
      -- on: every turn prewarmed (those without a run too), every run warm, and it costs compute
      assert.same({ 0, 0 }, { v(on, "cold_starts"), v(on, "resumes") })
      assert.equal(v(on, "turns"), v(on, "prewarms"))
      assert.equal(v(on, "turns") - v(on, "runs"), v(on, "prewarms_unused"))
      assert.is_true(v(on, "p95_ms") < v(off, "p95_ms"))
      assert.is_true(v(on, "compute_seconds") > v(off, "compute_seconds"))
      out, err = sink(), sink()
      status = require("warmbox.cli").main({ "simulate", "--sessions", "3", "--exact", "--max-running", "1",
        "--retry-after", "2" }, { stdout = out, stderr = err })
      assert.equal(0, status, err:text())
      assert.matches("exact path", out:text())
      out, err = sink(), sink()
      status = require("warmbox.cli").main({ "simulate", "--sessions", "3", "--prewarm", "maybe" },
        { stdout = out, stderr = err })
      assert.equal(2, status)
      assert.matches("--prewarm needs on, off, jit or a list", err:text(), 1, true)
      out, err = sink(), sink()
      status = require("warmbox.cli").main({ "simulate", "--sessions", "3", "--prewarm", "on", "--exact" },
        { stdout = out, stderr = err })
      assert.equal(2, status) -- warmbox failed (refused the combination); 1 is for a cell that raised
      assert.matches("fast path only", err:text())
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
