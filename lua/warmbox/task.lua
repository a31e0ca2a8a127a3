--- warmbox.task: one generic task scheduler (coroutines, timers, events).
--
-- A scheduler owns tasks: coroutines it created and resumes itself. A task
-- waits by calling the scheduler's waiting primitives (`sleep`, `sleep_until`,
-- an event's `wait`), which yield to the scheduler; the scheduler resumes
-- the tasks whose wait is over. Time and I/O come from a pluggable backend:
--
--   backend:now()            -> seconds (float)
--   backend:wait(deadline)   -> wait for a timer (deadline: seconds in the
--                               backend's clock, or nil: no timer) or I/O;
--                               returns false when nothing can ever happen
--                               (no deadline and no I/O source)
--
-- `task.virtual(start)` is the virtual backend: `wait` jumps the clock to the
-- deadline (nothing sleeps). A backend with `virtual = true` lets a task whose
-- sleep ends before anything else is due run on without yielding (the same
-- schedule, fewer switches). A real backend (an event engine's pollable fd)
-- waits in poll(2) until the deadline or an I/O event, and wakes the tasks
-- whose transfers completed with `sched:wake(t)`.
--
--   local task = require "warmbox.task"
--   local sched = task.scheduler{ backend = task.virtual(0) }
--   local t = sched:spawn(function(a) sched:sleep(5); return a * 2 end, 21)
--   assert(sched:loop())
--   print(t:result(), sched:now())     --> 42  5
--
-- Rules: a scheduler resumes only its own coroutines, so a task never yields
-- into a user coroutine. A waiting primitive called outside one of its tasks
-- (from the main thread, or from a user coroutine inside a task) blocks: the
-- backend waits for the time to pass and no other task runs meanwhile. A task
-- that raises ends with that error (its `result()` is `nil, msg, code`); the
-- others carry on. Wake-ups are FIFO: tasks due at the same time run in the
-- order they began to wait, and an event wakes its waiters in arrival order.
-- @module warmbox.task

local type, error, setmetatable, tostring, pairs, ipairs, next =
  type, error, setmetatable, tostring, pairs, ipairs, next
local co_create, co_resume, co_running, co_status, co_yield, co_close =
  coroutine.create, coroutine.resume, coroutine.running, coroutine.status, coroutine.yield, coroutine.close
local table_pack, table_unpack, table_sort, string_format = table.pack, table.unpack, table.sort, string.format

local _M = {}

-- What a task yields to its scheduler (anything else it yields is a plain
-- "run me again next round").
local WAIT = setmetatable({}, { __name = "warmbox.task.WAIT" })

-- coroutine -> task, for every live task of every scheduler.
local by_co = setmetatable({}, { __mode = "kv" })

-- ------------------------------------------------------------------
-- The virtual backend
-- ------------------------------------------------------------------

--- A virtual clock: `wait(deadline)` jumps to the deadline, nothing sleeps.
-- @tparam[opt=0] number start the clock's first reading
-- @treturn table backend `{ now, wait, advance }`
-- syntax: b = task.virtual(t0)
function _M.virtual(start)
  if start ~= nil and type(start) ~= "number" then
    error("bad argument #1 to 'virtual' (number expected, got " .. type(start) .. ")", 2)
  end
  local b = { t = start or 0, virtual = true }
  -- syntax: sched:now()
  function b.now(self) return self.t end
  -- syntax: ev:wait(deadline)
  function b.wait(self, deadline)
    if deadline == nil then return false end
    if deadline > self.t then self.t = deadline end
    return true
  end
  return b
end

-- ------------------------------------------------------------------
-- A binary min-heap of timers ordered by (time, seq)
-- ------------------------------------------------------------------

local function less(a, b)
  return a.t < b.t or (a.t == b.t and a.seq < b.seq)
end

local function heap_push(h, e)
  local n = h.n + 1
  h.n = n
  local i = n
  while i > 1 do
    local p = i // 2
    local pe = h[p]
    if not less(e, pe) then break end
    h[i] = pe
    i = p
  end
  h[i] = e
end

local function heap_pop(h)
  local n = h.n
  if n == 0 then return nil end
  local top, last = h[1], h[n]
  h[n] = nil
  n = n - 1
  h.n = n
  if n > 0 then
    local i = 1
    while true do
      local l = 2 * i
      if l > n then break end
      local c = l
      if l + 1 <= n and less(h[l + 1], h[l]) then c = l + 1 end
      if not less(h[c], last) then break end
      h[i] = h[c]
      i = c
    end
    h[i] = last
  end
  return top
end
_M.heap_push, _M.heap_pop = heap_push, heap_pop

-- ------------------------------------------------------------------
-- Tasks
-- ------------------------------------------------------------------

local Task = {}
Task.__index = Task
Task.__name = "warmbox.Task"

--- True when the task has finished (returned, raised or was cancelled).
-- syntax: t:done()
function Task:done()
  return self.state == "done"
end

--- The function's return values; `nil, msg, code` when it raised
-- (`code` "TASK" for a raised string or object, "CANCELLED" when cancelled);
-- `nil, "task not finished", "BUSY"` while it runs.
-- syntax: t:result()
function Task:result()
  if self.state ~= "done" then return nil, "task not finished", "BUSY" end
  if self.err ~= nil then return nil, self.err, self.code end
  return table_unpack(self.ret, 1, self.ret.n)
end

--- Cancel the task: it will never be resumed again (to-be-closed variables of
-- its coroutine are closed). Its result is `nil, "cancelled", "CANCELLED"`.
-- Cancelling a finished task does nothing; a task may not cancel itself.
-- @treturn boolean true when it was cancelled now
-- syntax: t:cancel()
function Task:cancel()
  if self.state == "done" then return false end
  if co_status(self.co) ~= "suspended" then error("a task cannot cancel itself", 2) end
  self.gen = self.gen + 1               -- stale timers and event entries are skipped
  -- an on_done callback's error is raised once the coroutine is closed
  local ok, e = pcall(self.sched._finish, self.sched, self, nil, "cancelled", "CANCELLED")
  co_close(self.co)
  if not ok then error(e, 0) end
  return true
end

--- Call `fn(task)` when the task finishes (returned, raised, was cancelled);
-- at once when it has. Callbacks run in order, where the task finishes (inside
-- `step`/`loop`, or in `cancel`); an error in one is raised there once every
-- callback ran. Not inside the task: `fn` must not wait.
-- @treturn warmbox.Task the task
function Task:on_done(fn)
  if type(fn) ~= "function" then
    error("bad argument #1 to 'on_done' (function expected, got " .. type(fn) .. ")", 2)
  end
  if self.state == "done" then
    fn(self)
  else
    local l = self.done_fns or {}
    l[#l + 1] = fn
    self.done_fns = l
  end
  return self
end

-- The on_done callbacks of a task that just finished.
local function call_done(t)
  local l = t.done_fns
  if not l then return end
  t.done_fns = nil
  local first
  for _, fn in ipairs(l) do
    local ok, e = pcall(fn, t)
    if not ok and first == nil then first = e end
  end
  if first ~= nil then error(first, 0) end
end

function Task:__tostring()
  return "warmbox.Task " .. tostring(self.name or self.id) .. " (" .. self.state .. ")"
end

-- ------------------------------------------------------------------
-- The scheduler
-- ------------------------------------------------------------------

local Sched = {}
Sched.__index = Sched
Sched.__name = "warmbox.task.Scheduler"

--- Make a scheduler.
-- @tparam[opt] table opts `backend` (default `virtual(0)`)
-- @treturn warmbox.task.Scheduler
-- syntax: sched = task.scheduler{ backend, on_error }
function _M.scheduler(opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #1 to 'scheduler' (table expected, got " .. type(opts) .. ")", 2)
  end
  local backend = opts and opts.backend or _M.virtual(0)
  if type(backend) ~= "table" or type(backend.now) ~= "function" or type(backend.wait) ~= "function" then
    error("bad argument #1 to 'scheduler' (option 'backend' needs now() and wait(deadline))", 2)
  end
  return setmetatable({
    backend = backend,
    ready = {}, ready_gen = {}, rhead = 1, rtail = 0,     -- FIFO of (task, gen)
    timers = { n = 0 }, seq = 0,
    live = 0, ids = 0,
    on_error = opts and opts.on_error,
  }, Sched)
end

--- The backend's current time.
function Sched:now()
  return self.backend:now()
end

--- Number of tasks not finished.
-- syntax: sched:count()
function Sched:count()
  return self.live
end

local function push_ready(self, t, gen)
  local n = self.rtail + 1
  self.rtail = n
  self.ready[n] = t
  self.ready_gen[n] = gen
end

--- Start `fn(...)` as a task. It first runs at the next round of `loop`/`step`.
-- @treturn warmbox.Task
-- syntax: t = sched:spawn(fn, ...)
function Sched:spawn(fn, ...)
  if type(fn) ~= "function" then
    error("bad argument #1 to 'spawn' (function expected, got " .. type(fn) .. ")", 2)
  end
  local args = table_pack(...)
  self.ids = self.ids + 1
  local t = setmetatable({ sched = self, id = self.ids, state = "ready", gen = 0, data = {} }, Task)
  t.co = co_create(function() return fn(table_unpack(args, 1, args.n)) end)
  by_co[t.co] = t
  self.live = self.live + 1
  push_ready(self, t, 0)
  return t
end

function Sched:_finish(t, ok, ...)
  t.state = "done"
  by_co[t.co] = nil
  self.live = self.live - 1
  if ok then
    t.ret = table_pack(...)
  else
    local msg, code = ...
    t.err, t.code = msg, code or "TASK"
    if self.on_error and code ~= "CANCELLED" then self.on_error(t, msg) end
  end
  call_done(t)
end

-- The task the running coroutine is, when it belongs to this scheduler.
local function mine(self)
  local t = by_co[co_running()]
  if t and t.sched == self then return t end
  return nil
end

--- The running task (of any scheduler), or nil outside tasks.
-- syntax: sched:current()
function _M.current()
  return by_co[co_running()]
end

-- owner -> step(owner), called before each blocking pause (weak keys: an
-- owner nobody else keeps leaves, and its function with it).
local blocked_steps = setmetatable({}, { __mode = "k" })

--- Registers `step`: every blocking pause of this process (outside tasks)
-- first calls `step(owner)`, for as long as `owner` lives (held weakly).
-- warmbox.runner registers each runner it makes: one with background work
-- in flight (a prewarm started from blocking code, which may hold the very
-- lock waited for) goes on meanwhile.
-- syntax: task.step_while_blocked(owner, step)
function _M.step_while_blocked(owner, step)
  if type(step) ~= "function" then
    error("bad argument #2 to 'step_while_blocked' (function expected, got " .. type(step) .. ")", 2)
  end
  blocked_steps[owner] = step
end

--- The one cooperative sleep, for every wait that is not a request (a lock's
-- wait between attempts, a Retry-After pause): inside a task whose
-- scheduler's backend has `pause(t, seconds, waker)` (warmbox.runner's
-- engine backend), that, and the other tasks go on; else it blocks, after
-- the steps registered with `step_while_blocked` (outside tasks), on
-- `waker.block(seconds)` when given, else sleeping. Returns true when a
-- `waker.wake()` ended it.
-- syntax: woken = task.pause(seconds, waker)
function _M.pause(seconds, waker)
  local t = _M.current()
  if t then
    local b = t.sched.backend
    if b.pause then return b:pause(t, seconds, waker) end
  elseif next(blocked_steps) then
    -- (a copy: a step may make a runner, which registers itself)
    local list = {}
    for o, step in pairs(blocked_steps) do list[#list + 1] = o list[#list + 1] = step end
    for i = 1, #list, 2 do list[i + 1](list[i]) end
  end
  if waker and waker.block then return waker.block(seconds) end
  require("warmbox.core").sleep(seconds)
  return false
end

--- The running task if it belongs to this scheduler, else nil.
function Sched:current()
  return mine(self)
end

local function add_timer(self, t, at)
  self.seq = self.seq + 1
  heap_push(self.timers, { t = at, seq = self.seq, task = t, gen = t.gen })
end

-- Yield the running task until something wakes it with the current gen.
local function park(t)
  t.state = "waiting"
  local v = co_yield(WAIT)
  return v
end

--- Wait until the backend's clock reads `at` (returns at once when past).
-- Outside this scheduler's tasks the backend waits (blocking, no task runs).
-- syntax: sched:sleep_until(t)
function Sched:sleep_until(at)
  if type(at) ~= "number" or at ~= at then
    error("bad argument #1 to 'sleep_until' (number expected, got " .. type(at) .. ")", 2)
  end
  local t = mine(self)
  if not t then
    while self.backend:now() < at do
      if not self.backend:wait(at) then break end
    end
    return true
  end
  -- Fast path (virtual backends): nothing else is ready or due before `at`,
  -- so running on without yielding is the same schedule.
  if self.backend.virtual and self.rhead > self.rtail then
    local h = self.timers
    while h.n > 0 do
      local e = h[1]
      if e.task.state == "waiting" and e.task.gen == e.gen then break end
      heap_pop(h)
    end
    if h.n == 0 or h[1].t > at then
      if at > self.backend:now() then self.backend:wait(at) end
      return true
    end
  end
  t.gen = t.gen + 1
  add_timer(self, t, at)
  park(t)
  return true
end

--- Wait `seconds` (>= 0) of the backend's clock.
-- syntax: sched:sleep(s)
function Sched:sleep(seconds)
  if type(seconds) ~= "number" or seconds ~= seconds or seconds < 0 then
    error("bad argument #1 to 'sleep' (number >= 0 expected, got " .. tostring(seconds) .. ")", 2)
  end
  return self:sleep_until(self.backend:now() + seconds)
end

--- Let the other ready tasks run, then continue (same time).
-- syntax: sched:yield()
function Sched:yield()
  local t = mine(self)
  if not t then return true end
  t.gen = t.gen + 1
  push_ready(self, t, t.gen)
  park(t)
  return true
end

--- Wake a waiting task now (for a backend whose I/O completed): its wait
-- returns `value` (an event wait returns it as its result).
-- @treturn boolean false when the task was not waiting
-- syntax: sched:wake(t, v)
function Sched:wake(t, value)
  if t.sched ~= self or t.state ~= "waiting" then return false end
  t.gen = t.gen + 1
  t.wake_value = value
  push_ready(self, t, t.gen)
  t.state = "ready"
  return true
end

-- ------------------------------------------------------------------
-- Events: FIFO wait queues
-- ------------------------------------------------------------------

local Event = {}
Event.__index = Event
Event.__name = "warmbox.task.Event"

--- A new event (a FIFO queue of waiting tasks).
-- syntax: ev = sched:event()
function Sched:event()
  return setmetatable({ sched = self, q = {}, head = 1, tail = 0 }, Event)
end

--- Number of tasks waiting (an upper bound: cancelled or timed-out waiters
-- are dropped lazily).
-- syntax: ev:waiting()
function Event:waiting()
  return self.tail - self.head + 1
end

--- Wait for a `signal` (FIFO) or until `deadline` (backend time, optional).
-- @return[1] the value given to `signal` (true when none)
-- @return[2] nil, "timeout", "TIMEOUT" when the deadline passed first, or
--   when called outside this scheduler's tasks (nothing could signal it
--   while it blocks: it waits for the deadline, or returns at once without one)
function Event:wait(deadline)
  if deadline ~= nil and (type(deadline) ~= "number" or deadline ~= deadline) then
    error("bad argument #1 to 'wait' (number or nil expected, got " .. type(deadline) .. ")", 2)
  end
  local sched = self.sched
  local t = mine(sched)
  if not t then
    if deadline then sched:sleep_until(deadline) end
    return nil, "timeout", "TIMEOUT"
  end
  t.gen = t.gen + 1
  local n = self.tail + 1
  self.tail = n
  self.q[n] = { t, t.gen }
  if deadline then add_timer(sched, t, deadline) end
  t.wake_value = nil
  park(t)
  local v = t.wake_value
  t.wake_value = nil
  if v == nil then return nil, "timeout", "TIMEOUT" end
  return v
end

-- Pop the first waiter still waiting on this entry.
local function pop_waiter(self)
  while self.head <= self.tail do
    local e = self.q[self.head]
    self.q[self.head] = nil
    self.head = self.head + 1
    local t, gen = e[1], e[2]
    if t.state == "waiting" and t.gen == gen then return t end
  end
  self.head, self.tail = 1, 0
  return nil
end

--- Wake the first waiter (FIFO) with `value` (default true).
-- @treturn boolean true when a task was woken
-- syntax: ev:signal(v)
function Event:signal(value)
  local t = pop_waiter(self)
  if not t then return false end
  if value == nil then value = true end
  return self.sched:wake(t, value)
end

--- Wake every waiter, in arrival order. @treturn number woken
-- syntax: ev:broadcast(v)
function Event:broadcast(value)
  local n = 0
  while self:signal(value) do n = n + 1 end
  return n
end

-- ------------------------------------------------------------------
-- Running
-- ------------------------------------------------------------------

-- After a resume: a finished task keeps every return value (no table is
-- made for a task that only yielded).
local function after_resume(self, t, ok, ...)
  if co_status(t.co) == "dead" then
    if t.state ~= "done" then
      if ok then
        self:_finish(t, true, ...)
      else
        local e = ...
        if type(e) == "table" and e.code then self:_finish(t, false, e.message or tostring(e), e.code)
        else self:_finish(t, false, e, "TASK") end
      end
    end
    return
  end
  if t.state == "running" then
    t.state = "ready"
    t.gen = t.gen + 1
    push_ready(self, t, t.gen)
  end
end

local function run_task(self, t)
  t.state = "running"
  return after_resume(self, t, co_resume(t.co))
end

-- Move due timers to the ready queue.
local function fire_timers(self)
  local h, now = self.timers, self.backend:now()
  while h.n > 0 and h[1].t <= now do
    local e = heap_pop(h)
    local t = e.task
    if t.state == "waiting" and t.gen == e.gen then
      t.gen = t.gen + 1
      t.state = "ready"
      push_ready(self, t, t.gen)
    end
  end
end

-- Run every task ready now (those made ready meanwhile too). Returns true
-- when one ran.
local function run_ready(self)
  local ran = false
  local ready, ready_gen = self.ready, self.ready_gen
  while self.rhead <= self.rtail do
    local i = self.rhead
    local t, gen = ready[i], ready_gen[i]
    ready[i], ready_gen[i] = nil, nil
    self.rhead = i + 1
    if t.state ~= "done" and t.gen == gen then
      ran = true
      run_task(self, t)
    end
  end
  self.rhead, self.rtail = 1, 0
  return ran
end

-- The next live timer's time, dropping stale ones.
local function next_timer(self)
  local h = self.timers
  while h.n > 0 do
    local e = h[1]
    if e.task.state == "waiting" and e.task.gen == e.gen then return e.t end
    heap_pop(h)
  end
  return nil
end

--- One round: run the ready tasks; when none is ready, wait for the next
-- timer (or I/O) for at most `timeout` seconds (nil: as long as needed), and
-- run the tasks it woke.
-- @treturn[1] boolean true while tasks remain
-- @return[2] nil, msg, "DEADLOCK" when tasks remain that nothing can ever wake
-- syntax: sched:step(timeout)
function Sched:step(timeout)
  if mine(self) then error("step/loop called from inside a task of the same scheduler", 2) end
  if run_ready(self) then return self.live > 0 end
  if self.live == 0 then return false end
  local deadline = next_timer(self)
  if timeout then
    local lim = self.backend:now() + timeout
    if deadline == nil or lim < deadline then deadline = lim end
  end
  if not self.backend:wait(deadline) then
    return nil, string_format("%d task(s) wait for something that can never happen", self.live), "DEADLOCK"
  end
  fire_timers(self)
  run_ready(self)
  return self.live > 0
end

--- Run until every task has finished.
-- @treturn[1] true
-- @return[2] nil, msg, "DEADLOCK"
-- syntax: sched:loop()
function Sched:loop()
  while true do
    local more, err, code = self:step()
    if more == nil then return nil, err, code end
    if not more then return true end
  end
end

--- Cancel every unfinished task. @treturn number cancelled
-- syntax: sched:cancel_all()
function Sched:cancel_all()
  local list = {}
  for _, t in pairs(by_co) do
    if t.sched == self then list[#list + 1] = t end
  end
  table_sort(list, function(a, b) return a.id < b.id end)
  for _, t in ipairs(list) do t:cancel() end
  return #list
end

_M.Task, _M.Scheduler, _M.Event = Task, Sched, Event
return _M
