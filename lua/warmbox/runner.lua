--- warmbox.runner: tasks over the C event engine.
--
-- A runner is a `warmbox.task` scheduler whose backend is `core.engine`: its
-- `wait` polls the engine's fd until the next timer or transfer deadline,
-- then `eng:step(0)` and wakes the tasks whose transfers have news. It also
-- makes transports: objects with `request` and `batch` methods (the shape
-- of a `core.http` client) that block exactly as the client does
-- outside the runner's tasks, and inside one start the request on the engine
-- and yield until it has news (streamed frames are handed to `on_chunk`
-- inside the task, as they arrive).
--
--   local runner = require "warmbox.runner"
--   local r = runner.new()
--   local tp = r:transport(http)          -- e2b client: client.transport = tp
--   local t = r:spawn(function() return tp:request{ url = "..." } end)
--   r:loop()
--
-- Where a call runs is decided by the runner it is given, never by a lookup:
-- `r:transport(http)`, `r:pause(s)`, `r:parallel(main, side)` each ask `r`
-- whether the caller is one of its tasks (`r:current()`), or of its lane's
-- (the second scheduler `r:parallel` runs a blocking caller's work on):
-- then the call yields to that engine; else it blocks. `runner.transport(http)`
-- (no runner) is the one that asks which runner's task runs (`runner.running()`).
--
-- Pauses (lock waits, Retry-After): `r:pause(s, waker)` is the cooperative
-- sleep: inside a task, the engine backend's `pause` (the other tasks go on);
-- outside, it first steps `r` when it has background work in flight, then
-- blocks. (Each runner is also registered with `task.step_while_blocked`, for
-- the locks made without a runner, whose wait is `task.pause`.)
-- @module warmbox.runner

local core = require "warmbox.core"
local task = require "warmbox.task"

local type, error, setmetatable, pairs, pcall, tostring =
  type, error, setmetatable, pairs, pcall, tostring
local table_pack, table_unpack = table.pack, table.unpack
local now, poll = core.now, core.poll

local _M = {}

-- scheduler -> runner, for every live runner: a transport finds the engine
-- of the task that calls it.
local by_sched = setmetatable({}, { __mode = "k" })

-- The runner whose task is running, or nil (main thread, user coroutine).
local function running_runner()
  local t = task.current()
  if not t then return nil end
  local r = by_sched[t.sched]
  if r and not r.closed and r.sched:current() == t then return r, t end
  return nil
end
_M.running = running_runner

-- ------------------------------------------------------------------
-- The backend: poll the engine's fd, step it, wake the waiters
-- ------------------------------------------------------------------

local Backend = {}
Backend.__index = Backend

--- A real backend for `task.scheduler` over `eng` (a `core.engine`).
-- `backend.waiters[tr] = ev` makes the next news of `tr` signal `ev`.
function _M.backend(eng)
  return setmetatable({ eng = eng, engine = true, waiters = setmetatable({}, { __mode = "k" }),
    watches = setmetatable({}, { __mode = "k" }) }, Backend)
end

function Backend.now()
  return now()
end

-- Seconds until something is due: the scheduler's deadline or the engine's
-- own timer (libcurl's timeouts, retry waits); nil when neither exists.
local function due_in(eng, deadline)
  local to
  if deadline then
    to = deadline - now()
    if to < 0 then to = 0 end
  end
  local et = eng:timeout()
  if et and (to == nil or et < to) then to = et end
  return to
end

function Backend:wait(deadline)
  local eng = self.eng
  local to = due_in(eng, deadline)
  if to == nil and eng:pending() == 0 then return false end
  -- poll(2) on the one fd (an idle engine with transfers in flight still
  -- wakes for their sockets), capped so a lost edge cannot hang us.
  if to == nil or to > 0 then poll(eng:pollfd(), to or 1) end
  local news = eng:step(0)
  -- Lock watches in the engine's epoll set (see task_wait): drained every
  -- round (a readable one would keep the poll from sleeping); news wakes its waiter.
  for w, ev in pairs(self.watches) do
    if w:wait(0) then ev:signal(true) end
  end
  local waiters = self.waiters
  for i = 1, #news do
    local tr = news[i]
    local ev = waiters[tr]
    if ev then
      waiters[tr] = nil
      ev:signal(tr)
    end
  end
  return true
end

--- The lock's wait inside task `t` of this backend's scheduler (see
-- warmbox.task: `task.pause` calls it, and so the lock's wait): sleeps on the scheduler, so the other
-- tasks go on. It ends early when the lock is released in this process
-- (`waker.wake`), or by another process when the backend has a watch the
-- engine's poll can wait on (`waker.watch`: the file lock's inotify watch,
-- put in the engine's epoll set); redis: at the next step.
function Backend:pause(t, s, waker)
  local sched = t.sched
  if not waker then return sched:sleep(s) end
  if waker.woken then return true end
  local w = waker.watch
  if w and not w:attach(self.eng:pollfd()) then w = nil end
  if w and w:wait(0) then return true end -- (a release since the attempt)
  local ev = sched:event()
  -- However the wait ends (woken, timed out, the task cancelled): no longer
  -- watched by the runner (the lock closes the watch when lock() returns).
  local _ <close> = setmetatable({}, { __close = function()
    waker.wake = nil
    if w then self.watches[w] = nil end
  end })
  waker.wake = function() ev:signal(true) end
  if w then self.watches[w] = ev end
  return ev:wait(sched:now() + s) == true
end

-- ------------------------------------------------------------------
-- The runner
-- ------------------------------------------------------------------

local Runner = {}
Runner.__index = Runner
Runner.__name = "warmbox.Runner"

-- A blocking lock wait (outside tasks) steps a runner with background work
-- in flight (`r:add_background` counted above 0: a prewarm started from blocking code, which
-- may hold the very lock waited for).
local function step_background(r)
  if r.nbackground > 0 and not r.stepping and not r.closed then r:step(0) end
end

--- A runner: an engine and a scheduler over it.
-- @tparam[opt] table opts `max_buffered` (the engine's), `on_error` (the scheduler's)
-- @treturn[1] warmbox.Runner
-- @return[2] nil, msg, code when the engine could not be made
function _M.new(opts)
  opts = opts or {}
  local eng, msg, code = core.engine{ max_buffered = opts.max_buffered }
  if not eng then return nil, msg, code end
  local b = _M.backend(eng)
  local sched = task.scheduler{ backend = b, on_error = opts.on_error }
  -- Live tasks are held here (a spawned task nobody keeps still runs to its end).
  local r = setmetatable({ eng = eng, backend = b, sched = sched, live = {}, nbackground = 0 }, Runner)
  by_sched[sched] = r
  task.step_while_blocked(r, step_background)
  return r
end

-- Locks taken inside a task: closed when the task ends however it ends
-- (returned, raised, cancelled), so a cancelled run frees its session. The
-- set holds them weakly: a lock its run closed and dropped leaves it at the
-- next collection, so a long-lived task does not keep every run's lock.
local function close_locks(t)
  local set = t.data.locks
  if not set then return end
  t.data.locks = nil
  for lk in pairs(set) do
    if type(lk) == "table" and type(lk.close) == "function" then pcall(lk.close, lk) end
  end
end
local WEAK_KEYS = { __mode = "k" }

--- Start `fn(...)` as a task (it first runs at the next step/loop round).
-- @treturn warmbox.Task
function Runner:spawn(fn, ...)
  if type(fn) ~= "function" then
    error("bad argument #1 to 'spawn' (function expected, got " .. type(fn) .. ")", 2)
  end
  local live = self.live
  local t
  t = self.sched:spawn(function(...)
    local _ <close> = setmetatable({}, { __close = function()
      live[t] = nil
      close_locks(t)
      local ev = t.data.join
      if ev then ev:broadcast(true) end
    end })
    return fn(...)
  end, ...)
  live[t] = true
  t.data.locks = setmetatable({}, WEAK_KEYS)
  return t
end

--- Counts background work in flight on this runner (`n`: +1 when it starts,
-- -1 when it ends; a prewarm started from blocking code): while the count is
-- above 0, a blocking lock wait outside tasks steps the runner, so work that
-- holds the lock being waited for finishes meanwhile.
function Runner:add_background(n)
  self.nbackground = self.nbackground + n
end

--- The running task when it is one of this runner's, else nil.
function Runner:current()
  return self.sched:current()
end

-- While a round runs, `self.stepping` is true: code called from inside it
-- (a task's callback, a coroutine of the host's) must not step again.
local function stepping(self)
  local was = self.stepping
  self.stepping = true
  return setmetatable({}, { __close = function() self.stepping = was end })
end

--- One round (see `task.Scheduler:step`).
function Runner:step(timeout)
  local _ <close> = stepping(self)
  return self.sched:step(timeout)
end

--- Until every task finished --> true | nil, msg, "DEADLOCK".
function Runner:loop()
  local _ <close> = stepping(self)
  return self.sched:loop()
end

--- From outside its tasks: run rounds until no task is ready and the engine
-- waits for the network alone (the requests started have left), or `max`
-- seconds passed. Lets work begun from blocking code get going at once.
function Runner:kick(max)
  if self.stepping or self.closed or self.sched:current() then return end
  local s, eng = self.sched, self.eng
  local deadline = now() + max
  while s.live > 0 do
    self:step(0)
    if now() >= deadline then return end
    if s.rhead > s.rtail then
      local to = eng:timeout()
      if (to == nil or to > 0.002) and not poll(eng:pollfd(), 0) then return end
    end
  end
end

--- The engine's fd: readable when a transfer has news.
function Runner:pollfd()
  return self.eng:pollfd()
end

--- Seconds until `step(0)` is due without fd activity: 0 when a task is
-- ready, nil when nothing is timed (no task waits on a timer or transfer).
function Runner:timeout()
  local s = self.sched
  if s.rhead <= s.rtail then return 0 end
  if s.live == 0 then return nil end
  local h = s.timers
  local deadline = h.n > 0 and h[1].t or nil  -- a stale top only wakes us early
  return due_in(self.eng, deadline)
end

--- Tasks not finished.
function Runner:count()
  return self.sched.live
end

--- Register a lock object with the running task (closed when it ends).
function Runner:track_lock(lk)
  local t = self.sched:current()
  if t and t.data.locks and lk ~= nil then t.data.locks[lk] = true end
  return lk
end

--- Wrap a lock factory so that the locks made inside tasks are tracked.
function Runner:lock_factory(new_lock)
  return function(...)
    return self:track_lock(new_lock(...))
  end
end

--- Cancel every task and close the engine (aborts every transfer). Idempotent.
function Runner:close()
  if self.closed then return end
  self.closed = true
  self.sched:cancel_all()
  self.eng:close()
  if self.lane_runner then self.lane_runner:close() end
end

--- The runner's lane: a second runner of its own (made at the first call,
-- closed with it) that `parallel` runs a caller outside its tasks on, so a
-- blocking call drives its own work and never this runner's other tasks.
function Runner:lane()
  local l = self.lane_runner
  if l then return l end
  local msg, code
  l, msg, code = _M.new()
  if not l then error(string.format("cannot start the event engine: %s (%s)", tostring(msg), tostring(code)), 3) end
  self.lane_runner = l
  return l
end

--- The task of this runner (or of its lane) that is running, and the runner
-- it belongs to; nil outside them: then a call blocks.
function Runner:where()
  local t = self.sched:current()
  if t then return self, t end
  local l = self.lane_runner
  if l then
    t = l.sched:current()
    if t then return l, t end
  end
  return nil
end

--- The cooperative sleep of `seconds` (a lock's wait between attempts, a
-- Retry-After pause): inside a task of this runner or of its lane, the
-- engine backend's `pause` (the other tasks go on; a `waker.wake()` ends it
-- early); inside a task of another scheduler, that scheduler's (`task.pause`);
-- else it blocks, after a step of this runner when it has background work in
-- flight (a prewarm that may hold the very lock waited for). → true when a
-- `waker.wake()` ended it
function Runner:pause(seconds, waker)
  local r, t = self:where()
  if r then return r.backend:pause(t, seconds, waker) end
  if task.current() then return task.pause(seconds, waker) end
  step_background(self)
  if waker and waker.block then return waker.block(seconds) end
  core.sleep(seconds)
  return false
end

--- Sleeps `seconds` inside one of this runner's tasks.
function Runner:sleep(seconds)
  return self.sched:sleep(seconds)
end

-- Park the running task `t` until one of `trs` has news (or an interrupt).
local function await(self, t, trs, n)
  local ev = self.sched:event()
  local waiters = self.backend.waiters
  for i = 1, n do waiters[trs[i]] = ev end
  t.data.parked = ev
  ev:wait()
  t.data.parked = nil
  for i = 1, n do waiters[trs[i]] = nil end
end

--- Wait (inside a task of this runner) until task `t` has finished.
function Runner:join(t)
  while not t:done() do
    local ev = t.data.join or self.sched:event()
    t.data.join = ev
    ev:wait()
  end
end

--- Interrupt task `t`: the request it waits for (or its next one) is
-- aborted and returns `nil, msg, "ABORTED", true`, until `clear_interrupt`.
function Runner.interrupt(_, t, msg)
  t.data.interrupt = msg
  local ev = t.data.parked
  if ev then ev:signal(true) end
end

function Runner.clear_interrupt(_, t)
  t.data.interrupt = nil
end

--- Run `main()` in the running task and `side(ctl)` as a task of its own, at
-- once. `ctl.interrupt(msg)` aborts main's requests (see `interrupt`),
-- `ctl.main_done()` tells whether main has returned, `ctl.sleep(s)` waits in
-- the side task, `ctl.wait(s)` too but returns early on `ctl.poke()` (from
-- main) or when main returns. Returns main's values after side has finished too (side
-- should stop early once main is done); side's returns are in `side_task`.
-- Outside this runner's tasks both run as tasks of its lane (see `lane`)
-- and this blocks until done.
-- @return side_task, main's returns...
function Runner:parallel(main, side)
  local parent = self.sched:current()
  if not parent then
    local l = self.lane_runner
    if l and l.sched:current() then return l:parallel(main, side) end
    l = self:lane()
    local out
    local t = l:spawn(function() out = table_pack(l:parallel(main, side)) end)
    while not t:done() do
      local more, err = l:step()
      if more == nil then error(err, 0) end
    end
    local ok, err = t:result()
    if ok == nil and err ~= nil then error(err, 0) end
    return table_unpack(out, 1, out.n)
  end
  local finished = false
  local wake = self.sched:event()
  local ctl = {
    main_done = function() return finished end,
    interrupt = function(msg) if not finished then self:interrupt(parent, msg) end end,
    sleep = function(sec) return self.sched:sleep(sec) end,
    -- side: wait up to `sec` or until main pokes or finishes
    wait = function(sec)
      if finished then return true end
      return wake:wait(self.sched:now() + sec)
    end,
    poke = function() wake:broadcast(true) end,
  }
  local child = self:spawn(side, ctl)
  -- A cancelled or failing parent takes its side task with it.
  local _ <close> = setmetatable({}, { __close = function()
    finished = true
    self:clear_interrupt(parent)
    if not child:done() and child.co ~= coroutine.running() then pcall(child.cancel, child) end
  end })
  local ret = table_pack(main())
  finished = true
  wake:broadcast(true)
  self:clear_interrupt(parent)
  self:join(child)
  return child, table_unpack(ret, 1, ret.n)
end

-- ------------------------------------------------------------------
-- Transports
-- ------------------------------------------------------------------

local Transport = {}
Transport.__index = Transport
Transport.__name = "warmbox.Transport"

--- A transport over `http` (a `core.http` client) bound to runner `r`:
-- inside one of its tasks (or of its lane's, see `where`) its requests go on
-- that engine, elsewhere they block. Without `r`: inside a task of any
-- runner its requests go on that runner's engine (`runner.running()`).
function _M.transport(http, r)
  return setmetatable({ http = http, runner = r }, Transport)
end

--- `runner.transport(http, r)`: a transport bound to this runner.
function Runner:transport(http)
  return _M.transport(http, self)
end

-- The runner and task a request of transport `tp` runs on, or nil: it blocks.
local function placement(tp)
  local r = tp.runner
  if r then
    if r.closed then return nil end
    return r:where()
  end
  return running_runner()
end

local function without_on_chunk(req)
  local r = {}
  for k, v in pairs(req) do
    if k ~= "on_chunk" then r[k] = v end
  end
  return r
end

--- As `h:request`; inside a task of the runner, on the engine.
function Transport:request(req)
  local r, t = placement(self)
  if not r then return self.http:request(req) end
  if t.data.interrupt then return nil, t.data.interrupt, "ABORTED", false end
  local on_chunk = req.on_chunk
  local tr <close> = r.eng:start(self.http, on_chunk and without_on_chunk(req) or req)
  local one = { tr }
  while true do
    local done = tr:done()
    if on_chunk then
      local frames, flags = tr:frames()
      for i = 1, #frames do
        local ok, v = pcall(on_chunk, frames[i], flags[i])
        if not ok then
          tr:cancel()
          error(v, 0)
        end
        if v == false then
          tr:cancel()
          return nil, "aborted by the on_chunk callback", "ABORTED", true
        end
      end
    end
    if done then break end
    await(r, t, one, 1)
    if t.data.interrupt and not tr:done() then
      tr:cancel()
      return nil, t.data.interrupt, "ABORTED", true
    end
  end
  return tr:result()
end

--- As `h:batch` (results `{ res }` or `{ nil, msg, code, sent }` in order);
-- inside a task, at most `concurrency` transfers on the engine at once.
function Transport:batch(reqs, opts)
  local r, t = placement(self)
  if not r then return self.http:batch(reqs, opts) end
  local conc = opts and opts.concurrency or 8
  local out, nreq, nexti = {}, #reqs, 1
  local run, idx, n = {}, {}, 0
  local trs = {}
  -- A cancelled or failing task aborts what it still has in flight.
  local _ <close> = setmetatable({}, { __close = function()
    for i = 1, n do run[i]:cancel() end
  end })
  while true do
    while nexti <= nreq and n < conc do
      n = n + 1
      run[n], idx[n] = r.eng:start(self.http, reqs[nexti]), nexti
      nexti = nexti + 1
    end
    if n == 0 then break end
    local m = 0
    for i = 1, n do
      local tr = run[i]
      if tr:done() then
        out[idx[i]] = table_pack(tr:result())
      else
        m = m + 1
        run[m], idx[m] = tr, idx[i]
      end
    end
    for i = m + 1, n do run[i], idx[i] = nil, nil end
    n = m
    if n > 0 and (nexti > nreq or n >= conc) then
      for i = 1, n do trs[i] = run[i] end
      for i = n + 1, #trs do trs[i] = nil end
      await(r, t, trs, n)
    end
  end
  return out
end

_M.Runner, _M.Transport = Runner, Transport
return _M
