-- Fencing: a run whose holder was paused past its lock's
-- expiry (simulated: its execute, or its output read, held by warmboxd for
-- longer than the lock's exptime, while a second run of the conversation took
-- the lock over and ran) is refused by the sandbox: its cell never runs after
-- the later run's (FENCED, counted by a line each cell appends in the sandbox),
-- and it never returns the later run's files (its cell ran: reported with
-- files_error FENCED and lock_lost, never as refused).
local sessions = require "spec.helpers.sessions"

describe("sessions: a run whose lock was taken over is fenced (warmboxd)", function()
  local env = sessions.new()
  local srv

  lazy_setup(function() srv = env:start() end)
  lazy_teardown(function() env:stop() end)
  before_each(function() srv:clear_faults() end)

  -- Runs `first` (held by the fault `hold`), then, once its lock expired
  -- (exptime 1 s), `second` in another task of the same conversation.
  -- → first's returns, second's returns
  local function overtaken(backend, key, hold, first, second, language)
    local lock = { backend = backend, exptime = 1 }
    if backend == "file" then lock.dir = env.lockdir end
    local wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60, lock = lock }
    local s = env:warm(wb, key)
    srv:fault(hold)
    local a, b
    local o = { language = language }
    wb:spawn(function() a = table.pack(s:run(first, o)) end)
    wb:spawn(function() b = table.pack(wb:session(key):run(second, o)) end)
    assert(wb:loop())
    return a, b
  end

  for _, backend in ipairs({ "memory", "file" }) do
    it(backend .. " lock: a cell that reaches the kernel after a later run's is refused, never run", function()
      local code1, mark1 = env:cell("y = 1")
      local code2, mark2 = env:cell("y = 2")
      local a, b = overtaken(backend, "fence:exec-" .. backend,
        { route = "interp POST /execute", count = 1, delay_ms = 3000 }, code1, code2)
      assert(b[1], b[2])
      local id = b[1].sandbox_id
      assert.is_nil(a[1], "the stale run reported ok")
      assert.equal("FENCED", a[3])
      assert.equal(0, env:executions(id, mark1))
      assert.equal(1, env:executions(id, mark2))
    end)

    for _, lang in ipairs({ "bash", "javascript" }) do
      it(backend .. " lock: a " .. lang .. " cell that reaches the kernel after a later run's is refused", function()
        local code1, mark1 = env:cell_in(lang)
        local code2, mark2 = env:cell_in(lang)
        local a, b = overtaken(backend, "fence:exec-" .. lang .. "-" .. backend,
          { route = "interp POST /execute", count = 1, delay_ms = 3000 }, code1, code2, lang)
        assert(b[1], b[2])
        local id = b[1].sandbox_id
        assert.is_nil(a[1], "the stale " .. lang .. " run reported ok")
        assert.equal("FENCED", a[3])
        assert.equal(0, env:executions(id, mark1))
        assert.equal(1, env:executions(id, mark2))
      end)
    end

    it(backend .. " lock: a run collecting its outputs after a later run's cell never returns its files, is ok",
      function()
      local big = function(c) return "open('/home/user/output/out.bin', 'wb').write(b'" .. c .. "' * 600000)" end
      local a, b = overtaken(backend, "fence:files-" .. backend,
        { route = "envd GET /files", count = 1, delay_ms = 3000 }, big("a"), big("b"))
      assert(b[1], b[2])
      assert.equal(("b"):rep(600000), b[1].files[1].content)
      -- Its cell ran to its end: the run is reported (never as refused), with
      -- no files, the fence in files_error and its lock said lost.
      assert(a[1], a[2])
      assert.same({}, a[1].files)
      assert.equal("FENCED", a[1].files_error[2])
      assert.is_true(a[1].lock_lost)
    end)
  end
end)
