--- warmbox.sim.fast.session: one run of a session (Session:run without
-- `parallel`) played on the model: the lease, the remembered sandbox
-- (`should_refresh`, `connect`) or the resolve, the maximum run length's
-- recycle, the output directory or the hooks cell, the lease's cover, the
-- cell and its outputs, a run that never reached a kernel sent once more.
-- `sim` is the fast path's state (see warmbox.sim.fast); `c` a conversation,
-- `st` what its session remembers (see rules.forget).
-- @module warmbox.sim.fast.session

local outputs = require "warmbox.outputs"
local rules = require "warmbox.sim.fast.rules"
local requests = require "warmbox.sim.fast.requests"
local resolve_mod = require "warmbox.sim.fast.resolve"

local tostring, pcall = tostring, pcall
local math_max = math.max

local connect, set_timeout, info, pause, dp, run_code = requests.connect, requests.set_timeout, requests.info,
  requests.pause, requests.dp, requests.run_code
local fill, hook_failed, hook_returned, resolve = resolve_mod.fill, resolve_mod.hook_failed,
  resolve_mod.hook_returned, resolve_mod.resolve
local forget, remember, is_gone, lease_of, needs_recycle = rules.forget, rules.remember, rules.is_gone,
  rules.lease_of, rules.needs_recycle
local extension, capped = rules.extension, rules.capped
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

-- A sandbox for one run at t (session/resolve.lua's acquire). → t_after, id, reused | t_after, nil, msg, code
local function acquire(sim, c, st, t, run_timeout)
  local ctx = fill(sim, c, st, t, run_timeout)
  local ok, value = pcall(sim.lease_hook, ctx)
  if not ok then return t, nil, hook_failed(sim, "lease", value), "POLICY" end
  local lease = lease_of(value, run_timeout)
  if not lease then return t, nil, hook_returned(sim, "lease", tostring(value), "positive number"), "POLICY" end
  ctx.lease = lease
  local id, reused
  local sid = st.sandbox_id
  if sid then
    -- the remembered sandbox, as it is when `should_refresh` says so, else
    -- refreshed by `connect`; gone: forgotten and resolved (secure_remembered)
    local ok2, refresh = pcall(sim.refresh_hook, ctx)
    if not ok2 then return t, nil, hook_failed(sim, "should_refresh", refresh), "POLICY" end
    if not refresh then
      id, reused = sid, true
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
  local t2, b, err, code_ = run_code(sim, id, false, duration, run_timeout, t, box)
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

-- The lease covers the whole run (session/execute.lua's cover): one that no longer
-- covers the cell after the hooks cell is extended before it.
-- → t_after, true | t_after, nil, msg, code
local function cover(sim, id, st, run_timeout, t, box)
  local want = extension(t, st.lease_end, run_timeout)
  if not want then return t, true end
  local t1, ok, err, code_ = set_timeout(sim, id, want, t, box)
  if not ok then return t1, nil, err, code_ end
  st.lease_end = math_max(st.lease_end, capped(t + want, st.run_started, sim.max_length))
  return t1, true
end

-- Before the run's cell (session/execute.lua's prepare, then cover): the output directory
-- (another language: emptied on a reused sandbox, made), or the hooks cell on
-- a kernel without them, then the lease. → t_after, truthy | t_after, nil, msg, code
local function prepare(sim, id, st, python, reused, run_timeout, t, box)
  local b, err, code_ = true, nil, nil
  if not python then
    if reused then t, b, err, code_ = dp(sim, id, t, box) end
    if b then t, b, err, code_ = dp(sim, id, t, box) end
  elseif st.hooked ~= id then
    t, b, err, code_ = run_code(sim, id, true, 0, run_timeout, t, box)
    if b and b.hooked then st.hooked = id end
  end
  if not b then return t, nil, err, code_ end
  return cover(sim, id, st, run_timeout, t, box)
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
        t = dp(sim, id, t, box)              -- the listing of the output directory
      end
      st.last_run = t
      st.memory_lost = nil
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

-- A table of the session's steps (as warmbox.sim.model's `ops`), for the fast path's files only.
return { acquire = acquire, run = run }
