-- What a result says, against a real warmboxd: a traceback is plain text (the
-- kernel's coloured one beside it), and a run whose kernel started afresh
-- says its memory was lost.
local sessions = require "spec.helpers.sessions"

describe("a run's result", function()
  local env = sessions.new()
  local wb

  lazy_setup(function()
    env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60 }
  end)
  lazy_teardown(function() env:stop() end)

  it("has a plain traceback, the coloured one in traceback_ansi", function()
    local r = assert(wb:session("edges:tb"):run("def f():\n    raise ValueError('boom')\nf()"))
    assert.equal("ValueError", r.error.name)
    assert.matches("boom", r.error.traceback)
    assert.is_nil(r.error.traceback:find("\27", 1, true))
    assert.is_string(r.error.traceback_ansi)
    assert.truthy(r.error.traceback_ansi:find("\27[", 1, true))
  end)

  it("says memory_lost when the kernel started afresh since the last run", function()
    local events = {}
    local s = wb:session("edges:mem", { on_event = function(name, info) events[#events + 1] = { name, info } end })
    assert.equal("1", assert(s:run("x = 1\nx")).text)
    local r = assert(s:run("x + 1"))
    assert.is_nil(r.memory_lost)
    -- a pause without memory: the next run resumes it on its files, a new kernel
    assert(wb.client:pause(r.sandbox_id, { memory = false }))
    r = assert(s:run("globals().get('x', 'gone')"))
    assert.equal("gone", (r.text:gsub("'", "")))
    assert.is_true(r.memory_lost)
    local seen
    for _, e in ipairs(events) do
      if e[1] == "memory_lost" and e[2].kernel then seen = true end
    end
    assert.is_true(seen)
    assert.is_nil(assert(s:run("1")).memory_lost)
  end)

  it("gives a failed run's output so far in detail.partial, shaped as a result's fields", function()
    local s = wb:session("edges:partial")
    assert(s:run("0")) -- a warm kernel: the timeout is the cell's
    local r, _, code, detail = s:run(
      "print('before', flush=True)\nimport time\ntime.sleep(30)", { timeout = 3 })
    assert.is_nil(r)
    assert.equal("TIMEOUT", code)
    assert.is_table(detail.partial)
    assert.equal("before\n", detail.partial.stdout)
    assert.equal("string", type(detail.partial.stderr))
    assert.is_table(detail.partial.results)
  end)
end)
