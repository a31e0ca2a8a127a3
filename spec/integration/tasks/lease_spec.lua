-- one round trip per warm run in the default configuration
-- (exec_timeout = idle_timeout: the lease is the run's timeout +
-- LEASE_MARGIN, so every run in a later second than the last extension
-- extends it; the session's clock is os.time moved on by the spec): when the
-- remembered lease still has a safe margin, the extension (connect) goes out
-- alongside the execute, in a task or in a blocking call alike; a failing
-- extension is retried while the cell runs; when it cannot be secured before
-- the lease ends the cell is interrupted and reported, never paused
-- underneath (warmboxd's pause_during_run stays 0, checked by env:stop).
local sessions = require "spec.helpers.sessions"
local wbd = require "spec.helpers.warmboxd"
local session = require "warmbox.session"
local decide = require "warmbox.session.decide"

describe("tasks: the lease extension goes alongside the execute (warmboxd)", function()
  local env = sessions.new()
  local wb

  lazy_setup(function()
    env:start()
    wb = env:warmbox{ exec_timeout = 300, idle_timeout = 300 }
  end)
  lazy_teardown(function() env:stop() end)

  -- A session of wb that logs its events and the cell's first output, in
  -- order. Its clock is os.time moved on by `s.moved` seconds (next_second,
  -- o.on_failed_connect).
  -- every run's own events, left out of these logs
  local RUN_EVENTS = { lock_wait = true, lease = true, reuse = true, resume = true, run_start = true,
    outputs = true, run_end = true }
  local function logged(key, log, o)
    o = o or {}
    local s
    s = session.new(key, { client = wb.client, lock = { backend = "file", dir = env.lockdir },
      exec_timeout = o.exec_timeout or 300, idle_timeout = o.idle_timeout or 300,
      parallel = wb.parallel, origin = wb.origin,
      clock = function() return (o.frozen_at or os.time()) + s.moved end,
      on_event = function(name, info)
        if RUN_EVENTS[name] then return end
        log[#log + 1] = name .. (info.alongside and "+" or "") .. (info.ok == false and "!" or "")
        if name == "connect" and info.ok == false and o.on_failed_connect then o.on_failed_connect(s) end
      end })
    s.moved = 0
    return s
  end

  local CELL = "import time\nprint('started', flush=True)\ntime.sleep(1)\n'done'"

  -- Moves s's clock past the second its lease (of `lease` s) was set: until
  -- then it covers a run of the lease less LEASE_MARGIN, which makes no request.
  local function next_second(s, lease)
    local set_at = s:state().lease_end - (lease or 300 + session.LEASE_MARGIN)
    s.moved = s.moved + math.max(0, set_at + 1 - s.clock())
  end

  local function order_of(log, what)
    for i, v in ipairs(log) do if v == what then return i end end
    return nil
  end

  for _, how in ipairs({ "blocking", "task" }) do
    it(how .. ": the cell starts before the delayed extension answers; the lease is then renewed", function()
      local log = {}
      local s = logged("lease:" .. how, log)
      assert(s:run("0"))    -- created
      local before = s:state().lease_end
      next_second(s)
      env.srv:fault{ route = "POST /sandboxes/{id}/connect", count = 1, delay_ms = 600 }
      env:reset_stats()
      local opts = { on_stdout = function(text)
        if text:match("started") then log[#log + 1] = "stdout" end
      end }
      local r
      if how == "task" then
        local t = wb:spawn(function() return s:run(CELL, opts) end)
        assert(wb:loop())
        r = assert(t:result())
      else
        r = assert(s:run(CELL, opts))
      end
      assert.equal("done", r.results[1].text)
      local st = env:stats()
      assert.equal(1, st.requests["POST /sandboxes/{id}/connect"])
      assert.equal(0, st.requests["GET /v2/sandboxes"] or 0)
      -- The execute was already streaming while the extension was in flight.
      assert.truthy(order_of(log, "stdout"))
      assert.truthy(order_of(log, "connect+"))
      assert.is_true(order_of(log, "stdout") < order_of(log, "connect+"), table.concat(log, " "))
      assert.is_true(s:state().lease_end >= before)
    end)
  end

  it("a failing extension is retried while the cell runs", function()
    local log = {}
    local s = logged("lease:retry", log)
    assert(s:run("0"))
    next_second(s)
    env:fault("POST /sandboxes/{id}/connect", { status = 503, count = 3 })
    env:reset_stats()
    local r = assert(s:run("import time\ntime.sleep(2)\n'ok'"))
    assert.equal("ok", r.results[1].text)
    assert.equal(4, env:stats().requests["POST /sandboxes/{id}/connect"])
    assert.equal("connect+", log[#log])
  end)

  it("interrupts and reports the run when the lease cannot be secured before it ends", function()
    -- Remembered lease 30 s (the 25 s timeout + LEASE_MARGIN): alongside (>= 20 s
    -- left); the extension always fails, each failed connect taking 5 s (the
    -- session's clock and warmboxd's both move on by 5 s), so the cell (50 s,
    -- timeout 60) is interrupted before the lease less LEASE_MARGIN: warmboxd,
    -- whose clock moved alike, never paused it underneath.
    -- Both clocks stand still but for these moves (warmboxd's frozen, the
    -- session's at the same time): the failed connects' real time (retries,
    -- a loaded machine) moves neither, so only the moves decide.
    local log = {}
    local frozen = assert(env.srv:admin("POST", "/clock", { freeze = true }).json)
    local s = logged("lease:interrupt", log, { exec_timeout = 25, idle_timeout = 25,
      frozen_at = math.floor(wbd.utc(frozen.now)),
      on_failed_connect = function(sess)
        sess.moved = sess.moved + 5
        env.srv:advance(5)
      end })
    local first = assert(s:run("x = 1"))
    env:fault("POST /sandboxes/{id}/connect", { status = 503, count = 100000 })
    local r, msg, code, detail = s:run("import time\ntime.sleep(50)\n'late'", { timeout = 60 })
    assert.is_nil(r)
    assert.matches("interrupted", msg)
    assert.equal("HTTP", code)
    assert.is_true(detail.interrupted)
    assert.is_true(s.moved >= 20, "the clock moved " .. s.moved .. " s")
    local st = env:stats()
    assert.equal(0, (st.counters or {}).pause_during_run or 0)
    -- Cleared: the next run works on the same sandbox (resumed if it paused since).
    env.srv:clear_faults()
    assert(env.srv:admin("POST", "/clock", { freeze = false }).json)
    local r2 = assert(s:run("x"))
    assert.equal(first.sandbox_id, r2.sandbox_id)
    assert.equal("1", r2.results[1].text)
  end)

  -- A paused sandbox (its lease ended; autoResume set at creation) is resumed
  -- by the execute itself. The session's clock is advanced past the lease
  -- while the sandbox is paused by hand, as E2B would at the lease end.
  local function paused_session(key, timeout, log)
    local now = os.time()
    local clock = function() return now end
    local s = session.new(key, { client = wb.client, lock = { backend = "file", dir = env.lockdir },
      exec_timeout = timeout, idle_timeout = timeout, parallel = wb.parallel, origin = wb.origin, clock = clock,
      on_event = function(name, info) log[#log + 1] = name .. (info.alongside and "+" or "") end })
    local first = assert(s:run("x = 41"))
    assert(wb.client:pause(first.sandbox_id))
    now = now + timeout + 60
    env:reset_stats()
    return s, first.sandbox_id, function() return now end
  end

  it("auto-resume covers the run (exec_timeout 60): the execute alone, no connect", function()
    local log = {}
    local s, id, now = paused_session("lease:auto", 60, log)
    local r = assert(s:run("x + 1"))
    assert.equal("42", r.results[1].text)
    assert.equal(id, r.sandbox_id)
    local st = env:stats()
    assert.equal(0, st.requests["POST /sandboxes/{id}/connect"] or 0)
    assert.equal(0, st.requests["GET /v2/sandboxes"] or 0)
    assert.equal(1, st.requests["interp POST /execute"])
    assert.equal(now() + decide.AUTO_RESUME_LEASE, s:state().lease_end)
  end)

  it("default config, paused: the execute resumes it, the extension follows alongside", function()
    local log = {}
    local s, id, now = paused_session("lease:auto-default", 300, log)
    local t = wb:spawn(function() return s:run("x + 1") end)
    assert(wb:loop())
    local r = assert(t:result())
    assert.equal("42", r.results[1].text)
    assert.equal(id, r.sandbox_id)
    local st = env:stats()
    assert.equal(1, st.requests["interp POST /execute"])
    assert.equal(0, st.requests["GET /v2/sandboxes"] or 0)
    -- The resume's lease (300 s) covers the cell until 20 s before its end:
    -- a short cell needs no extension at all.
    assert.equal(0, st.requests["POST /sandboxes/{id}/connect"] or 0)
    assert.equal(now() + decide.AUTO_RESUME_LEASE, s:state().lease_end)
  end)
end)
