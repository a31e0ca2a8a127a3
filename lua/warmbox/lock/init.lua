--- warmbox.lock: one holder per key, across the coroutines of one process
-- (every backend), the processes of one host (`file`) and hosts (`redis`).
-- Mirrors lua-resty-lock. The public API and `lock.new`'s options are listed
-- once, in README.md (warmbox.lock); the contract this file keeps (fair
-- queue, expiry and fencing, waits and wake-ups, the per-key state) is
-- HACKING.md's "warmbox.lock" section, and how it works docs/locks.md's.
--
-- This file is the lock object and what every backend shares; one file per
-- backend: lock/memory.lua (this Lua state only), lock/file.lua (flock(2),
-- one host), lock/redis.lua (hosts); lock/queue.lua the ticket queue. Every
-- backend first takes an in-process table entry, so coroutines of one
-- process serialize without a second flock on another descriptor (which
-- would block the whole process).
--
-- The backend interface (lock/memory.lua, lock/file.lua, lock/redis.lua),
-- with `lk` the lock object, `e` the in-process entry `{ token, expires,
-- pkey, next_check }` the backend fills (`fence`, its own fields), `prev` the
-- entry this process held for the key before (overran its exptime) or nil:
--   ns(lk)                                     the in-process namespace of lk's keys
--   acquire(lk, key, e, prev, mode, local_busy)  one attempt, mode "wait" | "try":
--                                              e | nil, "busy", nil, is_head | nil, msg, code
--   leave(lk, key, pkey, token)                the ticket given up (lock() failed)
--   release(lk, key, e), expire(lk, key, e, t), keepalive(lk, key, e, now),
--   get_state(lk, key, e), set_state(lk, key, e, s)   the methods of the same names
--   remove(lk, key, e)                         optional: what the key left in the backend
--   blocker(lk, key, ticket)                   optional: block(s) -> woken, unblock(), watch
--   held(lk, key, e)                           optional: ok | nil, err, code (redis: one GET on the primary)
-- syntax: e, err, code, head = backend.acquire(lk, key, e, prev, mode, local_busy)
-- syntax: ns = backend.ns(lk)
-- syntax: backend.leave(lk, key, pkey, token)
-- syntax: block, unblock, watch = backend.blocker(lk, key, ticket)
-- syntax: ok, err, code = backend.held(lk, key, e) (optional; redis: one GET on the primary)
local core = require "warmbox.core"
local errors = require "warmbox.errors"
local common = require "warmbox.lock.common"
local file = require "warmbox.lock.file"
local task = require "warmbox.task"

local next = next
local error, ipairs, pairs, pcall, setmetatable, getmetatable, type, tostring =
  error, ipairs, pairs, pcall, setmetatable, getmetatable, type, tostring
local fmt, min = string.format, math.min
local now, sleep = core.now, core.sleep
local new_token, stop_keeper = common.new_token, common.stop_keeper

local _M = {}
local mt = { __index = _M }

-- The backends, loaded when first used (redis needs nothing until then).
local BACKENDS = { memory = "warmbox.lock.memory", file = "warmbox.lock.file", redis = "warmbox.lock.redis" }

local impls = {}

-- Waits: full steps slept, steps a release ended early.
local stats = { polls = 0, wakes = 0 }

--- Counters of every lock wait of this process: `{ polls =, wakes = }`.
function _M.stats()
  return { polls = stats.polls, wakes = stats.wakes }
end

--- Registers `step` to run before every blocking wait outside tasks: the
-- scheduler's (`warmbox.task.step_while_blocked`), kept here by its old name.
_M.step_while_blocked = task.step_while_blocked

--- The default wait between attempts, `wait(seconds, waker)`: the
-- scheduler's cooperative sleep (`warmbox.task.pause`). Returns true when a
-- release ended it.
_M.wait = task.pause

_M.default_dir = file.default_dir
_M._file_name = file.file_name
_M._next_fence = common.next_fence

-- How often a failed unlock is tried in all, and the first pause between tries.
local UNLOCK_TRIES, UNLOCK_PAUSE = 3, 0.05
-- The head of a queue polls at least this often by default (`head_step`; a
-- fallback for a release that wakes nobody; 100 cheap attempts a second at most, per waiting key).
local HEAD_STEP = 0.01

-- The in-process table: namespace .. key -> entry { token, expires, ... }.
local held = {}
-- In-process waiters: namespace .. key -> { [waker] = true }.
local waiting = {}

-- A release (or a waiter leaving) of `pkey`: its in-process waiters try again now.
local function notify(pkey)
  local ws = waiting[pkey]
  if not ws then return end
  for w in pairs(ws) do
    w.woken = true
    if w.wake then w.wake() end
  end
end

-- ---------------------------------------------------------------------------
-- option checking (misuse raises)
-- ---------------------------------------------------------------------------

local OPTS = {
  backend = "string", dir = "string", redis = "table", timeout = "number", exptime = "number",
  step = "number", ratio = "number", max_step = "number", wait = "function", state_ttl = "number",
  ttl = "number", ticket_ttl = "number", keeper = "boolean", head_step = "number",
  -- redis (also accepted inside `redis`): Sentinel, Cluster, ACL, database, URL
  sentinels = "table", master = "string", nodes = "table", username = "string", password = "string", db = "number",
  url = "string",
}
local REDIS_OPTS = { host = "string", port = "number", timeout = "number", prefix = "string", sentinels = "table",
  master = "string", nodes = "table", username = "string", password = "string", db = "number", url = "string" }
-- The redis options that may also be given at the lock's top level.
local REDIS_TOP = { "sentinels", "master", "nodes", "username", "password", "db", "url" }

-- The redis options of lock options `opts` (checked; a bad one raises).
local function redis_options(opts)
  local r = opts.redis or {}
  errors.check_options(r, REDIS_OPTS, "new", 1, 2, "redis.")
  local o = {}
  for k, v in pairs(r) do o[k] = v end
  for _, k in ipairs(REDIS_TOP) do
    if o[k] == nil then o[k] = opts[k] end
  end
  if o.url then
    local ok, u = pcall(require("warmbox.lock.redis_client").parse_url, o.url, "option 'url'")
    if not ok then error("bad argument #1 to 'new' (" .. tostring(u):gsub("^[^:]*:%d+: ", "") .. ")", 4) end
    for k, v in pairs(u) do
      if o[k] == nil then o[k] = v end
    end
    o.url = nil
  end
  require("warmbox.lock.redis_client").check(o, function(k, what)
    errors.bad_option(1, "new", "redis." .. k, what, 5)
  end)
  local prefix = o.prefix or "warmbox:"
  return { host = o.host or "127.0.0.1", port = o.port or 6379, timeout = o.timeout or 5, prefix = prefix,
    sentinels = o.sentinels, master = o.master, nodes = o.nodes, username = o.username, password = o.password,
    db = o.db }
end

-- ---------------------------------------------------------------------------
-- the lock object
-- ---------------------------------------------------------------------------


-- The number options' ranges: name, test, what the error says is expected.
local function positive_finite(x) return x > 0 and x < math.huge end
local RANGES = {
  { "timeout", function(x) return x >= 0 and x < math.huge end, ">= 0 and finite" },
  { "exptime", positive_finite, "> 0 and finite" }, { "step", positive_finite, "> 0 and finite" },
  { "max_step", positive_finite, "> 0 and finite" },
  { "head_step", positive_finite, "> 0 and finite" }, { "state_ttl", positive_finite, "> 0 and finite" },
  { "ratio", function(x) return x >= 1 and x < math.huge end, ">= 1 and finite" },
  { "ttl", function(x) return x >= 0.05 and x <= 86400 end, "in [0.05, 86400]" },
}

-- The number options' defaults.
local NUMBER_DEFAULTS = { timeout = 30, exptime = 600, step = 0.01, ratio = 2, max_step = 0.5, head_step = HEAD_STEP,
  state_ttl = 604800, ttl = 10, ticket_ttl = 5 }

--- Creates a lock object (holds at most one key at a time).
-- @tparam[opt] table opts backend ("file"), dir (`lock.default_dir()`: per user),
--   redis {host="127.0.0.1", port=6379, timeout=5, prefix="warmbox:"},
--   timeout (30), exptime (600), step (0.01), ratio (2), max_step (0.5), head_step (0.01: the
--   queue's head polls at least this often; a fallback, a release wakes it),
--   wait (function(seconds, waker); default lock.wait, as it is when the lock is made), state_ttl (604800, redis),
--   ttl (10, redis: the key's PX), ticket_ttl (5), keeper (true, redis)
function _M.new(opts)
  opts = errors.check_options(opts, OPTS, "new", 1)
  local self = {
    backend = opts.backend or "file",
    dir = opts.dir or ((opts.backend or "file") == "file" and _M.default_dir() or "-"),
    wait = opts.wait or _M.wait,
    use_keeper = opts.keeper ~= false,
    polls = 0, wakes = 0,
  }
  for k, v in pairs(NUMBER_DEFAULTS) do self[k] = opts[k] or v end
  if not BACKENDS[self.backend] then
    error("bad argument #1 to 'new' (unknown backend '" .. self.backend .. "')", 2)
  end
  if self.dir == "" then error("bad argument #1 to 'new' (option 'dir': a non-empty string expected)", 2) end
  self.dir = (self.dir:gsub("(.)/+$", "%1"))
  local function bad(k, what) errors.bad_option(1, "new", k, "a number " .. what .. " expected", 3) end
  for _, r in ipairs(RANGES) do
    if not r[2](self[r[1]]) then bad(r[1], r[3]) end -- (NaN fails every test)
  end
  if not (self.ticket_ttl <= 86400 and self.ticket_ttl >= 2 * min(self.max_step, 1)) then
    bad("ticket_ttl", "in [2 x max_step, 86400]")
  end
  self.redis = redis_options(opts)
  self.impl = impls[self.backend] or require(BACKENDS[self.backend])
  impls[self.backend] = self.impl
  self.ns = self.impl.ns(self)
  return setmetatable(self, mt)
end

local function check_key(key, fname)
  if type(key) ~= "string" then
    error(fmt("bad argument #1 to '%s' (string expected, got %s)", fname, type(key)), 3)
  end
end

-- One attempt with ticket `token` ("wait") or without one ("try"):
-- true | nil, "busy", nil, is_head | nil, msg, code
local function attempt(self, key, token, mode)
  local pkey = self.ns .. key
  local prev = held[pkey]
  local t = now()
  local local_busy = prev and prev.expires > t
  local e = { token = token or new_token(), expires = t + self.exptime, pkey = pkey, next_check = t }
  local ok, err, code, head = self.impl.acquire(self, key, e, prev, mode, local_busy)
  if not ok then return nil, err, code, head end
  if prev and prev.keeper then stop_keeper(prev) end
  held[pkey] = e
  self._key, self._entry = key, e
  return true
end

--- Takes the lock on `key`, waiting (in arrival order) up to `timeout` seconds.
-- @treturn[1] number seconds waited
-- @return[2] nil, "timeout" | "locked" | message, code
function _M:lock(key)
  check_key(key, "lock")
  if self._entry then return nil, "locked" end
  local start = now()
  local step, timeout = self.step, self.timeout
  local ticket = new_token()
  local was_head = false
  local pkey = self.ns .. key
  local waker, unblock
  -- However lock() ends: out of the in-process waiters, the backend's wake-up freed.
  local _ <close> = setmetatable({}, { __close = function()
    if not waker then return end
    local ws = waiting[pkey]
    if ws then
      ws[waker] = nil
      if next(ws) == nil then waiting[pkey] = nil end
    end
    if unblock then pcall(unblock) end
  end })
  while true do
    local ok, err, code, head = attempt(self, key, ticket, "wait")
    if ok then return now() - start end
    local elapsed = now() - start
    -- Redis unreachable for a moment (a failover): try again until the timeout
    -- (the ticket and the acquire are idempotent).
    if code == "TRANSPORT" and self.backend == "redis" and elapsed + self.step < timeout then
      err, head = "busy", false
    end
    if err ~= "busy" or elapsed >= timeout then
      if self.impl.leave then pcall(self.impl.leave, self, key, pkey, ticket) end
      notify(pkey) -- (a new head, perhaps)
      if err ~= "busy" then return nil, err, code end
      return nil, "timeout"
    end
    if not waker then
      -- First time busy: register for wake-ups, then try once more (a
      -- release between the attempt and the registration is not missed).
      waker = { woken = false }
      waiting[pkey] = waiting[pkey] or {}
      waiting[pkey][waker] = true
      if self.impl.blocker then waker.block, unblock, waker.watch = self.impl.blocker(self, key, ticket) end
    else
      local cap = head and min(self.max_step, self.head_step) or self.max_step
      -- just became the head: the holder may be about to release, poll fast again
      if head and not was_head then step = self.step end
      was_head = head
      step = min(step, cap)
      waker.woken = false
      local woke = self.wait(min(step, timeout - elapsed), waker)
      if woke == true or waker.woken then
        stats.wakes, self.wakes = stats.wakes + 1, self.wakes + 1
      else
        stats.polls, self.polls = stats.polls + 1, self.polls + 1
        step = min(step * self.ratio, cap)
      end
    end
  end
end

--- Takes the lock on `key` if it is free and nobody is waiting for it.
-- @return true | nil, "busy" | nil, "locked" | nil, msg, code
function _M:try_lock(key)
  check_key(key, "try_lock")
  if self._entry then return nil, "locked" end
  local ok, err, code = attempt(self, key, nil, "try")
  return ok, err, code
end

local function current(self)
  local e = self._entry
  if not e then return nil end
  if held[e.pkey] ~= e then
    -- Our exptime passed and another holder took the key over.
    stop_keeper(e)
    self._key, self._entry = nil, nil
    return nil, "expired"
  end
  return e
end

local function transient(code)
  return code == "TRANSPORT" or code == "IO"
end

--- Releases the lock. A transport failure is retried (3 tries in all);
-- when it persists, the Redis key frees itself within `ttl` (its keeper has
-- stopped) and the failure is returned.
-- @return true | nil, "unlocked" | nil, "expired", "LOCK" (it had been taken
--   over) | nil, msg, code
function _M:unlock()
  local e = self._entry
  if not e then return nil, "unlocked" end
  local key = self._key
  self._key, self._entry = nil, nil
  if held[e.pkey] ~= e then
    stop_keeper(e)
    return nil, "expired", "LOCK"
  end
  held[e.pkey] = nil
  local _ <close> = setmetatable({}, { __close = function() notify(e.pkey) end })
  local ok, err, code
  local pause = UNLOCK_PAUSE
  for i = 1, UNLOCK_TRIES do
    ok, err, code = self.impl.release(self, key, e)
    -- after a lost reply, "not ours any more" may be our own earlier delete
    if i > 1 and err == "expired" then ok, err, code = true, nil, nil end
    if ok or not transient(code) or i == UNLOCK_TRIES then break end
    sleep(pause)
    pause = pause * 2
  end
  if not ok and transient(code) and self.backend == "redis" then
    err = fmt("%s (after %d tries; the lock expires by itself within %g s)", tostring(err), UNLOCK_TRIES, self.ttl)
  end
  return ok, err, code
end

--- Releases the lock if held; idempotent (true when nothing was held).
-- @return true | what unlock() returns
function _M:close()
  if not self._entry then return true end
  return self:unlock()
end

--- Sets the hold limit to `t` seconds from now (default exptime).
function _M:expire(t)
  if t ~= nil and (type(t) ~= "number" or t ~= t or t <= 0 or t == math.huge) then
    error("bad argument #1 to 'expire' (positive number expected, got " .. tostring(t) .. ")", 2)
  end
  local e, err = current(self)
  if not e then return nil, err or "unlocked", err and "LOCK" or nil end
  e.expires = now() + (t or self.exptime)
  return self.impl.expire(self, self._key, e, t)
end

--- Whether this object still holds its lock; cheap enough to call on every
-- stream event (it looks at the backend at most every ttl/3, redis, or
-- every second, file). With a redis keeper thread it only reads the
-- keeper's state; without one (keeper = false) it refreshes the key.
-- @return true | nil, "unlocked" | nil, "expired", "LOCK" | nil, msg, code
function _M:keepalive()
  local e, err = current(self)
  if not e then return nil, err or "unlocked", err and "LOCK" or nil end
  local t = now()
  if t < e.next_check then return true end
  return self.impl.keepalive(self, self._key, e, t)
end

--- Whether this object still holds its lock, asked of the backend now (redis:
-- one GET on the primary, which sees a lock a failover lost; others: as
-- keepalive). A run calls it before it collects its outputs.
-- @return true | nil, "unlocked" | nil, "expired", "LOCK" | nil, msg, code
function _M:held()
  local e, err = current(self)
  if not e then return nil, err or "unlocked", err and "LOCK" or nil end
  if self.impl.held then return self.impl.held(self, self._key, e) end
  return self.impl.keepalive(self, self._key, e, now())
end

--- The key's shared state (string or nil), only while held.
function _M:get_state()
  local e, err = current(self)
  if not e then return nil, err or "unlocked", err and "LOCK" or nil end
  return self.impl.get_state(self, self._key, e)
end

--- Replaces the key's shared state (nil clears it), only while held.
function _M:set_state(s)
  if s ~= nil and type(s) ~= "string" then
    error("bad argument #1 to 'set_state' (string or nil expected, got " .. type(s) .. ")", 2)
  end
  local e, err = current(self)
  if not e then return nil, err or "unlocked", err and "LOCK" or nil end
  return self.impl.set_state(self, self._key, e, s)
end

--- Releases the lock and removes what its key left in the backend (the
-- state; the file backend's lock and queue files): the key's conversation
-- is gone (`wb:release`, GC). Nothing else may be done under the lock after.
-- @return what unlock() returns
function _M:remove()
  local e, err = current(self)
  if not e then return nil, err or "unlocked", err and "LOCK" or nil end
  self.impl.set_state(self, self._key, e, nil)
  if self.impl.remove then self.impl.remove(self, self._key, e) end
  return self:unlock()
end

--- The fencing number of this hold: greater than that of every earlier
-- hold of the key (on every backend), or nil when nothing is held. The
-- session carries it to the sandbox, which refuses a run with a lower number
-- than the highest it has seen (a holder paused past its lock's expiry).
function _M:fence()
  local e = current(self)
  return e and e.fence or nil
end

--- This object's lock waits so far: polls (full steps slept), wakes (ended by a release).
-- @treturn integer polls
-- @treturn integer wakes
function _M:wait_counts()
  return self.polls, self.wakes
end

--- The key this object holds, or nil.
function _M:key()
  return (current(self)) and self._key or nil
end

-- ---------------------------------------------------------------------------
-- locks as resources: one factory, one failure mapping, one closer
-- ---------------------------------------------------------------------------

--- The one factory of lock objects (sessions, GC, release). `spec` is nil
-- (the file backend) | "file" | "redis" | "memory" | lock options | a lock
-- module (a table with `new`, called with `module_opts`) | a function
-- returning a lock object. `defaults` fill the options left out (`timeout`,
-- `exptime`). Options are checked now: misuse raises here, not at the first lock.
-- @param spec
-- @tparam[opt] table defaults
-- @tparam[opt] table module_opts
-- @tparam[opt="new"] string fname named in a misuse error (option 'lock' of it)
-- @tparam[opt=1] integer argn
-- @treturn function returning a new lock object
-- syntax: new_lock = lock.factory(spec, defaults, module_opts, fname, argn)
function _M.factory(spec, defaults, module_opts, fname, argn)
  if type(spec) == "function" then return spec end
  if type(spec) == "table" and type(spec.new) == "function" then
    local mopts = module_opts or {}
    return function() return spec.new(mopts) end
  end
  local opts
  if spec == nil or type(spec) == "string" then
    opts = { backend = spec or "file" }
  elseif type(spec) == "table" then
    opts = {}
    for k, v in pairs(spec) do opts[k] = v end
  else
    errors.bad_option(argn or 1, fname or "new", "lock", "string, table or function expected, got " .. type(spec), 3)
  end
  for k, v in pairs(defaults or {}) do
    if opts[k] == nil then opts[k] = v end
  end
  _M.new(opts)
  return function() return _M.new(opts) end
end

--- The one mapping of a failed `lk:lock(key)` to warmbox's codes: "timeout"
-- (another holder kept it past the lock's timeout) is BUSY, anything else LOCK.
-- @tparam string what the thing locked, for the message ("session 'k'")
-- @return nil, message, "BUSY" | "LOCK"
-- syntax: nil, msg, code = lock.failure(what, err)
function _M.failure(what, err)
  if err == "timeout" then return nil, what .. " is busy (another run holds it)", "BUSY" end
  return nil, "cannot lock " .. what .. ": " .. tostring(err), "LOCK"
end

--- For `local _ <close> = lock.closing(lk)`: `lk` itself when `<close>` can
-- close it, else a guard that calls its `close` (a caller's own lock object
-- may have neither).
-- syntax: local guard <close> = lock.closing(lk)
function _M.closing(lk)
  local m = getmetatable(lk)
  if type(m) == "table" and m.__close then return lk end
  return setmetatable({}, { __close = function()
    if type(lk.close) == "function" then pcall(lk.close, lk) end
  end })
end

local function release_quietly(self)
  if self._entry then pcall(_M.unlock, self) end
end
mt.__close = release_quietly
mt.__gc = release_quietly
mt.__tostring = function(self)
  if self._entry then return fmt("warmbox.Lock (%s, held)", self.backend) end
  return fmt("warmbox.Lock (%s)", self.backend)
end

return _M
