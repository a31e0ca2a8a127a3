-- The session's pure decisions (warmbox.session.decide) and its one retry
-- rule (warmbox.session.retry): numbers and codes in, an answer out.
local decide = require "warmbox.session.decide"
local retry = require "warmbox.session.retry"

describe("warmbox.session.decide", function()
  it("lease: ceils the hook's value and raises it to the run's timeout + LEASE_MARGIN", function()
    assert.same({ 600, false }, { decide.lease(599.2, 300) })
    assert.same({ 305, true }, { decide.lease(300, 300) })
    assert.same({ 36, true }, { decide.lease(10, 30.5) })
    assert.same({ 3, false }, { decide.lease(2.5) }) -- without a run: the value ceiled
    for _, bad in ipairs({ 0, -1, 0 / 0, math.huge, "300", false }) do
      assert.is_nil(decide.lease(bad, 300), tostring(bad))
    end
  end)

  it("lease_end: capped at the run's start + the maximum run length, when the start is known", function()
    assert.equal(1500, decide.lease_end(1500, nil, 3600))
    assert.equal(1100, decide.lease_end(1500, 100, 1000))
    assert.equal(1500, decide.lease_end(1500, 1000, 3600))
  end)

  it("extension: none while the lease covers the timeout + COVER_MARGIN, else timeout + LEASE_MARGIN", function()
    assert.is_nil(decide.extension(1000, nil, 60))
    assert.is_nil(decide.extension(1000, 1000 + 60 + decide.COVER_MARGIN, 60))
    assert.equal(65, decide.extension(1000, 1000 + 60 + decide.COVER_MARGIN - 0.5, 60))
    assert.equal(66, decide.extension(1000, 1000, 60.2))
  end)

  it("recycle_due: when a run could cross the maximum run length", function()
    assert.is_false(decide.recycle_due(nil, 3600, 5000, 300))
    assert.is_false(decide.recycle_due(0, 3600, 3600 - 305, 300))
    assert.is_true(decide.recycle_due(0, 3600, 3600 - 304, 300))
  end)

  it("remembered_way: alongside with a safe margin, auto-resume once paused, else connect first", function()
    local now = 1000
    assert.is_nil(decide.remembered_way(now + 100, true, now, 60, false)) -- no parallel (or a prewarm)
    assert.is_nil(decide.remembered_way(nil, true, now, 60, true))
    assert.equal("alongside", decide.remembered_way(now + decide.ALONGSIDE_MARGIN, nil, now, 60, true))
    assert.is_nil(decide.remembered_way(now + decide.ALONGSIDE_MARGIN - 1, true, now, 60, true)) -- about to pause
    local paused = now - decide.PAUSE_GRACE
    -- paused: the execute resumes it only when the lease asked is no shorter
    -- than a resume by traffic gives; a shorter one is a connect first
    assert.equal("auto_resume", decide.remembered_way(paused, true, now, decide.AUTO_RESUME_LEASE, true))
    assert.is_nil(decide.remembered_way(paused, true, now, decide.AUTO_RESUME_LEASE - 1, true))
    assert.is_nil(decide.remembered_way(paused, true, now, 60, true))
    assert.is_nil(decide.remembered_way(paused, nil, now, 300, true))
  end)

  it("lease watched: the policy's value from MIN_LEASE up, whatever the run's timeout", function()
    assert.same({ 10, false }, { decide.lease(10, 300, true) })
    assert.same({ decide.MIN_LEASE, false }, { decide.lease(1, 300, true) })
    assert.same({ 305, true }, { decide.lease(10, 300) })        -- unwatched: the run's timeout + margin
    assert.is_nil(decide.lease(0, 300, true))
  end)

  it("watch_at / watch_deadline: the watchdog extends before the end, its retries land before it", function()
    assert.equal(990, decide.watch_at(1000, 60))
    assert.equal(997.5, decide.watch_at(1000, 5))                -- half a short lease
    assert.is_true(decide.watch_deadline(1000, 60) > decide.watch_at(1000, 60))
    assert.is_true(decide.watch_deadline(1000, 5) < 1000)
    assert.is_true(decide.watch_deadline(1000, 5) > decide.watch_at(1000, 5))
  end)

  it("prewarm_warm: nothing to do while the lease has the margin a run needs", function()
    assert.is_true(decide.prewarm_warm(1000, 1015, 300, 30))     -- half the lease left
    assert.is_false(decide.prewarm_warm(1000, 1014, 300, 30))
    assert.is_true(decide.prewarm_warm(1000, 1005, 5, 30))       -- the run comes sooner
    assert.is_false(decide.prewarm_warm(1000, nil, 5, 30))
  end)

  it("arrival and unanswered: what the sandbox's answers mean", function()
    assert.equal("never", decide.arrival(true))
    assert.equal("accepted", decide.arrival(false))
    assert.equal("unknown", decide.arrival(nil))
    assert.is_true(decide.unanswered("SANDBOX_GONE"))
    assert.is_true(decide.unanswered("HTTP", { status = 503 }))
    assert.is_false(decide.unanswered("SANDBOX_GONE", { started = true, output_started = true }))
    -- a bare status after the request left: the cell may have started, the sandbox is asked
    assert.is_true(decide.unanswered("SANDBOX_GONE", { started = true, output_started = false }))
    assert.is_false(decide.unanswered("HTTP", { status = 500 }))
    assert.is_true(decide.is_gone("NOT_FOUND"))
    assert.is_false(decide.is_gone("HTTP"))
  end)
end)

describe("warmbox.session.retry", function()
  it("reach: only a failure that proves the cell never ran, or a question, can lead to a re-send", function()
    assert.is_false(retry.reach("prepare", "HTTP", { status = 500 }))
    assert.equal("exists", retry.reach("prepare", "SANDBOX_GONE", {}))
    assert.equal("never", retry.reach("cell", "TRANSPORT", { sent = false }, true))
    assert.is_false(retry.reach("cell", "TRANSPORT", { sent = true }, true))
    assert.is_false(retry.reach("cell", "TRANSPORT", nil, true))
    assert.equal("ask", retry.reach("cell", "SANDBOX_GONE", {}, true))
    assert.is_false(retry.reach("cell", "SANDBOX_GONE", {}, false)) -- no guard: it may have run
    assert.is_false(retry.reach("cell", "SANDBOX_GONE", { started = true, output_started = true }, true))
    assert.equal("ask", retry.reach("cell", "SANDBOX_GONE", { started = true, output_started = false }, true))
    assert.is_false(retry.reach("cell", "HTTP", { status = 500 }, true))
    assert.is_false(retry.reach("cell", "TIMEOUT", { started = true }, true))
    assert.equal("never", retry.reach("refused", "HOOKS_LOST"))
    assert.is_false(retry.reach("refused", "FENCED"))
  end)

  it("answer: a claimed id never ran; a refused claim ran; a sandbox that is gone never ran it", function()
    assert.equal("never", retry.answer("cell", "ask", true))
    assert.is_false(retry.answer("cell", "ask", false))
    assert.equal("exists", retry.answer("cell", "ask", nil))
    assert.equal("gone", retry.answer("cell", "exists", false))
    assert.is_false(retry.answer("cell", "exists", true)) -- it exists: nobody can tell, reported
    assert.equal("never", retry.answer("prepare", "exists", true)) -- before the cell: nothing ran
    assert.equal("gone", retry.answer("prepare", "exists", false))
  end)

  it("again: at most once, and once more for a kernel that lost its hooks", function()
    assert.is_nil(retry.again(false, "HTTP", 1, false))
    assert.equal("same", retry.again("never", "TRANSPORT", 1, false))
    assert.equal("resolve", retry.again("gone", "SANDBOX_GONE", 1, false))
    assert.is_nil(retry.again("never", "TRANSPORT", 2, false))
    assert.same({ "same", true }, { retry.again("never", "HOOKS_LOST", 2, false) })
    assert.is_nil(retry.again("never", "HOOKS_LOST", 3, true))
  end)

  it("wait: the Retry-After, capped; lease: the extension's pauses until it cannot land in time", function()
    assert.is_nil(retry.wait(nil))
    assert.is_nil(retry.wait({ retry_after = 0 }))
    assert.equal(3, retry.wait({ retry_after = 3 }))
    assert.equal(decide.RETRY_AFTER_MAX, retry.wait({ retry_after = 1e6 }))
    local pauses = {}
    for n = 1, 7 do pauses[n] = retry.lease("HTTP", n, 0, 100) end
    assert.same({ 0.1, 0.2, 0.4, 0.8, 1.6, 2, 2 }, pauses)
    assert.is_nil(retry.lease("NOT_FOUND", 1, 0, 100))
    assert.is_nil(retry.lease("HTTP", 3, 99.6, 100))
    assert.equal(0.4, retry.lease("HTTP", 3, 99.5, 100))
    assert.is_true(retry.reconnect("SANDBOX_GONE"))
    assert.is_false(retry.reconnect("HTTP", { status = 500 }))
  end)
end)
