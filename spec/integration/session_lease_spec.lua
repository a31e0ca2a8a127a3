-- The lease covers the run's whole timeout, against a real warmboxd, with
-- exec_timeout = idle_timeout = 2: the lease a run asks for is the idle
-- window (from decide.MIN_LEASE up), and while the run goes on its watchdog
-- extends it before it would end. A cell that uses its whole timeout is
-- interrupted by the server at its timeout and ends TIMEOUT, the sandbox
-- never paused underneath it, even when the hooks cell, an upload or the
-- output directory before the cell are slow. On loopback a round trip takes
-- a few ms, less than warmboxd's lease timer (100 ms ticks) may lag; each
-- execute is delayed 500 ms (a WAN's round trips to E2B and the hooks cell).
local sessions = require "spec.helpers.sessions"
local decide = require "warmbox.session.decide"

describe("the lease of a run (warmboxd)", function()
  local env = sessions.new()
  local srv, wb

  lazy_setup(function()
    srv = env:start()
    wb = env:warmbox{ exec_timeout = 2, idle_timeout = 2 }
  end)
  lazy_teardown(function() env:stop() end)

  local SLEEP = "import time\ntime.sleep(30)"

  -- The next execute (the hooks cell or the user's) is served 500 ms late.
  local function slow_execute()
    srv:fault{ route = "interp POST /execute", count = 1, delay_ms = 500 }
  end

  it("outlasts the run's timeout: a cell sleeping past it ends TIMEOUT, the sandbox kept running", function()
    local s = wb:session("lease:timeout")
    -- A kernel with x = 41 (a long timeout: its start is not what this spec is about).
    local id = assert(s:run("x = 41", { timeout = 30 })).sandbox_id
    -- Forgotten: the next run resolves it again, and its set_timeout replaces the
    -- warm-up's lease with the run's own.
    assert(s:forget())
    env:reset_stats()
    slow_execute()
    local before = os.time()
    local r, msg, ecode, detail = s:run(SLEEP)
    assert.is_nil(r)
    assert.equal("TIMEOUT", ecode, msg)
    assert.is_true(detail.started)
    local st = env:stats()
    assert.equal(0, st.counters.pause_during_run or 0)
    -- The lease it left: the idle window (MIN_LEASE, as 2 s is shorter), not the timeout's.
    local info = assert(wb.client:info(id))
    assert.equal("running", info.state)
    local end_at = sessions.utc(info.end_at)
    assert.is_true(end_at <= os.time() + decide.MIN_LEASE + 1, "lease end " .. info.end_at)
    assert.is_true(end_at >= before, "lease end " .. info.end_at)
    -- Again on the remembered sandbox: its watchdog keeps the lease as long as the run takes.
    slow_execute()
    r, msg, ecode = s:run(SLEEP)
    assert.is_nil(r)
    assert.equal("TIMEOUT", ecode, msg)
    -- Still running, never paused: the same kernel, x kept.
    r = assert(s:run("x + 1"))
    assert.equal(id, r.sandbox_id)
    assert.is_false(r.resumed)
    assert.equal("42", r.results[1] and r.results[1].text)
    assert.equal(0, env:stats().counters.pause_during_run or 0)
  end)

  -- The lease covers the whole run. The uploads, the output directory and the
  -- hooks cell come after the lease is set, so a slow one (held 6 s, longer
  -- than the 5 s lease) would use it up and the sandbox would pause under its
  -- own cell (STREAM_BROKEN); the watchdog extends it while they go on.
  local function times_out_running(s, opts, code)
    local r, msg, ecode, detail = s:run(code or SLEEP, opts)
    assert.is_nil(r)
    assert.equal("TIMEOUT", ecode, msg)
    assert.is_true(detail.started)
    assert.equal(0, env:stats().counters.pause_during_run or 0, "the sandbox paused under its run")
  end

  it("covers the whole run: a slow upload before the cell", function()
    srv:clear_faults()
    local s = wb:session("cover:upload")
    assert(s:run("x = 41", { timeout = 30 }))
    -- forgotten: the next run's resolve sets the lease (5 s: MIN_LEASE) before its upload
    assert(s:forget())
    srv:fault{ route = "envd POST /files", count = 1, delay_ms = 6000 }
    times_out_running(s, { files = { ["in.txt"] = "data" } })
    local r = assert(s:run("x + 1"))
    assert.equal("42", r.results[1] and r.results[1].text)
  end)

  it("covers the whole run: a slow output directory before a bash cell", function()
    srv:clear_faults()
    local s = wb:session("cover:outdir")
    assert(s:run("echo warm", { language = "bash", timeout = 30 }))
    assert(s:forget())
    srv:fault{ route = "envd POST /filesystem.Filesystem/MakeDir", count = 1, delay_ms = 6000 }
    times_out_running(s, { language = "bash" }, "sleep 30")
  end)

  -- Lease durations follow the monotonic clock. The wall
  -- clock (injected) steps by +/-3600 s between two runs: forward, the
  -- remembered lease looked over (the sandbox taken for paused: no extension,
  -- left to an auto-resume that never happens); backward, it looked long
  -- (no refresh). Either way the 10 s cell outlived the real 5 s lease.
  for _, step in ipairs({ 3600, -3600 }) do
    it(("keeps the lease through a wall-clock step of %+d s"):format(step), function()
      srv:clear_faults()
      local offset = 0
      local w = env:warmbox{ exec_timeout = 2, idle_timeout = 2, clock = function() return os.time() + offset end,
        mono = require("warmbox.core").now }
      local s = w:session("wallstep:" .. step)
      -- created with a lease of MIN_LEASE (5 s), auto-resuming
      assert(s:run("x = 41", { timeout = 30 }))
      offset = step
      times_out_running(s, { timeout = 10 })
    end)
  end
end)
