--- warmbox.sim.fast.session: one run of a session (Session:run with
-- `parallel`, as warmbox.new gives it) played on the model: the lease, the
-- remembered sandbox (`should_refresh`; then extended alongside the execute,
-- resumed by it, or `connect` first) or the resolve, the maximum run length's
-- recycle, the output directory or the hooks cell, the cell and its outputs
-- under the lease's watchdog, a run that never reached a kernel sent once
-- more, and a policy's pause after the run (`pause_after_run`).
-- `sim` is the fast path's state (see warmbox.sim.fast); `c` a conversation,
-- `st` what its session remembers (see rules.forget).
-- @module warmbox.sim.fast.session

local outputs = require "warmbox.outputs"
local rules = require "warmbox.sim.fast.rules"
local requests = require "warmbox.sim.fast.requests"
local resolve_mod = require "warmbox.sim.fast.resolve"

local tostring, pcall = tostring, pcall
local math_max, math_min = math.max, math.min
local watched_end, pause_after

local connect, info, pause, dp, run_code = requests.connect, requests.info,
  requests.pause, requests.dp, requests.run_code
local fill, hook_failed, hook_returned, resolve = resolve_mod.fill, resolve_mod.hook_failed,
  resolve_mod.hook_returned, resolve_mod.resolve
local forget, remember, is_gone, lease_of, needs_recycle = rules.forget, rules.remember, rules.is_gone,
  rules.lease_of, rules.needs_recycle
local remembered_way, watch_at, auto_resume_end = rules.remembered_way, rules.watch_at, rules.auto_resume_end
local gone_before, unanswered, cell_marked, never_arrived = rules.gone_before, rules.unanswered, rules.cell_marked,
  rules.never_arrived
local ready_retry, retryable_of, refresh_next = rules.ready_retry, rules.retryable, rules.refresh_next

-- The maximum run length (session/resolve.lua's acquire): pause (memory kept) and
-- connect, a new run of the same kernel. → t_after, id, reused | t_after, nil, msg, code
local function recycle(sim, st, id, reused, lease, t)
  local box = st.box
  local t2, pok, perr, pcode = pause(sim, id, t, box)
  t = t2
  if pok == nil and not is_gone(pcode) then return t, nil, perr, pcode end
  local t1 = t
  local t3, resumed, cerr, ccode = connect(sim, id, lease, t, box)
  t = t3
  local events = sim.events
  events.recycle = (events.recycle or 0) + 1
  if resumed == nil then
    if is_gone(ccode) then forget(st) else st.lease_end = nil end
    return t, nil, cerr, ccode
  end
  remember(st, box or sim.live[id], t1 + lease, t1, sim.max_length)
  return t, id, reused
end

-- A sandbox for one run at t (session/resolve.lua's acquire; `eager`: a prewarm). How it
-- came and its lease are left in sim.w_how, sim.w_lease for the watchdog.
-- → t_after, id, reused | t_after, nil, msg, code
local function acquire(sim, c, st, t, run_timeout, eager)
  local ctx = fill(sim, c, st, t, run_timeout)
  local ok, value = pcall(sim.lease_hook, ctx)
  if not ok then return t, nil, hook_failed(sim, "lease", value), "POLICY" end
  local lease = lease_of(value, run_timeout)
  if not lease then return t, nil, hook_returned(sim, "lease", tostring(value), "positive number"), "POLICY" end
  ctx.lease = lease
  sim.w_how, sim.w_lease = nil, lease
  local id, reused
  local sid = st.sandbox_id
  if sid then
    -- the remembered sandbox, as it is when `should_refresh` says so, else
    -- extended alongside the execute, resumed by it, or refreshed by
    -- `connect`; gone: forgotten and resolved (secure_remembered)
    local ok2, refresh = pcall(sim.refresh_hook, ctx)
    if not ok2 then return t, nil, hook_failed(sim, "should_refresh", refresh), "POLICY" end
    local how = refresh and remembered_way(st.lease_end, st.auto_resume, t, lease, not eager) or nil
    if not refresh or how then
      id, reused = sid, true
      sim.w_how = how
    else
      local t1 = t
      local box = st.box
      local t2, resumed, cerr, ccode = connect(sim, sid, lease, t, box)
      t = t2
      sim.nconnect = sim.nconnect + 1
      if resumed ~= nil then
        remember(st, box or sim.live[sid], t1 + lease, resumed and t1 or nil, sim.max_length)
        id, reused = sid, true
      elseif not is_gone(ccode) then
        return t, nil, cerr, ccode
      else
        t = info(sim, sid, t, box) -- the 404 confirmed (the model's are real)
        forget(st)
      end
    end
  end
  if not id then
    local t2, kid, kreused, ecode = resolve(sim, c, st, lease, t)
    t = t2
    if not kid then return t, nil, kreused, ecode end
    id, reused = kid, kreused
  end
  if needs_recycle(st.run_started, sim.max_length, t, run_timeout) then
    return recycle(sim, st, id, reused, lease, t)
  end
  return t, id, reused
end

-- The run's own cell sent at t → t_after, b | nil, msg, code, asked: when its
-- execute was unanswered, what asking the sandbox gave (session/retry.lua's reach:
-- give a marked cell's id up over envd, else the control plane's info):
-- "again", "gone" or false.
local function send_cell(sim, id, st, language, duration, run_timeout, t, box)
  local t2, b, err, code_ = run_code(sim, id, false, duration, run_timeout, t, box, sim.watcher, st)
  if b or not unanswered(code_) then return t2, b, err, code_ end
  local python = language == "python"
  -- a cell without a guard may have run: never sent again
  if not cell_marked(python, st.hooked == id, not python and outputs.cell_guarded("", language, "0") ~= nil) then
    return t2, nil, err, code_, false
  end
  local claimed, exists
  t2, claimed = dp(sim, id, t2, box)
  if not claimed then t2, exists = info(sim, id, t2, box) end
  return t2, nil, err, code_, never_arrived(claimed, exists)
end

-- ----------------------------------------------------------------
-- The watchdog (warmbox.session.execute's `watched`): while an attempt
-- goes on, the lease is extended (connect) at decide.watch_at of its end.
-- Its extensions are booked when the attempt reaches their times (`watch`
-- before each request, with the time that request needs the sandbox until).
-- ----------------------------------------------------------------

-- One extension sent at te: the remembered lease moved on (as the engine's
-- `remember`), the time its answer comes back kept (the run waits for it).
local function extend(sim, st, te)
  local id, lease, box = sim.w_id, sim.w_lease, sim.w_box
  local t2, resumed = connect(sim, id, lease, te, box)
  sim.nconnect = sim.nconnect + 1
  if resumed == nil then
    sim.w_end = nil                        -- (gone: the engine stops watching too)
    return
  end
  remember(st, box or sim.live[id], te + lease, resumed and te or nil, sim.max_length)
  sim.w_end = st.lease_end
  if t2 > sim.w_busy then sim.w_busy = t2 end
end

-- The extensions due before `t_until`.
local function watch(sim, st, t_until)
  local lease = sim.w_lease
  local e = sim.w_end
  while e do
    local te = watch_at(e, lease)
    if te >= t_until then return end
    extend(sim, st, te)
    e = sim.w_end
  end
end

-- The watchdog's start at t for sandbox id (the attempt's first act).
local function watch_start(sim, st, id, t)
  sim.w_id, sim.w_box, sim.w_busy, sim.watcher = id, st.box, t, watch
  local how = sim.w_how
  if how == "auto_resume" then
    sim.w_end = auto_resume_end(t, sim.max_length)
  else
    sim.w_end = st.lease_end
  end
  if how == "alongside" then extend(sim, st, t) end
end

-- Before the run's cell (session/execute.lua's prepare; watched: no cover): the output
-- directory (another language: emptied on a reused sandbox, made), or the
-- hooks cell on a kernel without them. → t_after, truthy | t_after, nil, msg, code
local function prepare(sim, id, st, python, reused, run_timeout, t, box)
  local b, err, code_ = true, nil, nil
  if not python then
    if reused then t, b, err, code_ = dp(sim, id, t, box) end
    if b then t, b, err, code_ = dp(sim, id, t, box) end
  elseif st.hooked ~= id then
    t, b, err, code_ = run_code(sim, id, true, 0, run_timeout, t, box, sim.watcher, st)
    if b and b.hooked then st.hooked = id end
  end
  if not b then return t, nil, err, code_ end
  return t, true
end

-- The attempt's end at t (execute's `watched`): the extensions due until
-- then, the run back once the last one answered; a resume by traffic
-- (`reached`: the execute reached the sandbox) remembered as a new E2B run.
function watched_end(sim, st, t, t_exec, reached)
  watch(sim, st, t)
  if sim.w_busy > t then t = sim.w_busy end
  if sim.w_how == "auto_resume" and reached then
    st.run_started = t_exec
    st.lease_end = math_max(st.lease_end or 0, auto_resume_end(t_exec, sim.max_length))
  end
  sim.w_end = nil
  return t
end

-- A policy that pauses after every run (`pause_after_run`; Session's
-- `pause_after`): the pause, and the lease remembered as over.
function pause_after(sim, st, id, t)
  local t2 = pause(sim, id, t, st.box)
  local events = sim.events
  events.pause_after_run = (events.pause_after_run or 0) + 1
  st.lease_end = math_min(st.lease_end or t2, t2 - rules.PAUSE_GRACE)
  return t2
end

-- One run (Session:run) starting at t → t_after, ok, msg, code
local function run(sim, c, st, t, duration, timeout, language)
  local run_timeout = timeout or sim.exec_timeout
  language = language or "python"
  local python = language == "python"
  for attempt = 1, 2 do
    local t2, id, reused, ecode = acquire(sim, c, st, t, run_timeout)
    t = t2
    if not id then return t, false, reused, ecode end
    local box = st.box
    local b, err, code_, asked
    local t_exec = t
    watch_start(sim, st, id, t)
    t, b, err, code_ = prepare(sim, id, st, python, reused, run_timeout, t, box)
    if not b and gone_before(code_) then
      -- unreachable before the cell (session/execute.lua's ready): sent again while it exists
      local exists
      t, exists = info(sim, id, t, box)
      asked = ready_retry(exists)
    elseif b then
      t, b, err, code_, asked = send_cell(sim, id, st, language, duration, run_timeout, t, box)
    end
    if b then
      if python and b.hooked then
        st.hooked = id
      else
        if python then st.hooked = nil end
        watch(sim, st, t)
        t = dp(sim, id, t, box)              -- the listing of the output directory
      end
    end
    t = watched_end(sim, st, t, t_exec, b or not asked)
    if b then
      st.last_run = t
      st.memory_lost = nil
      if st.creating then
        -- a create's record: one list finds what else it made (nothing, in the model)
        sim.nreq = sim.nreq + 1
        t = t + 2 * sim.rtt2
        st.creating = nil
      end
      if sim.pause_after_run then t = pause_after(sim, st, id, t) end
      return t, true
    end
    local retryable = retryable_of(asked, code_)
    if retryable and attempt == 1 then
      local events = sim.events
      events.retry = events.retry + 1
      if retryable == "gone" then
        forget(st)
      elseif unanswered(code_) then
        st.lease_end = nil
      end
    else
      if refresh_next(asked) then st.lease_end = nil end
      return t, false, err, code_
    end
  end
end

-- A step `fn(t) -> t_after, b` on sandbox id at t under the watchdog (as
-- execute's `watched` wraps a prewarm's hooks cell). → t_after, b
local function watched(sim, st, id, t, fn)
  local t_exec = t
  watch_start(sim, st, id, t)
  local t2, b = fn(t)
  return watched_end(sim, st, t2, t_exec, b ~= nil), b
end

-- A table of the session's steps (as warmbox.sim.model's `ops`), for the fast path's files only.
return { acquire = acquire, run = run, watched = watched }
