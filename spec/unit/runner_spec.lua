-- warmbox.runner without a server: the scheduler over the C engine's fd
-- (timers only here), the lock's wait hook inside tasks, locks tracked per
-- task, timeout()/count(). Transfers are covered by spec/integration/tasks/*.
local runner = require "warmbox.runner"
local lock = require "warmbox.lock"

describe("warmbox.runner", function()
  it("sleeps on the engine's clock and reports what is due", function()
    local r = assert(runner.new())
    assert.is_nil(r:timeout())
    local t = r:spawn(function() r.sched:sleep(0.05) return "slept" end)
    assert.equal(0, r:timeout()) -- ready to run
    assert.is_true(r:step(0))    -- runs it up to its sleep
    local due = r:timeout()
    assert.is_true(due > 0 and due <= 0.05)
    assert(r:loop())
    assert.equal("slept", t:result())
    assert.equal(0, r:count())
    r:close()
  end)

  it("a lock wait inside a task yields: the holder and others go on meanwhile", function()
    local r = assert(runner.new())
    local ticks_while_waiting, waiting = 0, false
    local a = r:spawn(function()
      local lk = lock.new{ backend = "memory", timeout = 5 }
      assert(lk:lock("runner:k"))
      r.sched:sleep(0.3)
      assert(lk:unlock())
      return "a"
    end)
    local b = r:spawn(function()
      local lk = lock.new{ backend = "memory", timeout = 5 }
      waiting = true
      local elapsed, err = lk:lock("runner:k")
      waiting = false
      assert(elapsed, err)
      lk:unlock()
      return "b"
    end)
    r:spawn(function()
      while not b:done() do
        if waiting then ticks_while_waiting = ticks_while_waiting + 1 end
        r.sched:sleep(0.02)
      end
    end)
    assert(r:loop())
    assert.equal("a", a:result())
    assert.equal("b", b:result())
    -- A blocking wait (core.sleep) would have stopped every task: no tick,
    -- and the holder could never have released (b would time out).
    assert.is_true(ticks_while_waiting >= 3, "ticks: " .. ticks_while_waiting)
    r:close()
  end)

  it("patches nothing in warmbox.lock: the wait inside tasks is its backend's pause", function()
    local before = {}
    for k, v in pairs(lock) do before[k] = v end
    package.loaded["warmbox.runner"] = nil
    local fresh = require "warmbox.runner"
    package.loaded["warmbox.runner"] = runner
    local after = {}
    for k, v in pairs(lock) do after[k] = v end
    assert.same(before, after)
    local eng = assert(require("warmbox.core").engine{})
    assert.is_function(fresh.backend(eng).pause)
    eng:close()
    -- the lock's default wait is the scheduler's cooperative sleep
    assert.equal(require("warmbox.task").pause, lock.wait)
    -- a task of a scheduler whose backend has no pause (the virtual one) blocks
    local task = require "warmbox.task"
    local s = task.scheduler{ backend = task.virtual(0) }
    local t = s:spawn(function() return lock.wait(0.01) end)
    assert(s:loop())
    assert.is_false(t:result())
  end)

  it("closes the locks a task made when it is cancelled", function()
    local r = assert(runner.new())
    local new_lock = r:lock_factory(function() return lock.new{ backend = "memory", timeout = 1 } end)
    local t = r:spawn(function()
      local lk = new_lock()
      assert(lk:lock("runner:cancel"))
      r.sched:sleep(3600)
    end)
    r:step(0)
    local other = lock.new{ backend = "memory", timeout = 1 }
    assert.same({ nil, "busy" }, { other:try_lock("runner:cancel") })
    assert.is_true(t:cancel())
    assert(other:try_lock("runner:cancel"))
    other:unlock()
    assert.equal(0, r:count())
    r:close()
  end)

  it("a long-lived task keeps none of the locks its runs closed", function()
    local r = assert(runner.new())
    local new_lock = r:lock_factory(function() return lock.new{ backend = "memory", timeout = 1 } end)
    local function runs(n)
      for _ = 1, n do
        local lk <close> = new_lock()
        assert(lk:lock("runner:soak"))
      end
    end
    local grew
    local t = r:spawn(function()
      runs(200) -- warm: tables and strings that are made once
      collectgarbage()
      collectgarbage()
      local before = collectgarbage("count")
      runs(2000)
      collectgarbage()
      collectgarbage()
      grew = collectgarbage("count") - before
      r.sched:sleep(3600) -- still alive: a cancel closes what it holds
    end)
    r:step(0)
    -- 2000 lock objects kept would be well over 400 KB
    assert.is_true(grew < 100, ("the heap grew %.0f KB over 2000 runs"):format(grew))
    assert.is_true(t:cancel())
    r:close()
  end)

  it("outside tasks a transport calls the client itself", function()
    local calls = 0
    local fake = { request = function(_, req) calls = calls + 1 return { status = 200, body = req.url } end,
                   batch = function(_, reqs) return { { { status = 200, body = #reqs } } } end }
    local tp = runner.transport(fake)
    assert.equal("u", tp:request{ url = "u" }.body)
    assert.equal(1, calls)
    assert.equal(2, tp:batch({ {}, {} })[1][1].body)
  end)

  it("parallel outside a task runs both and returns main's values after side", function()
    local r = assert(runner.new())
    local order = {}
    local side, a, b = r:parallel(function()
      r.sched:sleep(0.02)
      order[#order + 1] = "main"
      return 1, 2
    end, function(ctl)
      ctl.wait(10) -- until main returns
      order[#order + 1] = "side"
      return ctl.main_done()
    end)
    assert.equal(1, a)
    assert.equal(2, b)
    assert.is_true(side:result())
    assert.same({ "main", "side" }, order)
    r:close()
  end)

  describe("where a call runs, asked of the runner it is given", function()
    it("r:where() is r and the task inside r's tasks, the lane inside its lane's, nil elsewhere", function()
      local r, other = assert(runner.new()), assert(runner.new())
      assert.is_nil(r:where())
      local seen = {}
      local t = r:spawn(function()
        local rr, tt = r:where()
        seen.own = rr == r and tt ~= nil
        r:parallel(function() return true end, function() end)
      end)
      other:spawn(function() seen.other = r:where() end)
      assert(other:loop())
      assert(r:loop())
      assert.is_true(t:done())
      assert.is_true(seen.own)
      assert.is_nil(seen.other)
      -- a blocking parallel runs on the lane: inside it, where() names the lane
      local _, lane_r = r:parallel(function() return (r:where()) end, function() end)
      assert.equal(r:lane(), lane_r)
      r:close()
      other:close()
    end)

    it("r:parallel outside r's tasks runs on r's lane: r's other tasks wait for r's own loop", function()
      local r = assert(runner.new())
      local ran = false
      r:spawn(function() ran = true end)
      local _, v = r:parallel(function() return "main" end, function(ctl) ctl.sleep(0) end)
      assert.equal("main", v)
      assert.is_false(ran, "a blocking call ran the runner's other tasks")
      assert(r:loop())
      assert.is_true(ran)
      r:close()
      assert.is_true(r:lane().closed)
    end)

    it("r:pause yields inside r's tasks and blocks outside, stepping r only while it has background work", function()
      local r = assert(runner.new())
      local ticks = 0
      local a = r:spawn(function() return r:pause(0.1) end)
      r:spawn(function()
        while not a:done() do
          ticks = ticks + 1
          r:sleep(0.01)
        end
      end)
      assert(r:loop())
      assert.is_true(a:done())
      assert.is_true(ticks >= 3, "ticks: " .. ticks)
      -- outside: blocks; r's task runs meanwhile only when r counts background work
      local ran = false
      r:spawn(function() ran = true end)
      assert.is_false(r:pause(0.01))
      assert.is_false(ran)
      r:add_background(1)
      r:pause(0.01)
      assert.is_true(ran)
      r:add_background(-1)
      -- a waker ends a wait inside a task at once
      local waker = {}
      local w = r:spawn(function() return r:pause(5, waker) end)
      r:step(0)
      waker.wake()
      assert(r:loop())
      assert.is_true(w:result())
      r:close()
    end)
  end)
end)
