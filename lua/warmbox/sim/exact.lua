--- warmbox.sim.exact: the simulator's exact path.
--
-- Real `warmbox.session` objects and `warmbox.gc` passes against the model
-- (`warmbox.sim.model`), each conversation a `warmbox.task` on the model's
-- virtual clock: turns of different conversations overlap, one
-- conversation's turns run one after another. `warmbox.sim.run` sets up the
-- model and the report and calls `simulate`; `warmbox.sim.fast` plays the
-- same decisions without tasks.
-- @module warmbox.sim.exact

local session_mod = require "warmbox.session"
local gc_mod = require "warmbox.gc"
local gc_cp_mod = require "warmbox.gc.checkpoints"
local task_mod = require "warmbox.task"

local ipairs, tostring, pcall = ipairs, tostring, pcall
local math_floor, math_max = math.floor, math.max

local _M = {}

-- The exact path's `details` log record of one run (times in seconds from the start, t0).
local function log_record(key, due, start, finish, t0, ok, r, ecode, mark)
  return { session = key, due = due, start = start, finish = finish,
    code_started = mark.code_started and mark.code_started - t0, ok = ok and r and true or false,
    code = not (ok and r) and (ok and tostring(ecode) or "ERROR") or nil,
    created = mark.created or false, resumed = mark.resumed or false }
end

-- A runner (the `warmbox.runner` methods `warmbox.session.checkpoint` calls) on the
-- simulator's scheduler: an automatic checkpoint is a task of the simulation.
local function sim_runner(sched)
  local rn = {}
  function rn.spawn(_, fn, ...) return sched:spawn(fn, ...) end
  function rn.current() return sched:current() end
  function rn.step() return sched:step(0) end
  function rn.sleep(_, s) return sched:sleep(s) end
  function rn.join(_, t)
    if t:done() then return end
    local ev = sched:event()
    t:on_done(function() ev:signal() end)
    ev:wait()
  end
  return rn
end

-- `parallel` for the simulation's sessions (as warmbox.runner's): `main()` in
-- the running task, `side(ctl)` as a task of its own on the virtual clock, so
-- a run's lease watchdog extends the model's leases at the times the engine's
-- would. (A model request cannot be aborted: `interrupt` does nothing.)
local function sim_parallel(sched)
  return function(main, side)
    local finished = false
    local wake = sched:event()
    local ctl = {
      main_done = function() return finished end,
      interrupt = function() end,
      sleep = function(sec) return sched:sleep(sec) end,
      wait = function(sec)
        if finished then return true end
        return wake:wait(sched:now() + sec)
      end,
      poke = function() wake:broadcast(true) end,
    }
    local child = sched:spawn(side, ctl)
    local ret = table.pack(main())
    finished = true
    wake:broadcast(true)
    if not child:done() then
      local ev = sched:event()
      child:on_done(function() ev:signal() end)
      ev:wait()
    end
    return child, table.unpack(ret, 1, ret.n)
  end
end

-- One part of a GC pass, `fn(o)` (warmbox.gc's sandbox pass or the checkpoint
-- pass): a raise or an error counts in `gc_errors`, a report goes to `count`.
local function gc_part(report, fn, o, note_error, count)
  local ok, rep, gerr, gcode = pcall(fn, o)
  if not ok then
    report.gc_errors = report.gc_errors + 1
    note_error("GC", tostring(rep))
  elseif not rep then
    report.gc_errors = report.gc_errors + 1
    note_error(gcode, gerr)
  else
    count(report, rep)
  end
end

local function count_gc(report, rep)
  report.gc_kills = report.gc_kills + rep.killed
  report.gc_demoted = report.gc_demoted + rep.demoted
  report.gc_busy = report.gc_busy + rep.busy
  report.gc_errors = report.gc_errors + #rep.errors
end

local function count_gc_checkpoints(report, rep)
  report.gc_busy = report.gc_busy + rep.busy
  report.gc_errors = report.gc_errors + rep.failed
end

-- The report's counts of one finished run `r` of a conversation (`had_box`:
-- an earlier turn had a sandbox; `lost`: the conversation already lost it)
-- → had_box, lost
local function count_run(report, mark, had_box, lost)
  if mark.created then
    report.cold_starts = report.cold_starts + 1
    if had_box then
      report.turns_lost_state = report.turns_lost_state + 1
      if not lost then
        lost = true
        report.conversations_lost_state = report.conversations_lost_state + 1
      end
    end
  elseif mark.resumed then
    report.resumes = report.resumes + 1
  else
    report.warm_hits = report.warm_hits + 1
  end
  return true, lost
end

-- One conversation (a task): its turns one after another (never two at once).
local function conversation(X, conv)
  local report, clock, t0, log = X.report, X.clock, X.t0, X.log
  local data = task_mod.current().data
  local gen = X.convs.gen_of(conv)
  local per_call = X.per_call
  local s = (not per_call) and X.new_session(conv.key) or nil
  local had_box, lost = false, false
  local n = 0
  while true do
    local t, duration, timeout, language, _, runs = gen:turn()
    if not t then break end
    n = n + 1
    local due = t0 + t
    if runs == false then
      report.turns = report.turns + 1      -- a turn that runs no code
      goto next
    end
    if due > clock() then X.sched:sleep_until(due) end
    data.duration, data.mark = duration, {}
    do
      local run_s = s or X.new_session(conv.key .. "#" .. n)
      local began = clock()
      report.turns = report.turns + 1
      report.runs = report.runs + 1
      local ok, r, err, ecode = pcall(run_s.run, run_s, X.code, { timeout = timeout, language = language })
      local mark = data.mark
      if log then log[#log + 1] = log_record(conv.key, due - t0, began - t0, clock() - t0, t0, ok, r, ecode, mark) end
      if not ok then
        X.fail("ERROR", tostring(r))
      elseif not r then
        X.fail(tostring(ecode), tostring(err))
      else
        report.ok = report.ok + 1
        had_box, lost = count_run(report, mark, had_box, lost)
        -- Virtual times are unix seconds: round away the float noise (to the microsecond).
        local ms = ((mark.code_started or clock()) - began) * 1000
        X.nlat = X.nlat + 1
        X.latencies[X.nlat] = math_floor(ms * 1000 + 0.5) / 1000
      end
      if per_call and mark.sandbox_id then
        X.model:kill(mark.sandbox_id)            -- a fresh sandbox per call: killed after it
      end
      local now = clock()
      if now > X.last_end then X.last_end = now end
    end
    ::next::
  end
  X.active = X.active - 1
  X.finish_if_idle()
end

-- GC passes every gc_every seconds until the horizon (a task).
local function gc_loop(X)
  local report, policy, sched = X.report, X.policy, X.sched
  local gc_every = X.gc_every
  X.gc_next = X.t0 + gc_every
  while true do
    if X.horizon and X.gc_next > X.horizon then break end
    X.gc_sleeping = true
    sched:sleep_until(X.gc_next)
    X.gc_sleeping = false
    if X.horizon and X.gc_next > X.horizon then break end
    gc_part(report, gc_mod.run, { client = X.model, tag = X.tag, policy = policy, lock = X.new_lock,
      clock = X.clock, max_age = X.max_age }, X.note_error, count_gc)
    report.gc_passes = report.gc_passes + 1
    if policy.checkpoint_gc then
      gc_part(report, gc_cp_mod.run, { client = X.model, tag = X.tag, policy = policy, lock = X.new_lock,
        clock = X.clock }, X.note_error, count_gc_checkpoints)
    end
    X.gc_next = X.gc_next + gc_every
  end
end

--- Play a simulation on the exact path. `X` holds what `warmbox.sim.run` set
-- up: `convs`, `policy`, `per_call`, `model`, `sched` (the model's
-- scheduler), `clock`, `new_lock`, `report`, `latencies` (appended to), `log`
-- (or nil), `t0`, `code`, `exec_timeout`, `idle_timeout`, `template`, `tag`,
-- `max_age`, `gc_every` (or false), `tail`, `fail(code, msg)`,
-- `note_error(code, msg)`. Fills the report's counts.
-- @treturn number the time the simulation ended (its horizon)
-- @treturn number how many latencies it appended
function _M.simulate(X)
  local sched, clock, report, model, policy = X.sched, X.clock, X.report, X.model, X.policy
  local events = report.events
  local rn = sim_runner(sched)
  local function on_event(name) events[name] = (events[name] or 0) + 1 end
  local parallel = sim_parallel(sched)
  function X.new_session(key)
    return session_mod.new(key, { client = model, lock = X.new_lock, clock = clock, policy = policy,
      parallel = parallel,
      template = X.template, exec_timeout = X.exec_timeout, idle_timeout = X.idle_timeout, tag = X.tag,
      origin = "warmbox.sim", on_event = on_event, max_run_length = model.max_length, runner = rn })
  end
  X.nlat, X.last_end, X.active, X.arrived_all, X.horizon = #X.latencies, X.t0, 0, false, nil
  -- The GC task, while it sleeps until its next pass (gc_next): the simulation
  -- ends at the horizon, not at the first pass after it.
  local gc_task
  function X.finish_if_idle()
    if X.arrived_all and X.active == 0 and not X.horizon then
      X.horizon = math_max(X.last_end + X.tail, clock())
      if gc_task and X.gc_sleeping and X.gc_next > X.horizon then gc_task:cancel() end
    end
  end
  -- Arrivals: each conversation starts as a task when its first turn is due.
  sched:spawn(function()
    for _, conv in ipairs(X.convs) do
      local due = X.t0 + conv.start
      if due > clock() then sched:sleep_until(due) end
      X.active = X.active + 1
      sched:spawn(conversation, X, conv)
    end
    X.arrived_all = true
    X.finish_if_idle()
  end)
  if X.gc_every then gc_task = sched:spawn(gc_loop, X) end
  local ok, lerr = sched:loop()
  if not ok then
    sched:cancel_all()
    X.note_error("DEADLOCK", tostring(lerr))
  end
  return X.horizon or math_max(X.last_end + X.tail, clock()), X.nlat
end

return _M
