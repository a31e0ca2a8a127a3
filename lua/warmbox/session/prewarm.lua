--- Prewarm: get a session's sandbox ready before the run comes, as a task
-- in the background (`s:prewarm`), and the run that waits for a prewarm in
-- flight instead of doing the same work.
-- @module warmbox.session.prewarm

local memo = require "warmbox.session.memo"
local resolve = require "warmbox.session.resolve"
local execute = require "warmbox.session.execute"
local decide = require "warmbox.session.decide"
local task = require "warmbox.task"

local xpcall, traceback, tostring, setmetatable, error = xpcall, debug.traceback, tostring, setmetatable, error
local string_format = string.format

local _M = {}

--- How long (seconds) a prewarm called outside tasks drives the engine at
-- most before it returns. It returns as soon as its first request has left
-- (the engine waits on the network alone): well under a millisecond on a
-- pooled connection; the cap only bounds a slow start (DNS, a busy machine).
_M.PREWARM_KICK = 0.25

--- The counters a prewarm counts into (see `s:stats`).
_M.PREWARM_COUNTERS = { prewarms = 0, prewarm_ready = 0, prewarm_warm = 0, prewarm_busy = 0, prewarm_failed = 0,
  prewarm_waits = 0, prewarm_cancelled = 0 }

-- The prewarms in flight in this process: "<origin>\0<tag value>" -> { task =, runner = }
-- (an entry leaves when its task ends however it ends: returned, cancelled, runner closed).
local inflight = {}

local function inflight_key(s)
  local k = s.inflight_key
  if not k then
    k = (s.origin or "") .. "\0" .. s.tag_value
    s.inflight_key = k
  end
  return k
end

local function count(s, name)
  local c = s.counters
  c[name] = (c[name] or 0) + 1
end

local private_runner
--- The runner a session's background tasks (prewarms, automatic checkpoints)
-- are spawned on: the session's `runner` (warmbox.new gives its own), else
-- what its `runner` function returns; a bare session given neither: the
-- runner whose task is running, else this module's own.
-- syntax: runner = prewarm.runner(s) (the session's `runner`; else its `runner` function's; a bare session
--   given neither: the running task's runner, else a module-private one)
function _M.runner(s)
  if s.runner then return s.runner end
  if s.get_runner then return s.get_runner() end
  local runner = require "warmbox.runner"
  local r = runner.running()
  if r then return r end
  if not private_runner or private_runner.closed then
    local msg, code
    private_runner, msg, code = runner.new()
    if not private_runner then
      -- (level 4: the caller of s:prewarm or of the session method that asked)
      error(string_format("cannot start the event engine: %s (%s)", tostring(msg), tostring(code)), 4)
    end
  end
  return private_runner
end

--- A run (or forget, state) of a session whose prewarm is in flight in this
-- process waits for it, instead of doing the same work: inside a task of the
-- prewarm's runner (`rn:current()`) it joins it; outside tasks it drives that
-- runner until the prewarm ends (its other tasks progress too). Elsewhere (a
-- task of another scheduler, a coroutine of the host's inside a task: the
-- runner is mid-round) the lock orders them.
-- syntax: prewarm.await(s)
function _M.await(s)
  local key = inflight_key(s)
  local e = inflight[key]
  if not e then return end
  if e.task:done() then
    inflight[key] = nil -- cancelled before it ever ran (its runner closed)
    return
  end
  if e.sleeping then
    -- A just-in-time prewarm that has not started: the run does the work itself.
    inflight[key] = nil
    e.task:cancel()
    count(s, "prewarm_cancelled")
    return
  end
  local t, rn = e.task, e.runner
  local cur = rn:current()
  if cur then
    if cur == t then return end
    count(s, "prewarm_waits")
    rn:join(t)
    return
  end
  if rn.stepping or task.current() then return end
  count(s, "prewarm_waits")
  while not t:done() do
    if not rn:step() then break end
  end
end

-- The lease a run of `s` would ask for (the policy's `lease`; the idle
-- window when the hook fails: the run reports that).
local function prewarm_lease(s, st, within)
  local lease = resolve.lease(s, s:_ctx(st, within))
  return decide.lease(lease or s.idle_timeout, within, s.parallel ~= nil)
end

-- What the prewarm found or did, for its result and event.
local function action_of(info)
  if info.how == "create" then return "created" end
  if info.resumed then return "resumed" end
  if info.how == "remembered" then return "warm" end
  return "extended"
end

-- Under the lock: nothing when the remembered lease has the margin a run
-- coming within `within` needs (decide.prewarm_warm); else the run's own
-- resolve (`acquire`, eager: connect now), then the output hook in a kernel
-- that may be new (which starts it), under the run's watchdog.
local function prewarm_locked(s, lk, within)
  local st = memo.load(lk, s)
  local now = s.clock()
  if st.sandbox_id and decide.prewarm_warm(now, st.lease_end, within, prewarm_lease(s, st, within))
    and not (s.require_memory and st.memory_lost == st.sandbox_id) then
    return { action = "warm", sandbox_id = st.sandbox_id }
  end
  local info, err, ecode, detail = resolve.acquire(s, st, within, true)
  memo.save(lk, st)
  if not info then return nil, err, ecode, detail end
  local id = info.sandbox_id
  if st.hooked ~= id or st.memory_lost == id then
    local ok, herr, hcode, hdetail = execute.watched(s, info, st, function()
      return execute.hook(execute.handle(s, st, id), st, id, s.exec_timeout)
    end)
    memo.save(lk, st)
    if not ok then return nil, herr, hcode, hdetail end
  end
  if st.creating then
    -- What else a create made is found now, off the run's path (the run then lists nothing).
    resolve.collect_orphans(s, st)
    memo.save(lk, st)
  end
  return { action = action_of(info), sandbox_id = id, resumed = info.resumed, reused = info.reused }
end

-- The prewarm task's body: never raises; a failure is an event and a count.
local function body(s, within)
  local ok, r, err, ecode = xpcall(s._with_lock, traceback, s, function(lk)
    return prewarm_locked(s, lk, within)
  end, true)
  if not ok then r, err, ecode = nil, (tostring(r):gsub("\nstack traceback:.*$", "")), "TASK" end
  if r then
    count(s, r.action == "warm" and "prewarm_warm" or "prewarm_ready")
    s:_event("prewarm", { ok = true, action = r.action, sandbox_id = r.sandbox_id, resumed = r.resumed })
    return r
  end
  if ecode == "BUSY" then
    -- A run (or another prewarm) holds the session: it is getting the sandbox ready.
    count(s, "prewarm_busy")
    s:_event("prewarm", { ok = true, action = "busy" })
    return { action = "busy" }
  end
  count(s, "prewarm_failed")
  s:_event("prewarm", { ok = false, action = "failed", code = ecode, message = tostring(err) })
  return nil, err, ecode
end

--- Starts the prewarm of session `s` for a run within `within` seconds (see
-- `s:prewarm`); a prewarm of the same session in flight is returned as it is.
-- `jit`: it waits until decide.JIT_LEAD before `within` ends, so the sandbox
-- does not run while the run is not coming yet (a run that comes first
-- cancels it and does the work itself).
-- @treturn warmbox.Task
-- syntax: task = prewarm.start(s, within[, jit])
function _M.start(s, within, jit)
  local key = inflight_key(s)
  local e = inflight[key]
  if e and not e.task:done() then return e.task end
  local rn = _M.runner(s)
  local t
  local entry = { runner = rn, sleeping = jit and within > decide.JIT_LEAD or nil }
  t = rn:spawn(function()
    local _ <close> = setmetatable({}, { __close = function()
      if inflight[key] and inflight[key].task == t then inflight[key] = nil end
      if rn.add_background then rn:add_background(-1) end
    end })
    if entry.sleeping then
      rn:sleep(within - decide.JIT_LEAD)
      entry.sleeping = nil
    end
    return body(s, within)
  end)
  -- A blocking lock wait on this runner (`rn:pause`) steps it while it has background work.
  if rn.add_background then rn:add_background(1) end
  entry.task = t
  inflight[key] = entry
  count(s, "prewarms")
  if not rn:current() and rn.kick then rn:kick(_M.PREWARM_KICK) end
  return t
end

return _M
