-- Tasks against a real warmboxd: many runs at once from one Lua state.
-- Tasks spawned on one warmbox object run their cells concurrently on the
-- C engine (one session at a time, in arrival order), every cell executes
-- exactly once and its result goes back to the task that asked; callbacks
-- run inside their task; a task that raises or is cancelled does not disturb
-- the others, and a cancelled task frees its session and interrupts its cell.
local sessions = require "spec.helpers.sessions"
local task = require "warmbox.task"
local core = require "warmbox.core"

describe("tasks: concurrent runs from one Lua state (warmboxd)", function()
  local env = sessions.new()
  local wb

  lazy_setup(function()
    env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60 }
  end)
  lazy_teardown(function() env:stop() end)

  it("runs a short cell while a long one of another session is in flight", function()
    local a = wb:session("tasks:long")
    local b = wb:session("tasks:short")
    assert(a:run("0"))
    assert(b:run("0")) -- both warm: the race below is the runs only
    local order = {}
    local ta = wb:spawn(function()
      local r = assert(a:run("import time\ntime.sleep(1.5)\n'A'"))
      order[#order + 1] = "A"
      return r.results[1].text
    end)
    local tb = wb:spawn(function()
      local r = assert(b:run("1 + 1"))
      order[#order + 1] = "B"
      return r.results[1].text
    end)
    assert(wb:loop())
    assert.same({ "B", "A" }, order)
    assert.equal("A", ta:result())
    assert.equal("2", tb:result())
    assert.is_true(ta:done() and tb:done())
  end)

  it("100 tasks over 20 sessions: each cell once, results to their task, runs overlap", function()
    local SESS, TASKS = 20, 100
    local ss = {}
    for i = 1, SESS do ss[i] = wb:session("tasks:many:" .. i) end
    local active, peak, per = 0, 0, {}
    local tasks = {}
    for i = 1, TASKS do
      local k = (i - 1) % SESS + 1
      local ms = math.random(0, 80)
      tasks[i] = wb:spawn(function()
        local src = string.format("import time\ntime.sleep(%g)\nn = globals().get('n', 0) + 1\n(%d, n)", ms / 1000, i)
        active = active + 1
        if active > peak then peak = active end
        local r, err, code = ss[k]:run(src)
        active = active - 1
        if not r then return nil, err, code end
        per[k] = (per[k] or 0) + 1
        return r.results[1].text, r.sandbox_id
      end)
    end
    assert(wb:loop())
    local seen_n = {}
    for i = 1, TASKS do
      local text, sid = tasks[i]:result()
      assert.is_string(text, tostring(sid))
      local id, n = text:match("^%((%d+), (%d+)%)$")
      assert.equal(i, tonumber(id)) -- the result of this task's own cell
      local k = (i - 1) % SESS + 1
      seen_n[k] = seen_n[k] or {}
      seen_n[k][#seen_n[k] + 1] = tonumber(n)
    end
    -- Every cell executed exactly once: each session's counter took the
    -- values 1..runs, each once (a repeated cell would skip or repeat one).
    for k = 1, SESS do
      table.sort(seen_n[k])
      local want = {}
      for j = 1, TASKS // SESS do want[j] = j end
      assert.same(want, seen_n[k])
    end
    assert.is_true(peak > SESS / 2, "tasks were in flight at once: " .. peak)
    local st = env:stats()
    assert.equal(0, (st.counters or {}).exec_overlap or 0)
  end)

  it("tasks waiting for one session get it in arrival order", function()
    local s = wb:session("tasks:fifo")
    assert(s:run("seen = []"))
    local ts = {}
    for i = 1, 6 do
      ts[i] = wb:spawn(function()
        return (assert(s:run(string.format("import time\ntime.sleep(0.05)\nseen.append(%d)\nlen(seen)", i))))
          .results[1].text
      end)
    end
    assert(wb:loop())
    for i = 1, 6 do assert.equal(tostring(i), ts[i]:result()) end
    assert.equal("[1, 2, 3, 4, 5, 6]", (assert(s:run("seen"))).results[1].text)
  end)

  it("a warmbox object dropped with a task in flight aborts its transfer and frees the session", function()
    local wb2 = env:warmbox{ exec_timeout = 60, idle_timeout = 60 }
    table.remove(env.wbs) -- nothing keeps it: env:stop must not close it
    local s2 = wb2:session("tasks:dropped")
    assert(s2:run("y = 1"))
    wb2:spawn(function() return s2:run("import time\ntime.sleep(30)\ny = 2") end)
    local t0 = core.now()
    while core.now() - t0 < 1 do wb2:step(0.05) end -- the cell is in flight
    s2, wb2 = nil, nil -- luacheck: ignore 311 (dropped on purpose)
    collectgarbage()
    collectgarbage()
    -- The engine was collected: the execute's connection closed, the server
    -- interrupted the cell (y stays 1) and the lock went with its object.
    local r = assert(wb:session("tasks:dropped"):run("y"))
    assert.equal("1", r.results[1].text)
  end)

  it("runs on_stdout inside the task that asked, as output arrives", function()
    local s = wb:session("tasks:stream")
    local inside, chunks, other_ticks = true, {}, 0
    local t
    t = wb:spawn(function()
      return assert(s:run("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\n",
        { on_stdout = function(text)
          if task.current() ~= t then inside = false end
          chunks[#chunks + 1] = { text, other_ticks }
        end }))
    end)
    -- Another task ticks meanwhile: it progresses between the chunks.
    local ticker = wb:spawn(function()
      while not t:done() do
        other_ticks = other_ticks + 1
        wb.runner.sched:sleep(0.05)
      end
    end)
    assert(wb:loop())
    assert.is_true(inside)
    assert.is_true(#chunks >= 3)
    assert.is_true(chunks[#chunks][2] > chunks[1][2], "the ticker ran between chunks")
    assert.is_true(ticker:done())
    local out = (t:result()).stdout
    assert.equal("0\n1\n2\n", type(out) == "table" and table.concat(out) or out)
  end)

  it("a task that raises leaves the others alone", function()
    local s = wb:session("tasks:raise")
    local bad = wb:spawn(function()
      assert(s:run("1"))
      error("boom")
    end)
    local good = wb:spawn(function() return (assert(s:run("40 + 2"))).results[1].text end)
    assert(wb:loop())
    local ok, msg = bad:result()
    assert.is_nil(ok)
    assert.matches("boom", msg)
    assert.equal("42", good:result())
  end)

  it("cancel aborts the task's cell server-side and frees its session", function()
    local s = wb:session("tasks:cancel")
    assert(s:run("x = 1"))
    local t = wb:spawn(function() return s:run("import time\ntime.sleep(30)\n'late'") end)
    local t0 = core.now()
    while core.now() - t0 < 1 do wb:step(0.05) end -- the cell is in flight
    assert.is_false(t:done())
    assert.is_true(t:cancel())
    local _, msg, code = t:result()
    assert.equal("cancelled", msg)
    assert.equal("CANCELLED", code)
    -- The session is free at once (the lock was closed) and the kernel was
    -- interrupted: the next run answers without waiting 30 s.
    local s2 = wb:session("tasks:cancel")
    local t1 = core.now()
    local r = assert(s2:run("x"))
    assert.equal("1", r.results[1].text)
    assert.is_true(core.now() - t1 < 10, "the cancelled cell was interrupted")
  end)

  it("release, sessions and gc work inside tasks", function()
    local s = wb:session("tasks:admin")
    assert(s:run("1"))
    local t = wb:spawn(function()
      local list = assert(wb:sessions())
      local found = false
      for _, e in ipairs(list) do if e.key == "tasks:admin" then found = true end end
      local rep = assert(wb:gc{ dry_run = true })
      local n = assert(wb:release("tasks:admin"))
      return found, rep.listed, n
    end)
    assert(wb:loop())
    local found, listed, n = t:result()
    assert.is_true(found)
    assert.is_true(listed >= 1)
    assert.equal(1, n)
  end)

  it("outside tasks calls block as before, pollfd/timeout are idle", function()
    local s = wb:session("tasks:plain")
    assert.equal("3", (assert(s:run("1 + 2"))).results[1].text)
    assert.is_number(wb:pollfd())
    assert.is_nil(wb:timeout())
    assert.is_false(wb:step(0))
  end)
end)
