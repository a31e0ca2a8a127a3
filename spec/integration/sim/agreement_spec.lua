-- The simulator agrees with a real server: one small trace (20 conversations,
-- 200 turns, warm hits, pauses and resumes, then one GC pass that kills the
-- conversations idle for long) runs against the virtual-time model and
-- against a real warmboxd whose clock stands still and moves only when the
-- spec moves it (POST /_warmboxd/clock, frozen: the server's leases,
-- auto-pauses and endAt, and the library's `clock`, move together to each
-- turn's time), scaled down (9 s leases, --rtt-ms, --create-ms, --resume-ms).
-- The model runs it twice: on its fast path (warmbox.sim.fast: the session's
-- decisions played on the model) and on its exact path (the real warmbox.session code). All three give the same
-- counts of creates, resumes, pauses, kills and ok/failed runs.
--
-- The trace keeps every gap far from the lease: a conversation's turns come
-- in bursts of 4 turns 0.2 s apart (warm), its bursts 11.4 s apart or more
-- (paused, then resumed), and no two bursts overlap. The real run follows the
-- trace in order on the frozen clock, so the time a run really takes (a cold
-- start, a sanitizer build, a loaded machine) passes on neither clock. A
-- lease is a 4 s run + LEASE_MARGIN: 9 s, refreshed by a turn unless one in
-- the same second (the clock counts whole seconds) already did, so a sandbox
-- pauses 8-9 s after its burst's last turn: the early ones (last turns
-- 12.6-23.4 s) by 32.4 s, the late ones (48.6-59.4 s) from 56.6 s on. At
-- the GC pass (72.5 s) their idle ages are at least 40.1 s and at most 15.9 s:
-- far from GC's max_age (27 s) on both sides.
local wbd = require "spec.helpers.warmboxd"
local sim = require "warmbox.sim"

local TIMEOUT = 4                      -- exec_timeout = idle_timeout (lease: 4 + LEASE_MARGIN)
local MAX_AGE, GC_AT = 27, 72.5        -- one GC pass GC_AT s after the start
local RTT, CREATE, RESUME = 5, 50, 50  -- ms, the same on both sides
local WINDOW = 1.2                     -- seconds per burst

-- 10 "early" conversations (2 bursts, windows 0-9 then 10-19) and 10 "late"
-- ones (3 bursts, windows 20-29, 30-39, 40-49): 200 turns in 60 s.
local function trace()
  local turns = {}
  local function burst(name, window)
    for k = 0, 3 do
      turns[#turns + 1] = { t = window * WINDOW + k * 0.2, session = name, duration = 0, language = "bash" }
    end
  end
  for b = 0, 1 do
    for i = 1, 10 do burst("early-" .. i, b * 10 + i - 1) end
  end
  for b = 0, 2 do
    for i = 1, 10 do burst("late-" .. i, 20 + b * 10 + i - 1) end
  end
  return turns
end

describe("the simulator against a real warmboxd", function()
  local srv, lockdir

  lazy_setup(function()
    srv = wbd.start{ args = { "--rtt-ms", tostring(RTT), "--create-ms", tostring(CREATE),
      "--resume-ms", tostring(RESUME) } }
    lockdir = os.tmpname()
    os.remove(lockdir)
  end)
  lazy_teardown(function()
    if srv then srv:stop() end
    if lockdir then os.execute("rm -rf '" .. lockdir .. "'") end
  end)

  it("gives the same counts of creates, resumes, pauses, kills and ok/failed runs", function()
    local turns = trace()
    assert.equal(200, #turns)

    -- 1. The model, on both paths.
    local function model_run(exact)
      -- tail: the horizon (59.4 + 16 s) after the GC pass and every lease end
      local m = assert(sim.run{ trace = turns, exec_timeout = TIMEOUT, idle_timeout = TIMEOUT,
        template = "code-interpreter-v1", code = "true", max_age = MAX_AGE, gc_every = GC_AT, tail = 16,
        model = { rtt_ms = RTT, create_ms = CREATE, resume_ms = RESUME, kernel_ms = 100 }, exact = exact })
      assert.equal(1, m.gc_passes)
      assert.equal(exact and "exact" or "fast", m.path)
      return { creates = m.created, resumes = m.model_resumes, pauses = m.auto_pauses + m.pauses,
        kills = m.kills + m.timeout_kills, ok = m.ok, failed = m.failed }
    end
    local model_counts = model_run(false)
    assert.same(model_counts, model_run(true))

    -- 2. The real server, on its frozen clock: turns run in time order.
    -- The server's clock stands still (frozen) and moves only when the spec
    -- moves it, to each turn's time; the library's clock is the same one. So
    -- the run sees the trace's times exactly, however slow the machine is.
    local frozen = assert(srv:admin("POST", "/clock", { freeze = true }).json)
    local start, moved = wbd.utc(frozen.now), 0
    local function clock() return math.floor(start + moved) end
    local wb = assert(require("warmbox").new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key,
      exec_timeout = TIMEOUT, idle_timeout = TIMEOUT, lock = { backend = "file", dir = lockdir }, clock = clock })
    local function move_to(t)
      local ms = math.floor((t - moved) * 1000 + 0.5)
      if ms > 0 then
        srv:advance(ms / 1000)
        moved = moved + ms / 1000
      end
    end
    local c = wb.client
    local real = { creates = 0, resumes = 0, pauses = 0, kills = 0, ok = 0, failed = 0 }
    local create, connect, pause = c.create, c.connect, c.pause
    c.create = function(self, ...)
      local sb, e1, e2 = create(self, ...)
      if sb then real.creates = real.creates + 1 end
      return sb, e1, e2
    end
    c.connect = function(self, ...)
      local sb, resumed, e2 = connect(self, ...)
      if sb and resumed then real.resumes = real.resumes + 1 end
      return sb, resumed, e2
    end
    c.pause = function(self, ...)
      local r, e1, e2 = pause(self, ...)
      if r then real.pauses = real.pauses + 1 end
      return r, e1, e2
    end
    local sessions, errs = {}, {}
    for _, turn in ipairs(turns) do
      move_to(turn.t)
      sessions[turn.session] = sessions[turn.session] or wb:session(turn.session)
      local r, err, code = sessions[turn.session]:run("true", { language = turn.language })
      if r then
        real.ok = real.ok + 1
      else
        real.failed = real.failed + 1
        errs[#errs + 1] = tostring(code) .. ": " .. tostring(err)
      end
    end
    -- Every lease has run out by GC time: each sandbox paused once more than it resumed.
    move_to(GC_AT)
    local paused = 0
    for item, err in c:list{ state = { "paused" } } do
      assert(item, err)
      paused = paused + 1
    end
    real.pauses = real.pauses + real.resumes + paused
    local g = assert(wb:gc{ max_age = MAX_AGE })
    real.kills = g.killed
    wb:close()

    assert.same(model_counts, real, "failures: " .. table.concat(errs, "; "))
    -- and the counts are the ones the trace was built for
    assert.same({ creates = 20, resumes = 10 * 1 + 10 * 2, pauses = 20 + 30, kills = 10, ok = 200, failed = 0 },
      model_counts)
  end)
end)
