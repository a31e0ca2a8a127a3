-- warmbox driven from a host's own event loop through
-- wb:pollfd()/wb:timeout()/wb:step(0): luv (libuv) and cqueues. Cells of
-- several sessions run while other work on the same loop (a 20 ms ticker)
-- keeps making progress.
local sessions = require "spec.helpers.sessions"

local CELL = "import time\ntime.sleep(0.5)\nk"

describe("tasks: host loops (warmboxd)", function()
  local env = sessions.new()
  local wb

  lazy_setup(function()
    env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60 }
  end)
  lazy_teardown(function() env:stop() end)

  -- Spawns one task per session (warmed first) running CELL; returns the tasks.
  local function spawn_runs(prefix, n)
    local ts = {}
    for i = 1, n do
      local s = wb:session(prefix .. i)
      assert(s:run("k = " .. i))
      ts[i] = wb:spawn(function() return (assert(s:run(CELL))).results[1].text end)
    end
    return ts
  end

  local function all_done(ts)
    for _, t in ipairs(ts) do if not t:done() then return false end end
    return true
  end

  local function check(ts, ticks_while_running)
    for i, t in ipairs(ts) do assert.equal(tostring(i), t:result()) end
    -- 4 cells of 0.5 s at once: the 20 ms ticker ran many times meanwhile
    -- (a blocking run would have let it tick at most between runs).
    assert.is_true(ticks_while_running >= 5, "ticks while cells ran: " .. ticks_while_running)
  end

  it("luv: a uv_poll on pollfd and a uv timer for timeout", function()
    local uv = require "luv"
    local ts = spawn_runs("host:luv:", 4)
    local ticks = 0
    local poll, timer, ticker = uv.new_poll(wb:pollfd()), uv.new_timer(), uv.new_timer()
    local function pump()
      wb:step(0)
      if wb:pending() == 0 then
        poll:stop(); timer:stop(); ticker:stop()
        return
      end
      local to = wb:timeout()
      timer:stop()
      if to then timer:start(math.ceil(to * 1000), 0, pump) end
    end
    poll:start("r", pump)
    ticker:start(20, 20, function() if not all_done(ts) then ticks = ticks + 1 end end)
    timer:start(0, 0, pump)
    uv.run()
    poll:close(); timer:close(); ticker:close()
    uv.run("nowait")
    assert.is_true(all_done(ts))
    check(ts, ticks)
  end)

  it("cqueues: cqueues.poll(wb) in a coroutine of the controller", function()
    local cqueues = require "cqueues"
    local ts = spawn_runs("host:cq:", 4)
    local ticks = 0
    local cq = cqueues.new()
    cq:wrap(function()
      while wb:step(0) do cqueues.poll(wb) end
    end)
    cq:wrap(function()
      while not all_done(ts) do
        ticks = ticks + 1
        cqueues.sleep(0.02)
      end
    end)
    assert(cq:loop())
    assert.is_true(all_done(ts))
    check(ts, ticks)
  end)
end)
