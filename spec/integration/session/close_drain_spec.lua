-- wb:close{ drain = seconds } against a real warmboxd: the runs in flight
-- (tasks) finish before the close, up to the drain; the rest are cancelled,
-- as by a plain close.
local sessions = require "spec.helpers.sessions"

describe("wb:close{ drain = seconds }", function()
  local env = sessions.new()
  lazy_setup(function() env:start() end)
  lazy_teardown(function() env:stop() end)

  -- A task whose cell prints "started", then sleeps `sleep` s; steps wb until
  -- the cell is in flight (its first output came back).
  local function in_flight(wb, key, sleep)
    local s = wb:session(key)
    assert(s:run("0")) -- warm: what is in flight below is the cell
    local started = false
    local t = wb:spawn(function()
      return s:run(string.format("import time\nprint('started', flush=True)\ntime.sleep(%g)\n'done'", sleep),
        { on_stdout = function() started = true end })
    end)
    while not started do wb:step(0.05) end
    assert.is_false(t:done())
    return t
  end

  it("finishes a run in flight before closing", function()
    local wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60 }
    local t = in_flight(wb, "drain:finish", 1)
    local ok, cancelled = wb:close{ drain = 60 }
    assert.is_true(ok)
    assert.equal(0, cancelled)
    assert.is_true(t:done())
    local r = assert(t:result())
    assert.equal("done", r.text)
    assert.equal("started\n", r.stdout)
  end)

  it("without drain (or past it) cancels the run, as ever", function()
    local wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60 }
    local t = in_flight(wb, "drain:cancel", 30)
    local ok, cancelled = wb:close{ drain = 0 }
    assert.is_true(ok)
    -- the run's task, and its lease extension's when that is still in flight (a loaded machine)
    assert.is_true(cancelled == 1 or cancelled == 2, "cancelled " .. tostring(cancelled))
    local _, msg, code = t:result()
    assert.equal("cancelled", msg)
    assert.equal("CANCELLED", code)
    assert.same({ true, 0 }, { wb:close{ drain = 5 } }) -- idempotent
  end)

  it("refuses a bad drain, and one asked from inside its own task", function()
    local wb = env:warmbox()
    assert.has_error(function() wb:close{ drain = -1 } end,
      "bad argument #1 to 'close' (option 'drain': seconds >= 0 expected, got -1)")
    assert.has_error(function() wb:close{ drain = "5" } end,
      "bad argument #1 to 'close' (option 'drain': number expected, got string)")
    assert.has_error(function() wb:close{ linger = 5 } end, "bad argument #1 to 'close' (unknown option 'linger')")
    local t = wb:spawn(function() return wb:close{ drain = 1 } end)
    wb:loop()
    local _, msg = t:result()
    assert.matches("called inside one of its tasks", msg, 1, true)
    assert.is_true((wb:close()))
  end)
end)
