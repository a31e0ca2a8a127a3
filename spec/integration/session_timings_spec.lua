-- r.timings against a real warmboxd: every part of a run's total is in a
-- named phase (lock_wait, resolve, prepare, lease, execute, outputs, retry,
-- finish), on a cold run (the sandbox made, its kernel started by the hooks
-- cell: `prepare`), a resumed one and warm ones.
local sessions = require "spec.helpers.sessions"

local PHASES = { "lock_wait", "resolve", "prepare", "lease", "execute", "outputs", "retry", "finish" }

-- The phases add up to the total, within 5%.
local function adds_up(t, what)
  assert.is_table(t, what)
  local sum = 0
  for _, f in ipairs(PHASES) do
    assert.is_number(t[f], what .. ": " .. f)
    assert.is_true(t[f] >= 0, what .. ": " .. f)
    sum = sum + t[f]
  end
  assert.is_true(math.abs(t.total - sum) <= 0.05 * t.total,
    string.format("%s: the phases add up to %.6f s of a total of %.6f s", what, sum, t.total))
end

describe("r.timings: the phases add up to the total", function()
  local env = sessions.new()
  local wb

  lazy_setup(function()
    env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60 }
  end)
  lazy_teardown(function() env:stop() end)

  it("on a cold run (the kernel's start is `prepare`), warm runs, a resumed run and a failed one", function()
    local s = wb:session("timings:" .. os.time())
    local cold = assert(s:run("x = 1"))
    assert.is_false(cold.reused)
    adds_up(cold.timings, "cold")
    assert.is_true(cold.timings.prepare > 0)
    adds_up(assert(s:run("x + 1")).timings, "warm")
    adds_up(assert(s:run("open('in.txt').read()", { files = { ["in.txt"] = "hi" } })).timings, "warm with a file")
    adds_up(assert(s:run("open('/home/user/output/o.txt', 'w').write('o')")).timings, "warm with an output file")
    assert(wb.client:pause(cold.sandbox_id))
    local resumed = assert(s:run("x + 2"))
    assert.equal(cold.sandbox_id, resumed.sandbox_id)
    adds_up(resumed.timings, "resumed")
    local r, _, _, detail = s:run("1", { language = "nonsense" })
    if r then adds_up(r.timings, "another language") else adds_up(detail.timings, "failed") end
  end)
end)
