--- warmbox.sim.fast.loop: the fast path's discrete-event loop: a heap of
-- conversations by their next event (no coroutines), the arrivals in order,
-- a GC pass every `gc_every` seconds. A conversation's turn is played whole
-- when it starts (see warmbox.sim.fast). `sim` is the fast path's state.
-- @module warmbox.sim.fast.loop

local model_mod = require "warmbox.sim.model"
local tag_mod = require "warmbox.tag"
local session = require "warmbox.sim.fast.session"
local prewarm = require "warmbox.sim.fast.prewarm"
local gc = require "warmbox.sim.fast.gc"
local requests = require "warmbox.sim.fast.requests"

local tostring = tostring
local JIT_LEAD = require("warmbox.session.decide").JIT_LEAD
local math_floor, math_max, math_huge = math.floor, math.max, math.huge

local heap_push, heap_pop = model_mod.heap_push, model_mod.heap_pop
local settle, drain_running = model_mod.ops.settle, model_mod.ops.drain_running
local tag_value = tag_mod.tag_value
local run, play_prewarm, gc_pass, kill = session.run, prewarm.play, gc.pass, requests.kill

local function schedule(sim, c, t)
  local seq = sim.seq + 1
  sim.seq = seq
  heap_push(sim.heap, t, seq, c)
end

-- The conversation's next turn: schedules its first event (or ends it).
-- → the number of turns taken (the turns that run no code are skipped)
local function next_turn(sim, c)
  local t0, per_call = sim.t0, sim.per_call
  local n = 0
  while true do
    local t, duration, timeout, language, lead, runs = c.gen:turn()
    if not t then
      c.gen = nil                           -- done: its generator goes
      return n
    end
    c.n = c.n + 1
    n = n + 1
    local due = t0 + t
    c.due, c.duration, c.timeout, c.language, c.runs = due, duration, timeout, language, runs ~= false
    if per_call then
      c.skey = c.key .. "#" .. c.n
      c.stv = tag_value(c.skey, sim.tv_opts)
      c.st = {}
    end
    if sim.prewarm_on then
      c.phase = "prewarm"
      -- at the turn's start, or just in time: JIT_LEAD before the run (Session:prewarm's `just_in_time`)
      local l = lead or 0
      if sim.prewarm_on == "jit" and l > JIT_LEAD then l = JIT_LEAD end
      schedule(sim, c, math_max(due - l, c.free))
      return n
    end
    if c.runs then
      c.phase = "run"
      schedule(sim, c, math_max(due, c.free))
      return n
    end
  end
end

-- Conversation c's run at T (logged when asked). → how it went: "cold" (a
-- sandbox created), "resume", "warm", or nil (it failed)
local function play_run(sim, c, T)
  local began = math_max(c.due, c.prev_end)
  sim.m_created, sim.m_resumed, sim.m_code_started, sim.m_sandbox = false, false, nil, nil
  local f, ok, err, ecode = run(sim, c, c.st, T, c.duration, c.timeout, c.language)
  local log, t0, m_code_started, created, resumed = sim.log, sim.t0, sim.m_code_started, sim.m_created,
    sim.m_resumed
  if log then
    log[#log + 1] = { session = c.key, due = c.due - t0, start = began - t0, finish = f - t0,
      code_started = m_code_started and m_code_started - t0, ok = ok, code = not ok and tostring(ecode) or nil,
      created = created, resumed = resumed }
  end
  local how
  if not ok then
    sim.fail(tostring(ecode), tostring(err))
  else
    -- a cold start (after the conversation had a sandbox: its state lost), a resume or a warm hit
    how = created and "cold" or resumed and "resume" or "warm"
    if created then
      if c.had_box then
        local report = sim.report
        report.turns_lost_state = report.turns_lost_state + 1
        if not c.lost then
          c.lost = true
          report.conversations_lost_state = report.conversations_lost_state + 1
        end
      end
    end
    c.had_box = true
    local nlat = sim.nlat + 1
    sim.nlat = nlat
    sim.latencies[nlat] = math_floor(((m_code_started or f) - began) * 1e6 + 0.5) / 1000
  end
  local m_sandbox = sim.m_sandbox
  if sim.per_call and m_sandbox then
    f = kill(sim, m_sandbox, f)
  end
  c.free, c.prev_end, c.lock_until = f, f, f
  if f > sim.last_end then sim.last_end = f end
  return how
end

-- A conversation arriving at T: its record, then its first turn. → the
-- number of turns taken
local function arrive(sim, conv, T)
  local c = { key = conv.key, skey = conv.key, gen = sim.gen_of(conv), n = 0,
    free = T, prev_end = T,
    lock_until = T, had_box = false, lost = false }
  c.st = c
  if not sim.per_call then
    c.stv = tag_value(conv.key, sim.tv_opts)
    sim.by_tv[c.stv] = c
  end
  return next_turn(sim, c)
end

-- The model's clock to T: the leases that ran out and the running counts
-- that changed up to T booked.
local function advance(model, leases, deltas, T)
  if T > model.now then
    model.backend.t = T
    if leases.n > 0 and leases.t[1] <= T then settle(model, T) end
    model.now = T
  end
  if deltas.n > 0 and deltas.k[1] <= T then drain_running(model, T) end
end

-- The end of the simulation at horizon: the model settled there, the
-- loop's counters added to the books. → the time it ended
local function finish(sim, horizon)
  local model, report, stats = sim.model, sim.report, sim.stats
  local h = math_max(horizon, model.now)
  model.backend.t = h
  settle(model, h)
  model.now = h
  drain_running(model, h)
  model.deltas = nil
  stats.requests, stats.runs = stats.requests + sim.nreq, stats.runs + sim.nruns
  local events = sim.events
  events.connect = events.connect + sim.nconnect
  report.runs, report.ok, report.warm_hits = report.runs + sim.r_runs, report.ok + sim.r_ok,
    report.warm_hits + sim.r_warm_hits
  report.resumes, report.cold_starts = report.resumes + sim.r_resumes, report.cold_starts + sim.r_cold_starts
  report.turns = report.turns + sim.r_turns
  local prewarms = sim.prewarms
  report.prewarms, report.prewarms_unused, report.prewarms_failed = prewarms.done, prewarms.unused, prewarms.failed
  report.prewarm_requests = prewarms.requests
  report.prewarm_creates, report.prewarm_resumes = prewarms.created or 0, prewarms.resumed or 0
  return h
end

-- The loop, until the horizon: every conversation played, then the tail
-- (the GC passes up to it). → the time it ended
local function play(sim)
  local model, convs, t0, tail = sim.model, sim.convs, sim.t0, sim.tail
  local leases, deltas = model.leases, sim.deltas
  local heap = sim.heap
  local heap_t, heap_v = heap.t, heap.v
  local ci = 1
  local gc_every = sim.gc_every
  local next_gc = gc_every and t0 + gc_every or math_huge
  local horizon = nil
  -- the counts of runs and turns, in locals while the loop runs
  local r_runs, r_ok, r_cold, r_resumes, r_warm, r_turns = 0, 0, 0, 0, 0, 0
  while true do
    local top = heap_v[1]
    local tc = top and heap_t[1] or math_huge
    local conv = convs[ci]
    local ta = conv and t0 + conv.start or math_huge
    if tc == math_huge and ta == math_huge and not horizon then
      horizon = math_max(sim.last_end + tail, model.now)
    end
    if horizon and next_gc > horizon then break end
    local T = tc
    if ta < T then T = ta end
    if next_gc < T then T = next_gc end
    advance(model, leases, deltas, T)
    if T == next_gc then
      gc_pass(sim, T)
      next_gc = next_gc + gc_every
    elseif T == ta then
      ci = ci + 1
      convs[ci - 1] = nil                     -- what is left of it lives in c
      r_turns = r_turns + arrive(sim, conv, T)
    else
      -- the conversation on top: its prewarm (then its run, or its next turn)
      -- or its run (then its next turn)
      heap_pop(heap)
      if top.phase == "prewarm" then
        play_prewarm(sim, top, T)
        if top.runs then
          top.phase = "run"
          schedule(sim, top, math_max(top.due, top.free))
        else
          r_turns = r_turns + next_turn(sim, top)
        end
      else
        r_runs = r_runs + 1
        local how = play_run(sim, top, T)
        if how then
          r_ok = r_ok + 1
          if how == "warm" then r_warm = r_warm + 1 elseif how == "resume" then r_resumes = r_resumes + 1
          else r_cold = r_cold + 1 end
        end
        r_turns = r_turns + next_turn(sim, top)
      end
    end
  end
  sim.r_runs, sim.r_ok, sim.r_warm_hits, sim.r_resumes, sim.r_cold_starts, sim.r_turns = r_runs, r_ok, r_warm,
    r_resumes, r_cold, r_turns
  return finish(sim, horizon or math_max(sim.last_end + tail, model.now))
end

-- A table of the loop (as warmbox.sim.model's `ops`), for the fast path's files only.
return { play = play }
