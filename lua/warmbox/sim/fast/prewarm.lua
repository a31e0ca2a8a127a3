--- warmbox.sim.fast.prewarm: a turn's prewarm (Session:prewarm) on the
-- model: at the turn's start, under the conversation's lock, what a run does
-- to get its sandbox (lease, connect or resolve or create) and the kernel's
-- start with the hooks cell; a run due meanwhile waits for it. `sim` is the
-- fast path's state (see warmbox.sim.fast), `c` a conversation.
-- @module warmbox.sim.fast.prewarm

local requests = require "warmbox.sim.fast.requests"
local session = require "warmbox.sim.fast.session"
local resolve = require "warmbox.sim.fast.resolve"
local rules = require "warmbox.sim.fast.rules"

local pcall = pcall
local run_code, kill, acquire, watched = requests.run_code, requests.kill, session.acquire, session.watched
local fill, lease_of, prewarm_warm = resolve.fill, rules.lease_of, rules.prewarm_warm

-- The prewarm at t under the lock (Session:prewarm, `within` the run's
-- timeout): nothing while the remembered lease has a run's margin
-- (decide.prewarm_warm); else acquire (eager: connect now), then the
-- kernel's start with the hooks cell under the watchdog. → t_after, ok
local function prewarm(sim, c, st, t)
  local within = sim.exec_timeout
  if st.sandbox_id and st.lease_end then
    local ok, value = pcall(sim.lease_hook, fill(sim, c, st, t, within))
    local lease = ok and lease_of(value, within) or lease_of(sim.idle_timeout, within)
    if prewarm_warm(t, st.lease_end, within, lease) then return t, true end
  end
  local t2, id = acquire(sim, c, st, t, within, true)
  t = t2
  if not id then return t, false end
  if st.hooked ~= id then
    local b
    t, b = watched(sim, st, id, t, function(t3)
      local t4, b2 = run_code(sim, id, true, 0, within, t3, st.box, sim.watcher, st)
      return t4, b2
    end)
    if not b then return t, false end
    if b.hooked then st.hooked = id end
  end
  if st.creating then
    -- what else its create made, listed now (session/prewarm.lua), not by the run
    sim.nreq = sim.nreq + 1
    t = t + 2 * sim.rtt2
    st.creating = nil
  end
  return t, true
end

-- Conversation c's prewarm at T, counted in `sim.prewarms`; a turn that runs
-- no code leaves it unused (with a sandbox per call: killed).
local function play(sim, c, T)
  sim.m_created, sim.m_resumed, sim.m_code_started, sim.m_sandbox = false, false, nil, nil
  local r0 = sim.nreq
  local f, ok = prewarm(sim, c, c.st, T)
  local prewarms = sim.prewarms
  prewarms.done = prewarms.done + 1
  prewarms.requests = prewarms.requests + sim.nreq - r0
  if not ok then prewarms.failed = prewarms.failed + 1 end
  if sim.m_created then prewarms.created = (prewarms.created or 0) + 1 end
  if sim.m_resumed then prewarms.resumed = (prewarms.resumed or 0) + 1 end
  if not c.runs then
    prewarms.unused = prewarms.unused + 1
    local m_sandbox = sim.m_sandbox
    if sim.per_call and m_sandbox then f = kill(sim, m_sandbox, f) end
  end
  c.free, c.lock_until = f, f
  if f > sim.last_end then sim.last_end = f end
end

-- A table of the prewarm's parts (as warmbox.sim.model's `ops`), for the fast path's files only.
return { prewarm = prewarm, play = play }
