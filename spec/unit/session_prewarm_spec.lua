-- s:prewarm's decisions against the fake E2B client (every call recorded), a
-- memory lock, a clock the spec moves, and a real runner (the fake answers at
-- once, so a prewarm task runs to its end within one round).
local session = require "warmbox.session"
local runner = require "warmbox.runner"
local outputs = require "warmbox.outputs"
local fakes = require "spec.helpers.fakes"
local fake_e2b = require "spec.helpers.fake_e2b"

local function setup()
  local t = { now = 1000000 }
  local clock = function() return t.now end
  local client = fake_e2b.new{ clock = clock }
  local rn = assert(runner.new())
  local events, counters = {}, {}
  local n = 0
  local function mk(key, extra)
    n = n + 1
    local opts = { client = client, lock = { backend = "memory" }, clock = clock, hmac = fakes.hmac,
      sha256 = fakes.hash, exec_timeout = 60, idle_timeout = 300, counters = counters,
      runner = function() return rn end,
      on_event = function(name, info) events[#events + 1] = { name = name, info = info } end }
    for k, v in pairs(extra or {}) do opts[k] = v end
    return session.new(key .. ":" .. n, opts)
  end
  return { t = t, client = client, runner = rn, events = events, counters = counters, new = mk }
end

local function last_event(e, name)
  for i = #e.events, 1, -1 do
    if e.events[i].name == name then return e.events[i].info end
  end
end

describe("s:prewarm", function()
  it("creates a new conversation's sandbox and starts its kernel; the run then sends the user's cell alone",
    function()
    local e = setup()
    local s = e.new("pw:new")
    local p = s:prewarm()
    assert.is_true(p:done())                -- outside tasks: started, and the fake answered at once
    local info = assert(p:result())
    assert.equal("created", info.action)
    assert.equal(1, e.client:count("create"))
    assert.same({ outputs.PRELUDE }, e.client:codes())
    assert.same({ ok = true, action = "created", sandbox_id = info.sandbox_id, resumed = false },
      last_event(e, "prewarm"))
    local r = assert(s:run("1 + 1"))
    assert.equal(info.sandbox_id, r.sandbox_id)
    assert.equal(1, e.client:count("create"))
    assert.same({ outputs.PRELUDE, "1 + 1" }, e.client:codes())
    assert.equal(1, s:stats().prewarm_ready)
  end)

  it("resolves as a run does: keeps one tagged sandbox, reaps duplicates, never takes another fingerprint's",
    function()
    local e = setup()
    local s = e.new("pw:dups")
    local other = e.new("pw:dups", { actor = "mallory" })   -- another tag value (key and fingerprint)
    e.client:add("sb-other", other.tag_value, "running")
    e.client:add("sb2", s.tag_value, "paused")
    e.client:add("sb1", s.tag_value, "running")            -- listed first
    local info = assert(s:prewarm():result())
    assert.equal("sb1", info.sandbox_id)
    assert.equal("extended", info.action)
    assert.same({ "kill sb2" }, e.client:calls_of("kill"))
    assert.equal(0, e.client:count("create"))
    -- a session whose fingerprint matches no sandbox gets its own, the others untouched
    local t = e.new("pw:alone", { actor = "alice" })
    assert.equal("created", (assert(t:prewarm():result())).action)
    assert.same({ "kill sb2" }, e.client:calls_of("kill"))
    assert.is_nil(e.client.sb["sb-other"].killed)
  end)

  it("does nothing while the remembered lease has a run's margin (half of it, or `within`), else extends it",
    function()
    local e = setup()
    local s = e.new("pw:warm")
    assert(s:run("x = 1"))                  -- lease 300 s (the idle window) from now
    local before = #e.client.calls
    e.t.now = e.t.now + 100
    assert.equal("warm", (assert(s:prewarm():result())).action)            -- 200 s left >= 60
    assert.equal("warm", (assert(s:prewarm{ within = 150 }:result())).action)  -- 200 s left >= 150
    assert.equal(before, #e.client.calls)
    e.t.now = e.t.now + 51                  -- 149 s left: less than half the lease
    local p = s:prewarm{ within = 150 }
    assert.equal("extended", (assert(p:result())).action)
    assert.same({ "connect" }, { e.client.calls[before + 1][1] })
    assert.equal(before + 1, #e.client.calls)
    assert.equal(2, s:stats().prewarm_warm)
  end)

  it("resumes a paused sandbox now even where a run would leave it to the execute (auto-resume)", function()
    local e = setup()
    -- With `parallel`, a run on a paused auto-resume sandbox sends the execute alone;
    -- a prewarm must not leave the resume to a later execute.
    -- (a parallel that runs the main part alone: no watchdog, no alongside extension)
    local s = e.new("pw:paused", { parallel = function(main) return nil, main() end })
    assert(s:run("x = 1"))
    local id = s:state().sandbox_id
    assert(e.client:pause(id))
    e.t.now = e.t.now + 400                 -- past the lease and PAUSE_GRACE
    local info = assert(s:prewarm():result())
    assert.equal("resumed", info.action)
    assert.is_true(info.resumed)
    assert.equal(id, info.sandbox_id)
    assert.equal("running", e.client.sb[id].state)
    assert.equal(e.t.now + 300, s:state().lease_end)
    -- the kernel kept its memory and its hook: no cell was sent
    assert.same({ outputs.PRELUDE, "x = 1" }, e.client:codes())
  end)

  it("is skipped (busy) when the session is locked; a second prewarm in flight returns the first's task",
    function()
    local e = setup()
    local s = e.new("pw:busy")
    local lk = require("warmbox.lock").new{ backend = "memory" }
    assert(lk:lock(s.tag_value))
    local p = s:prewarm()
    assert.equal("busy", (assert(p:result())).action)
    assert.equal(0, #e.client.calls)
    assert.equal(1, s:stats().prewarm_busy)
    lk:unlock()
    local t = e.runner:spawn(function()
      local a = s:prewarm()
      local b = s:prewarm()
      assert.equal(a, b)
      return a
    end)
    assert(e.runner:loop())
    assert.equal("created", (assert((t:result()):result())).action)
    assert.equal(1, e.client:count("create"))
  end)

  it("a run in a task waits for the prewarm in flight, then does none of its work", function()
    local e = setup()
    local s = e.new("pw:join")
    local order = {}
    local t = e.runner:spawn(function()
      local p = s:prewarm()
      assert.is_false(p:done())             -- inside a task: it starts at the next round
      local r = assert(s:run("1"))
      order[#order + 1] = p:done() and "prewarm done before the run returned" or "run first"
      return r
    end)
    assert(e.runner:loop())
    local r = assert(t:result())
    assert.same({ "prewarm done before the run returned" }, order)
    assert.equal(1, e.counters.prewarm_waits)
    assert.equal(1, e.client:count("create"))
    -- the prewarm's two (the resolve, and what else its create made); the run found it remembered
    assert.equal(2, e.client:count("list"))
    assert.equal(r.sandbox_id, last_event(e, "prewarm").sandbox_id)
  end)

  it("just in time: waits until JIT_LEAD before `within` ends; a run that comes first cancels it", function()
    local e = setup()
    local decide = require "warmbox.session.decide"
    local s = e.new("pw:jit")
    local p = s:prewarm{ within = decide.JIT_LEAD + 0.2, just_in_time = true }
    assert.is_false(p:done())
    assert.equal(0, #e.client.calls)        -- nothing yet: the run is not coming before 0.2 s
    assert(e.runner:loop())
    assert.equal("created", (assert(p:result())).action)
    assert.equal(1, e.client:count("create"))
    -- a run before the prewarm's time: it does the work itself, the prewarm is cancelled
    local s2 = e.new("pw:jit-overtaken")
    local p2 = s2:prewarm{ within = 600, just_in_time = true }
    assert(s2:run("1"))
    assert.is_true(p2:done())
    assert.equal(1, s2:stats().prewarm_cancelled)
    assert.equal(2, e.client:count("create"))
    -- without `within` it starts at once, as ever
    local s3 = e.new("pw:jit-now")
    local p3 = s3:prewarm{ just_in_time = true }
    assert.equal("created", (assert(p3:result())).action)
  end)

  it("a failure is silent: no raise, an event, a count; the run does the work", function()
    local e = setup()
    local s = e.new("pw:fail")
    e.client.fail.create = "RATE_LIMITED"
    local ok, msg, code = s:prewarm():result()
    assert.is_nil(ok)
    assert.equal("RATE_LIMITED", code)
    assert.equal("create failed", msg)
    local ev = last_event(e, "prewarm")
    assert.same({ ok = false, action = "failed", code = "RATE_LIMITED", message = "create failed" }, ev)
    assert.equal(1, s:stats().prewarm_failed)
    e.client.fail.create = nil
    assert(s:run("1"))
    -- a raise inside (here the client) is caught and reported the same way
    local s2 = e.new("pw:raise")
    e.client.list_all = function() error("boom") end
    ok, msg, code = s2:prewarm():result()
    assert.is_nil(ok)
    assert.equal("TASK", code)
    assert.matches("boom", msg)
    assert.equal(2, s2:stats().prewarm_failed)  -- one table: the counters are shared
  end)

  it("a blocking run finishes the session's prewarm first (the engine is driven meanwhile)", function()
    local e = setup()
    local s = e.new("pw:drive")
    -- Create and connect take 50 ms of the runner's clock (a request in flight).
    for _, name in ipairs({ "create", "connect" }) do
      local f = e.client[name]
      e.client[name] = function(c, ...)
        e.runner.sched:sleep(0.05)
        return f(c, ...)
      end
    end
    local p = s:prewarm()
    assert.is_false(p:done())               -- returned while the create is in flight
    local r = assert(s:run("1"))            -- outside tasks: drives the runner until the prewarm ends
    assert.is_true(p:done())
    assert.equal(1, e.counters.prewarm_waits)
    assert.equal("created", (assert(p:result())).action)
    assert.equal(r.sandbox_id, (p:result()).sandbox_id)
    assert.equal(1, e.client:count("create"))
    -- s:state() likewise waits for a prewarm in flight rather than for the lock it holds
    e.t.now = e.t.now + 1000
    local q = s:prewarm()
    assert.is_false(q:done())
    assert.equal(r.sandbox_id, s:state().sandbox_id)
    assert.is_true(q:done())
  end)

  it("a blocking lock wait lets a prewarm holding that lock finish (e.g. wb:release of the key)", function()
    local e = setup()
    local s = e.new("pw:lockwait", { lock = { backend = "memory", timeout = 2 } })
    local create = e.client.create
    e.client.create = function(c, ...)
      e.runner.sched:sleep(0.05)
      return create(c, ...)
    end
    local p = s:prewarm()
    assert.is_false(p:done())
    -- Another session object of the same tag, under another origin: not in the
    -- prewarm table, so it meets the prewarm's lock; its blocking wait drives the runner.
    local other = session.new(s.key, { client = e.client, lock = { backend = "memory", timeout = 2 },
      hmac = fakes.hmac, sha256 = fakes.hash, origin = "elsewhere" })
    assert.equal(s.tag_value, other.tag_value)
    assert(other:state())
    assert.is_true(p:done())
    assert.equal("created", (assert(p:result())).action)
  end)

  it("raises on misuse", function()
    local e = setup()
    local s = e.new("pw:misuse")
    assert.has_error(function() s:prewarm{ within = 0 } end,
      "bad argument #1 to 'prewarm' (option 'within': positive number of seconds up to max_run_length "
      .. "expected, got 0)")
    assert.has_error(function() s:prewarm{ within = 0 / 0 } end)
    assert.has_error(function() s:prewarm{ within = 1e9 } end)
    assert.has_error(function() s:prewarm{ language = "python" } end,
      "bad argument #1 to 'prewarm' (unknown option 'language')")
    assert.has_error(function() s.prewarm({}) end, "bad self to 'prewarm' (warmbox.Session expected)")
  end)
end)
