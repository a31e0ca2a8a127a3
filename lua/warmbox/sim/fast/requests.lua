--- warmbox.sim.fast.requests: the requests a session sends, played on the
-- model's records at explicit times.
--
-- Each request is sent at `t` and arrives at `a = t + rtt / 2`; its effect is
-- booked at `a` (plus the server's work: a create, a resume, a pause, a
-- kernel's start), and its answer comes back half a round trip later, the
-- returned time. `sim` is the fast path's state (see warmbox.sim.fast);
-- `bx`, when given, is the sandbox's record the caller already holds (a
-- session keeps its sandbox's record: no lookup in the large table of live
-- ones).
-- @module warmbox.sim.fast.requests

local model_mod = require "warmbox.sim.model"

local string_format, math_min, math_max = string.format, math.min, math.max

local ops = model_mod.ops
local expire, stop_running, start_running = ops.expire, ops.stop_running, ops.start_running
local arm, start_paused, end_paused, remove, cap, touch = ops.arm, ops.start_paused, ops.end_paused,
  ops.remove, ops.cap, ops.touch

-- The sandbox as it is at time a (its lease may have run out since the
-- global clock: only its own conversation can see that ahead of time).
local function at(model, b, a)
  if b.state == "running" and b.end_at <= a then expire(model, b) end
  return b.state
end

-- Resume a paused sandbox at a with a lease of `timeout`: done at the returned time.
local function resume(sim, b, timeout, a)
  local model, stats = sim.model, sim.stats
  end_paused(model, b, a)
  start_running(model, a)
  local r
  if b.memory then
    r = a + sim.resume_s
  else
    r = a + sim.create_s
    stats.cold_boot_resumes = stats.cold_boot_resumes + 1
  end
  b.state, b.started_at, b.running_since = "running", r, r
  b.end_at = cap(model, b, r + timeout)
  arm(model, b)
  touch(model, b)
  b.memory = true
  stats.resumes = stats.resumes + 1
  return r
end

local function not_found_connect(id)
  return string_format("paused sandbox '%s' not found", id)
end

local function too_long(sim)
  return string_format("timeout cannot be greater than %g hours", sim.cfg.max_length_hours)
end

-- The record of sandbox `id`: `bx` when the caller has it, nil when it is gone.
local function find(sim, id, bx)
  if bx then
    if bx.state == "killed" then return nil end
    return bx
  end
  return sim.live[id]
end

-- c:connect(id, { timeout }) sent at t → t_after, resumed | nil, msg, code
local function connect(sim, id, timeout, t, bx)
  sim.nreq = sim.nreq + 1
  local rtt2 = sim.rtt2
  local a = t + rtt2
  local b = find(sim, id, bx)
  if not b then return a + rtt2, nil, not_found_connect(id), "NOT_FOUND" end
  if timeout > sim.max_length then return a + rtt2, nil, too_long(sim), "BAD_REQUEST" end
  local model = sim.model
  local st = at(model, b, a)
  if st == "running" then
    local e = cap(model, b, a + timeout)
    if e > b.end_at then b.end_at = e end
    arm(model, b)
    return a + rtt2, false
  end
  if st ~= "paused" then return a + rtt2, nil, not_found_connect(id), "NOT_FOUND" end
  local r = resume(sim, b, timeout, a)
  sim.m_resumed = true
  return r + rtt2, true
end

-- c:set_timeout(id, seconds) sent at t → t_after, true | nil, msg, code
local function set_timeout(sim, id, seconds, t, bx)
  sim.nreq = sim.nreq + 1
  local rtt2, model = sim.rtt2, sim.model
  local a = t + rtt2
  local b = find(sim, id, bx)
  if not b or at(model, b, a) ~= "running" then
    return a + rtt2, nil, string_format("sandbox '%s' not found or not running", id), "NOT_FOUND"
  end
  if a - b.started_at >= sim.max_length then return a + rtt2, nil, "max instance length exceeded", "BAD_REQUEST" end
  b.end_at = cap(model, b, a + seconds)
  if b.timer_at and b.timer_at > b.end_at then b.timer_at = nil end
  arm(model, b)
  if b.end_at <= a then expire(model, b) end
  return a + rtt2, true
end

-- c:info(id) sent at t → t_after, whether the sandbox exists (running or paused)
local function info(sim, id, t, bx)
  sim.nreq = sim.nreq + 1
  local rtt2 = sim.rtt2
  local a = t + rtt2
  local b = find(sim, id, bx)
  if b then at(sim.model, b, a) end
  return a + rtt2, b ~= nil and b.state ~= "killed"
end

-- c:kill(id) sent at t → t_after
local function kill(sim, id, t, bx)
  sim.nreq = sim.nreq + 1
  local rtt2 = sim.rtt2
  local a = t + rtt2
  local b = find(sim, id, bx)
  if b then
    local model = sim.model
    at(model, b, a)
    if b.state ~= "killed" then
      remove(model, b, a)
      local stats = sim.stats
      stats.kills = stats.kills + 1
    end
  end
  return a + rtt2
end

-- c:pause(id) sent at t (memory kept) → t_after, true | false | nil, msg, code
local function pause(sim, id, t, bx)
  sim.nreq = sim.nreq + 1
  local rtt2, model = sim.rtt2, sim.model
  local a = t + rtt2
  local b = find(sim, id, bx)
  if not b then return a + rtt2, nil, string_format("sandbox '%s' not found", id), "NOT_FOUND" end
  local st = at(model, b, a)
  if st == "paused" then return a + rtt2, false end
  local p = a + sim.pause_s
  if b.end_at <= p then
    expire(model, b)                       -- its lease ran out first
    return p + rtt2, false
  end
  stop_running(model, b, p)
  start_paused(b, p)
  b.memory = true
  local stats = sim.stats
  stats.pauses = stats.pauses + 1
  return p + rtt2, true
end

-- Reach a sandbox through the proxy at a: auto-resume a paused one.
local function reach(sim, id, a, bx)
  local b = find(sim, id, bx)
  if b and at(sim.model, b, a) == "paused" and b.auto_resume and b.memory then
    local max_length = sim.max_length
    a = resume(sim, b, math_min(math_max(b.timeout, sim.auto_resume_min), max_length), a)
    local stats = sim.stats
    stats.auto_resumes = stats.auto_resumes + 1
    sim.m_resumed = true
  end
  if not b or b.state ~= "running" then return nil, a end
  return b, a
end

local function gone_msg(id)
  return string_format("sandbox '%s' is not reachable (the sandbox was not found)", id)
end

-- A data-plane call but run_code (write, remove, make_dir, list_dir) sent at t.
local function dp(sim, id, t, bx)
  sim.nreq = sim.nreq + 1
  local rtt2 = sim.rtt2
  local b, a = reach(sim, id, t + rtt2, bx)
  if not b then return a + rtt2, nil, gone_msg(id), "SANDBOX_GONE" end
  return a + rtt2, b
end

-- The stream of a run broken by the sandbox's lease running out at `at`.
local function broken(sim, b, at_)
  expire(sim.model, b)
  local stats = sim.stats
  local paused = b.state == "paused"
  if paused then stats.paused_during_run = stats.paused_during_run + 1 end
  return (at_ or b.stopped_at) + sim.rtt2, nil, "the stream broke: the sandbox was "
    .. (paused and "paused" or "killed") .. " during the run", "STREAM_BROKEN"
end

-- s:run_code(cell) sent at t → t_after, b (its kernel has the hooks: b.hooked) | nil, msg, code.
-- `prelude`: the hooks cell (it takes no time), else a cell of `duration` seconds.
-- `watch(sim, st, until)`: the run's watchdog, its extensions up to the cell's end booked first.
local function run_code(sim, id, prelude, duration, timeout, t, bx, watch, st)
  sim.nreq = sim.nreq + 1
  local rtt2 = sim.rtt2
  local b, a = reach(sim, id, t + rtt2, bx)
  if not b then return a + rtt2, nil, gone_msg(id), "SANDBOX_GONE" end
  if not b.kernel then
    a = a + sim.kernel_s
    if b.end_at <= a then return broken(sim, b, a) end
    b.kernel, b.hooked = true, false
  end
  sim.m_code_started, sim.m_sandbox = a, id
  sim.nruns = sim.nruns + 1
  local d = prelude and 0 or duration
  local timed_out = timeout and d > timeout
  local finish = a + (timed_out and timeout or d)
  if watch then watch(sim, st, finish) end
  if b.end_at < finish then return broken(sim, b) end
  if timed_out then return finish + rtt2, nil, "execution timed out", "TIMEOUT" end
  b.executions = b.executions + 1
  if prelude then b.hooked = true end
  return finish + rtt2, b
end

-- A table of the requests (as warmbox.sim.model's `ops`), for the fast path's files only.
return {
  at = at, resume = resume, find = find, connect = connect, set_timeout = set_timeout, info = info, kill = kill,
  pause = pause, reach = reach, dp = dp, run_code = run_code,
}
