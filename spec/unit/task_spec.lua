-- warmbox.task: the generic scheduler (virtual backend here; the real one
-- plugs into the same interface).
local task = require "warmbox.task"

local function new(start)
  return task.scheduler{ backend = task.virtual(start or 0) }
end

describe("warmbox.task", function()
  it("runs a task to its return values and jumps virtual time to each timer", function()
    local s = new(100)
    local t = s:spawn(function(a, b)
      s:sleep(5)
      return a + b, "x", nil
    end, 1, 2)
    assert.is_false(t:done())
    assert.same({ nil, "task not finished", "BUSY" }, { t:result() })
    assert.is_true(s:loop())
    assert.is_true(t:done())
    assert.same({ 3, "x", nil, n = 3 }, table.pack(t:result()))
    assert.equal(105, s:now())
  end)

  for _, fast in ipairs{ true, false } do
  it("interleaves tasks by virtual time, equal times in the order they began to wait (fast path "
    .. tostring(fast) .. ")", function()
    local b = task.virtual(0)
    b.virtual = fast
    local s = task.scheduler{ backend = b }
    local log = {}
    local function worker(name, delays)
      for _, d in ipairs(delays) do
        s:sleep(d)
        log[#log + 1] = string.format("%s@%g", name, s:now())
      end
    end
    s:spawn(worker, "a", { 3, 3 })
    s:spawn(worker, "b", { 1, 5 })
    s:spawn(worker, "c", { 3, 0 })
    assert.is_true(s:loop())
    assert.same({ "b@1", "a@3", "c@3", "c@3", "b@6", "a@6" }, log)
  end)
  end

  it("sleep_until a past time returns at the same time, after the other ready tasks", function()
    local s = new(10)
    local log = {}
    s:spawn(function() s:sleep_until(5); log[#log + 1] = "a" .. s:now() end)
    s:spawn(function() log[#log + 1] = "b" .. s:now() end)
    assert.is_true(s:loop())
    assert.same({ "b10", "a10" }, log)
  end)

  it("a task that raises ends with nil, msg, code and the others carry on", function()
    local s = new()
    local errs = 0
    s.on_error = function() errs = errs + 1 end
    local bad = s:spawn(function() s:sleep(1); error("boom", 0) end)
    local coded = s:spawn(function() error({ message = "no room", code = "RATE_LIMITED" }) end)
    local good = s:spawn(function() s:sleep(2); return "ok" end)
    assert.is_true(s:loop())
    assert.same({ nil, "boom", "TASK" }, { bad:result() })
    assert.same({ nil, "no room", "RATE_LIMITED" }, { coded:result() })
    assert.equal("ok", good:result())
    assert.equal(2, errs)
  end)

  it("events wake waiters in arrival order, one per signal, with the signalled value", function()
    local s = new()
    local ev = s:event()
    local got = {}
    for i = 1, 3 do
      s:spawn(function()
        s:sleep(i)                 -- arrive at 1, 2, 3
        local v = ev:wait()
        got[#got + 1] = { i, v, s:now() }
      end)
    end
    s:spawn(function()
      s:sleep(10)
      assert.equal(3, ev:waiting())
      ev:signal("first")
      s:sleep(1)
      assert.equal(2, ev:broadcast("rest"))
      assert.is_false(ev:signal())
    end)
    assert.is_true(s:loop())
    assert.same({ { 1, "first", 10 }, { 2, "rest", 11 }, { 3, "rest", 11 } }, got)
  end)

  it("an event wait times out at its deadline and a later signal skips it", function()
    local s = new()
    local ev = s:event()
    local r1, r2
    s:spawn(function() r1 = { ev:wait(5) } end)
    s:spawn(function() s:sleep(1); r2 = { ev:wait() } end)
    s:spawn(function() s:sleep(7); assert.is_true(ev:signal("v")) end)
    assert.is_true(s:loop())
    assert.same({ nil, "timeout", "TIMEOUT" }, r1)
    assert.same({ "v" }, r2)
    assert.equal(7, s:now())
  end)

  it("cancel stops a waiting task for good, closes its to-be-closed variables, frees its waits", function()
    local s = new()
    local ev = s:event()
    local closed, after = false, false
    local t = s:spawn(function()
      local _ <close> = setmetatable({}, { __close = function() closed = true end })
      ev:wait()
      after = true
    end)
    local other
    s:spawn(function()
      s:sleep(1)
      assert.is_true(t:cancel())
      assert.is_false(t:cancel())
      other = ev:signal()          -- the cancelled waiter is skipped
    end)
    assert.is_true(s:loop())
    assert.is_true(closed)
    assert.is_false(after)
    assert.is_false(other)
    assert.same({ nil, "cancelled", "CANCELLED" }, { t:result() })
    assert.equal(0, s:count())
  end)

  it("a task cannot cancel itself", function()
    local s = new()
    local t
    t = s:spawn(function() t:cancel() end)
    assert.is_true(s:loop())
    local _, msg = t:result()
    assert.matches("cannot cancel itself", msg)
  end)

  it("reports a deadlock when tasks wait for an event nobody can signal", function()
    local s = new()
    local ev = s:event()
    s:spawn(function() ev:wait() end)
    local ok, msg, code = s:loop()
    assert.is_nil(ok)
    assert.equal("DEADLOCK", code)
    assert.matches("1 task", msg)
    assert.equal(1, s:cancel_all())
    assert.is_true(s:loop())
  end)

  it("never yields into a user coroutine: inside one, waiting blocks (the clock moves, no task runs)", function()
    local s = new()
    local log = {}
    s:spawn(function() s:sleep(1); log[#log + 1] = "other@" .. s:now() end)
    s:spawn(function()
      local co = coroutine.wrap(function()
        s:sleep(5)                 -- blocking: the backend's clock jumps, nothing else runs
        log[#log + 1] = "inner@" .. s:now()
        coroutine.yield("user")
        return "end"
      end)
      assert.equal("user", co())
      assert.equal("end", co())
      log[#log + 1] = "task@" .. s:now()
    end)
    assert.is_true(s:loop())
    -- the other task, due at 1, ran only after the blocking sleep returned
    assert.same({ "inner@5", "task@5", "other@5" }, log)
  end)

  it("outside any task, sleep blocks on the backend and event waits time out", function()
    local s = new()
    s:sleep(3)
    assert.equal(3, s:now())
    assert.same({ nil, "timeout", "TIMEOUT" }, { s:event():wait(4) })
    assert.equal(4, s:now())
    assert.is_nil(task.current())
    assert.is_nil(s:current())
  end)

  it("a plain coroutine.yield in a task body just runs it again next round", function()
    local s = new()
    local log = {}
    s:spawn(function() log[#log + 1] = "a1"; coroutine.yield(); log[#log + 1] = "a2" end)
    s:spawn(function() log[#log + 1] = "b" end)
    assert.is_true(s:loop())
    assert.same({ "a1", "b", "a2" }, log)
  end)

  it("current() names the running task; data is the owner's", function()
    local s = new()
    local seen
    local t = s:spawn(function() seen = task.current(); task.current().data.x = 1 end)
    assert.is_true(s:loop())
    assert.equal(t, seen)
    assert.equal(1, t.data.x)
  end)

  it("wake() resumes a waiting task with a value, as a real backend does on I/O", function()
    local io_done = {}
    local backend = { t = 0 }
    function backend.now(b) return b.t end
    function backend.wait(b, deadline)
      -- an "I/O completion" arrives at t = 2, before any deadline
      local w = table.remove(io_done, 1)
      if w then b.t = 2; w.sched:wake(w.task, "bytes"); return true end
      if not deadline then return false end
      b.t = math.max(b.t, deadline)
      return true
    end
    local s = task.scheduler{ backend = backend }
    local got
    local t = s:spawn(function()
      local ev = s:event()      -- a private wait the backend completes
      io_done[1] = { sched = s, task = task.current() }
      got = { ev:wait(100), s:now() }
    end)
    assert.is_true(s:loop())
    assert.same({ "bytes", 2 }, got)
    assert.is_true(t:done())
  end)

  it("step(timeout) bounds the wait for a host that owns its loop", function()
    local b = task.virtual(0)
    b.virtual = false          -- as a real backend: every sleep yields
    local s = task.scheduler{ backend = b }
    s:spawn(function() s:sleep(10) end)
    assert.is_true(s:step())            -- runs the task to its sleep
    assert.is_true(s:step(4))           -- waits 4, the timer is not due
    assert.equal(4, s:now())
    assert.is_false(s:step())           -- waits for the timer, task ends
    assert.equal(10, s:now())
  end)

  it("misuse raises", function()
    local s = new()
    assert.has_error(function() s:spawn("nope") end, "bad argument #1 to 'spawn' (function expected, got string)")
    assert.has_error(function() s:sleep(-1) end)
    assert.has_error(function() task.scheduler{ backend = {} } end)
    assert.has_error(function() task.virtual("x") end)
    local t = s:spawn(function() s:loop() end)
    assert.is_true(s:loop())
    assert.matches("inside a task", select(2, t:result()))
  end)

  it("keeps up with many tasks and timers (heap order)", function()
    local s = new()
    local order = {}
    for i = 1, 2000 do
      s:spawn(function() s:sleep((i * 7919) % 1000); order[#order + 1] = (i * 7919) % 1000 end)
    end
    assert.is_true(s:loop())
    for i = 2, #order do assert.is_true(order[i - 1] <= order[i]) end
    assert.equal(2000, #order)
  end)

  describe("task:on_done(fn)", function()
    it("calls fn(task) once when the task returns, raises or is cancelled; at once when already done", function()
      local s = new(0)
      local seen = {}
      local function note(t) seen[#seen + 1] = tostring(t.id) .. ":" .. tostring((select(2, t:result()))) end
      local ok = s:spawn(function() s:sleep(1) return "v", "w" end)
      local bad = s:spawn(function() s:sleep(2) error("boom", 0) end)
      local cancelled = s:spawn(function() s:sleep(10) end)
      assert.equal(ok, ok:on_done(note))
      bad:on_done(note)
      cancelled:on_done(note)
      cancelled:on_done(function(t) seen[#seen + 1] = "again " .. t.id end)
      assert.same({}, seen)
      assert.is_true(s:step())
      assert.is_true(s:step())
      assert.same({ "1:w" }, seen)
      assert.is_true(s:step())
      assert.same({ "1:w", "2:boom" }, seen)
      assert.is_true(cancelled:cancel())
      assert.same({ "1:w", "2:boom", "3:cancelled", "again 3" }, seen)
      ok:on_done(function(t) seen[#seen + 1] = "late " .. t.id end)
      assert.equal("late 1", seen[5])
      assert.is_true(s:loop())
      assert.equal(5, #seen)
    end)

    it("raises a callback's error where the task finished, after every callback ran", function()
      local s = new(0)
      local t = s:spawn(function() return 1 end)
      local ran = false
      t:on_done(function() error("cb failed", 0) end)
      t:on_done(function() ran = true end)
      assert.has_error(function() s:step() end, "cb failed")
      assert.is_true(ran)
      assert.is_true(t:done())
      assert.equal(0, s:count())
      assert.has_error(function() t:on_done(42) end, "bad argument #1 to 'on_done' (function expected, got number)")
    end)
  end)
end)
