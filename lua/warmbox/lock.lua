--- warmbox.lock: one holder per key, across the coroutines of one process
-- (every backend), the processes of one host (`file`) and hosts (`redis`).
-- Mirrors lua-resty-lock: `elapsed, err = lk:lock(key)`, `lk:unlock()`,
-- `lk:expire(t)`, errors "timeout" | "locked" | "unlocked" | "expired"; new
-- for 5.4, `local lk <close> = lock.new(opts)` unlocks when the block is
-- left; `lk:close()` does the same by hand (idempotent).
--
-- Fair: waiters for one key are served in arrival order, across coroutines,
-- processes and hosts. Each `lock()` call takes a ticket in a queue kept in
-- the backend (memory: a table; file: `<name>q` next to the lock file, read
-- and rewritten under its own flock; redis: two sorted sets and a counter
-- updated by one script, with the server's clock). Only the queue's head may
-- take the lock, and `try_lock` only when nobody is queued. A waiter
-- refreshes its ticket on every attempt; a ticket not refreshed for
-- `ticket_ttl` seconds (its waiter died or gave up) is dropped by the next
-- waiter, so a dead waiter delays the queue by at most `ticket_ttl`.
--
-- Each lock also carries a small per-key state (`get_state`/`set_state`,
-- only while held): the session code keeps the remembered sandbox id and
-- lease there, so processes that share a key share that memory. The state
-- is a cache: losing it (a broken lock, a wiped /tmp) costs one lookup.
--
-- Expiry. `exptime` bounds how long a holder may keep the lock without
-- calling `expire()` (a hung holder's limit; the session sets it from its
-- run timeout). How a dead holder frees the key:
--   memory  with the Lua state.
--   file    the kernel drops the flock when the holder's process dies, at
--           once; a holder alive but stuck past exptime may be broken (below).
--   redis   the key's PX is short (`ttl`, 10 s) and a keeper thread of the
--           holder's process (core.redis keeper) refreshes it every ttl/3
--           until unlock or exptime, also while the holder's Lua side is
--           inside a long blocking call (a silent cell). A crashed, stopped
--           or cut-off holder frees the key within `ttl`.
-- `lk:keepalive()` (cheap: it looks at Redis state at most every ttl/3)
-- tells the holder whether it still holds the lock; with `keeper = false`
-- it refreshes the key itself, and then must be called more often than
-- `ttl` (a blocking call longer than `ttl` loses the lock).
--
-- Backends:
--   memory  this Lua state only (the in-process table below).
--   file    one file per key under `dir`, locked with flock(2). File
--           contents: a header line
--           `warmbox-lock 1 <pid> <expires, monotonic s> <token> <0|1> <fence>` then the
--           state. A lock file is removed only by `lk:remove()` (the
--           conversation is gone: release, GC) and by a break (below), both
--           under `dir/.break` (exclusive) while its flock is held, so a
--           locker that flocked the old inode sees it stale and retries;
--           the queue file goes with it when no one is queued. A fence count
--           lost with the file starts again from the clock (see next_fence).
--           exptime and hung holders: a holder that is alive but stuck past
--           its expiry (header) may be broken by a waiter. Breaking happens
--           under `dir/.break` (exclusive) and only if the path still names
--           the same file, it is still flock-held and its header is the same
--           expired one; the breaker removes the path, so new lockers use a
--           fresh file (the state is carried over) while the stuck holder
--           keeps a lock on an orphan inode. Every locker, after taking
--           flock, checks under `dir/.break` (shared) that its file is still
--           the one at the path before writing its header, so a break can
--           never race a fresh holder. Expiry uses CLOCK_MONOTONIC (which
--           all processes of a host share) in whole seconds (a lock is
--           breakable once now > expires): a step of the wall clock never
--           lets a second holder in. A holder broken past its expiry is
--           fenced (`lk:fence()`: the next holder's number is higher).
--           The queue file `<name>q`: a line `warmbox-queue 1 <next seq>`,
--           then one line `<seq> <deadline ms> <ttl ms> <token>` per waiter
--           (deadline on CLOCK_MONOTONIC, which all processes of a host
--           share; one further than 2 x its ttl away, e.g. after a reboot,
--           is dropped).
--   redis   the lock is `<prefix>lock:<key>` = token (SET NX PX ttl, taken by
--           the queue script only for the queue's head); unlock, expire,
--           keepalive and set_state are compare-and-{delete,pexpire,set}
--           scripts, so a holder whose lock expired can never release or
--           touch the next holder's. The queue: `<prefix>queue:<key>` (ZSET
--           token -> arrival number from INCR `<prefix>qseq:<key>`) and
--           `<prefix>qdl:<key>` (ZSET token -> deadline, server ms); the three
--           expire 2 x ticket_ttl after the last waiter's refresh. The state
--           lives under `<prefix>state:<key>` with its own TTL (`state_ttl`).
--
-- Every backend first takes an in-process table entry, so coroutines of one
-- process serialize without a second flock on another descriptor (which
-- would block the whole process).
--
-- Waiting blocks: between attempts a waiter calls `wait(seconds, waker)`, by
-- default `lock.wait`, which blocks. It never yields into the caller's
-- coroutines. This is the one hook for a scheduler: a task engine that runs
-- sessions as coroutines replaces `lock.wait` (or passes `wait`) with a
-- function that yields to itself and resumes the waiter within the time
-- given (it must resume it within `ticket_ttl`, or the ticket lapses), or
-- earlier when `waker.wake()` is called (it sets `waker.wake` for the wait's
-- length; `waker.woken` true: return at once). Steps: `step` growing by
-- `ratio` up to `max_step`; a waiter that becomes the queue's head starts
-- again from `step` and polls at least every 10 ms.
--
-- Wake-ups: the steps are a fallback. A release wakes the key's waiters of
-- the same process at once (`waker.wake`), and the blocking `lock.wait`
-- (`waker.block(seconds)`) also returns when a holder in another process
-- releases: file, an inotify watch on the lock file (`core.lock_watch`;
-- the releaser touches the file after its unlock); redis, the waiter BLPOPs
-- `<prefix>wake:<key>:<ticket>`, which the release script pushes to for the
-- queue's head. `lock.stats()` counts the waits that ran their full step
-- (`polls`) and those a release ended (`wakes`).
local core = require "warmbox.core"
local errors = require "warmbox.errors"

local next = next
local error, ipairs, pairs, pcall, setmetatable, getmetatable, type, tostring, tonumber =
  error, ipairs, pairs, pcall, setmetatable, getmetatable, type, tostring, tonumber
local fmt, min, max, floor, ceil = string.format, math.min, math.max, math.floor, math.ceil
local concat = table.concat
local now, sleep = core.now, core.sleep

local sh_quote = require("warmbox.util").sh_quote

local _M = {}
local mt = { __index = _M }

-- Waits: full steps slept, steps a release ended early.
local stats = { polls = 0, wakes = 0 }

--- Counters of every lock wait of this process: `{ polls =, wakes = }`.
function _M.stats()
  return { polls = stats.polls, wakes = stats.wakes }
end

--- The default wait between attempts (seconds): blocks, on the backend's
-- notification when it has one (`waker.block`), else sleeping. The hook a
-- scheduler replaces. Returns true when a release ended it.
function _M.wait(s, waker)
  if waker and waker.block then return waker.block(s) end
  sleep(s)
  return false
end

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
-- memory backend state: key -> string; queues: pkey -> queue
local mem_state, mem_queues, mem_fence = {}, {}, {}
-- created directories, break-lock handles per dir, redis connections
local made_dirs, break_locks, redis_conns = {}, {}, {}

local counter = 0
local function new_token()
  counter = counter + 1
  return core.sha256(fmt("%d:%.9f:%d:%s:%.17g", core.getpid(), now(), counter,
    tostring({}), math.random())):sub(1, 32)
end

local function now_ms() return floor(now() * 1000) end

-- Fencing: every acquisition of a key gets a number greater than any its
-- earlier holders got (`lk:fence()`); a key whose count was lost starts again
-- from the wall clock in ms, above any number an earlier count can have reached.
local function next_fence(prev)
  local base = os.time() * 1000
  if type(prev) ~= "number" or prev < base - 86400000 * 366 then return base end
  return prev + 1
end
_M._next_fence = next_fence

-- ---------------------------------------------------------------------------
-- option checking (misuse raises)
-- ---------------------------------------------------------------------------

local OPTS = {
  backend = "string", dir = "string", redis = "table", timeout = "number", exptime = "number",
  step = "number", ratio = "number", max_step = "number", wait = "function", state_ttl = "number",
  ttl = "number", ticket_ttl = "number", keeper = "boolean", head_step = "number",
}
local REDIS_OPTS = { host = "string", port = "number", timeout = "number", prefix = "string" }
local BACKENDS = { memory = true, file = true, redis = true }

-- ---------------------------------------------------------------------------
-- the ticket queue (memory and file backends; redis does the same in a script)
-- q = { next = <seq>, list = { { seq =, dl = <deadline ms>, token = }, ... } } (by seq)
-- ---------------------------------------------------------------------------

local function q_new() return { next = 1, list = {} } end

-- Drops lapsed tickets (and deadlines further away than twice their own
-- ttl: the clock was reset); true when something changed.
local function q_purge(q, t)
  local keep = {}
  for _, tk in ipairs(q.list) do
    if tk.dl >= t and tk.dl <= t + 2 * tk.ttl then keep[#keep + 1] = tk end
  end
  local changed = #keep ~= #q.list
  q.list = keep
  return changed
end

-- Enters (or refreshes) `token`; true when it is the head.
local function q_enter(q, token, t, ttl_ms)
  local mine
  for _, tk in ipairs(q.list) do
    if tk.token == token then mine = tk break end
  end
  if not mine then
    mine = { seq = q.next, token = token }
    q.next = q.next + 1
    q.list[#q.list + 1] = mine
  end
  mine.dl, mine.ttl = t + ttl_ms, ttl_ms
  return q.list[1] == mine
end

local function q_leave(q, token)
  for i, tk in ipairs(q.list) do
    if tk.token == token then
      table.remove(q.list, i)
      return true
    end
  end
  return false
end

local function q_parse(s)
  local nxt, pos = s:match("^warmbox%-queue 1 (%d+)\n()")
  local q = q_new()
  if not nxt then return q end
  q.next = tonumber(nxt)
  for seq, dl, ttl, token in s:sub(pos):gmatch("(%d+) (%d+) (%d+) (%x+)\n") do
    q.list[#q.list + 1] = { seq = tonumber(seq), dl = tonumber(dl), ttl = tonumber(ttl), token = token }
  end
  table.sort(q.list, function(a, b) return a.seq < b.seq end)
  return q
end

local function q_format(q)
  local t = { fmt("warmbox-queue 1 %d\n", q.next) }
  for _, tk in ipairs(q.list) do t[#t + 1] = fmt("%d %d %d %s\n", tk.seq, tk.dl, tk.ttl, tk.token) end
  return concat(t)
end

-- One step on queue `q` for acquisition mode `mode` ("wait" | "try"):
-- calls grab() when this waiter may take the lock (the head, or "try" on an
-- empty queue) and the key is not busy in this process. Returns
-- changed, (e | nil, err, code, head).
local function q_step(self, q, e, mode, local_busy, grab)
  local t, ttl_ms = now_ms(), ceil(self.ticket_ttl * 1000)
  local changed = q_purge(q, t)
  local may
  if mode == "try" then
    may = #q.list == 0
  else
    changed, may = true, q_enter(q, e.token, t, ttl_ms)
  end
  if not may or local_busy then return changed, nil, "busy", nil, may end
  local got, err, code = grab()
  if got and mode ~= "try" then q_leave(q, e.token) end
  if got then return changed, got end
  return changed, nil, err, code, may
end

-- ---------------------------------------------------------------------------
-- memory backend
-- ---------------------------------------------------------------------------

local memory = {}

function memory.ns() return "memory\0" end
function memory.acquire(self, _, e, _, mode, local_busy)
  local q = mem_queues[e.pkey] or q_new()
  mem_queues[e.pkey] = q
  local _, got, err, code, head = q_step(self, q, e, mode, local_busy, function()
    e.fence = next_fence(mem_fence[e.pkey])
    mem_fence[e.pkey] = e.fence
    return e
  end)
  if #q.list == 0 then mem_queues[e.pkey] = nil end
  return got, err, code, head
end
function memory.leave(_, _, pkey, token)
  local q = mem_queues[pkey]
  if q then
    q_leave(q, token)
    if #q.list == 0 then mem_queues[pkey] = nil end
  end
end
function memory.release() return true end
function memory.expire() return true end
function memory.keepalive() return true end
function memory.get_state(_, key) return mem_state[key] end
function memory.set_state(_, key, _, s)
  mem_state[key] = s
  return true
end

-- ---------------------------------------------------------------------------
-- file backend
-- ---------------------------------------------------------------------------

local file = {}

-- A safe, injective file name for any key: bytes outside [A-Za-z0-9_-] are
-- %XX-escaped (so no '/', no '.', no '..'); long keys are hashed. The two
-- forms differ by suffix ('.' never appears in an escaped name).
local function file_name(key)
  local enc = key:gsub("[^A-Za-z0-9_%-]", function(c) return fmt("%%%02X", c:byte()) end)
  if #enc > 200 then return core.sha256(key) .. ".hlock" end
  return enc .. ".lock"
end
_M._file_name = file_name

-- The lock directory is used only when it is this user's and no one else
-- may write to it (its files hold sessions' sandbox ids and access tokens):
-- made owner-only when missing, checked once per directory and process.
local function private_dir(dir)
  if made_dirs[dir] then return true end
  if not core.private_dir(dir) then
    os.execute("mkdir -p -m 0700 " .. sh_quote(dir) .. " 2>/dev/null")
  end
  local ok, err, code = core.private_dir(dir)
  if not ok then return nil, "lock directory: " .. err, code end
  made_dirs[dir] = true
  return true
end

local function open_in(dir, name)
  local ok, err, code = private_dir(dir)
  if not ok then return nil, err, code end
  return core.flock_open(dir .. "/" .. name)
end

--- The default directory of the file lock: `$XDG_RUNTIME_DIR/warmbox/locks`
-- when set, else `/tmp/warmbox-locks-<uid>`: one per user, never shared.
function _M.default_dir()
  local run = os.getenv("XDG_RUNTIME_DIR")
  if run and run ~= "" then return run .. "/warmbox/locks" end
  local uid = core.geteuid and core.geteuid()
  if not uid then -- a stand-in core (unit specs) without it
    local p = io.popen("id -u")
    uid = p and tonumber(p:read("l"))
    if p then p:close() end
  end
  return "/tmp/warmbox-locks-" .. tostring(uid)
end

local function break_lock(dir)
  local bl = break_locks[dir]
  if bl then return bl end
  local err, code
  bl, err, code = open_in(dir, ".break")
  if not bl then return nil, err, code end
  break_locks[dir] = bl
  return bl
end

local function parse(content)
  local pid, exp, token, has, fence, pos = content:match("^warmbox%-lock 1 (%d+) (%d+) (%x+) ([01]) ?(%d*)\n()")
  if not pid then return nil end
  return { pid = tonumber(pid), expires = tonumber(exp), token = token, fence = tonumber(fence),
           state = has == "1" and content:sub(pos) or nil }
end

local function header(e, state)
  return fmt("warmbox-lock 1 %d %d %s %s %d\n", core.getpid(), e.expires_at, e.token,
    state and "1" or "0", e.fence or 0) .. (state or "")
end

function file.ns(self) return "file\0" .. self.dir .. "\0" end

-- Tries to break a stuck holder's lock on `fl` (see the header comment).
-- Returns true when the path was removed (the caller retries at once).
local function try_break(self, fl, seen)
  local bl = break_lock(self.dir)
  if not bl then return false end
  if not bl:lock(min(self.timeout, 1)) then return false end
  local broke = false
  local stale = fl:stale()
  if stale == false and not fl:try_lock() then
    local cur = parse(fl:read() or "")
    if cur and cur.token == seen.token and cur.expires < now() then
      local name = file_name(seen.key)
      broke = os.remove(self.dir .. "/" .. name) and true or false
      if broke then
        -- Carry the state over into the fresh file (no one can have written
        -- a header there yet: that needs the break lock we hold).
        local nfl = open_in(self.dir, name)
        if nfl and nfl:try_lock() and (cur.state or cur.fence) then
          nfl:write(header({ token = cur.token, expires_at = 0, fence = cur.fence }, cur.state))
        end
        if nfl then nfl:close() end
      end
    end
  elseif stale == false then
    fl:unlock() -- it became free meanwhile: let the normal path take it
  end
  bl:unlock()
  return broke
end

local function file_grab(self, key, e, prev)
  if prev and prev.fl then
    -- This process still holds the flock for an entry that overran its
    -- exptime: take the handle over.
    prev.fl_taken = true
    e.fl, e.state, e.fence = prev.fl, prev.state, next_fence(prev.fence)
    e.expires_at = ceil(now() + self.exptime)
    local ok, err, code = e.fl:write(header(e, e.state))
    if not ok then return nil, err, code end
    return e
  end
  local name = file_name(key)
  for _ = 1, 8 do
    local fl, err, code = open_in(self.dir, name)
    if not fl then return nil, err, code end
    local ok
    ok, err, code = fl:try_lock()
    if not ok then
      if err ~= "busy" then
        fl:close()
        return nil, err, code
      end
      local cur = parse(fl:read() or "")
      if cur and cur.expires < now() then
        cur.key = key
        if try_break(self, fl, cur) then
          fl:close()
          goto continue
        end
      end
      fl:close()
      return nil, "busy"
    end
    do
      -- Under the break lock (shared): is our file still the one at the path?
      local bl = break_lock(self.dir)
      local shared = bl and bl:lock(1, true)
      if bl and not shared then
        -- a break is in progress (or stuck): report busy, the caller retries
        fl:close()
        return nil, "busy"
      end
      local stale = fl:stale()
      if stale then
        if shared then bl:unlock() end
        fl:close()
        goto continue
      end
      local cur = parse(fl:read() or "")
      e.fl, e.state, e.fence = fl, cur and cur.state, next_fence(cur and cur.fence)
      e.expires_at = ceil(now() + self.exptime)
      ok, err, code = fl:write(header(e, e.state))
      if shared then bl:unlock() end
      if not ok then
        fl:close()
        return nil, err, code
      end
      return e
    end
    ::continue::
  end
  return nil, "busy"
end

-- A holder whose lock was broken (see the header) finds its file gone from
-- the path: it reports "expired" and never writes into the live file.
local function broken(e)
  return e.fl:stale() ~= false
end

function file.release(_, _, e)
  if e.fl_taken then return true end
  local was_broken = broken(e) and not e.removed
  e.fl:unlock()
  -- wakes the waiters of other processes (after the unlock: they try at once)
  if e.fl.touch then e.fl:touch() end
  e.fl:close()
  if was_broken then return nil, "expired", "LOCK" end
  return true
end

function file.expire(self, _, e, t)
  if broken(e) then return nil, "expired", "LOCK" end
  e.expires_at = ceil(now() + (t or self.exptime))
  return e.fl:write(header(e, e.state))
end

function file.get_state(_, _, e) return e.state end

function file.set_state(_, _, e, s)
  if broken(e) then return nil, "expired", "LOCK" end
  local ok, err, code = e.fl:write(header(e, s))
  if not ok then return nil, err, code end
  e.state = s
  return true
end


-- Runs fn(q) -> changed, ... under the queue file's flock; rewrites the file
-- when changed. A queue lock held for over a second (its holder stopped
-- mid-update) answers nil, "queue busy".
local function with_queue(self, key, fn)
  -- opened per update (a handle kept per key would hold a descriptor for
  -- every session the process ever saw)
  local qfl, err, code = open_in(self.dir, file_name(key) .. "q")
  if not qfl then return nil, err, code end
  local ok
  ok, err, code = qfl:lock(1)
  if not ok then
    qfl:close()
    if err == "timeout" then return nil, "queue busy" end
    return nil, err, code
  end
  local q = q_parse(qfl:read() or "")
  local res = table.pack(pcall(fn, q))
  if res[1] and res[2] then
    -- A lost write costs fairness only (a ticket kept until it lapses), but
    -- a waiter must know: its ticket may not be there.
    local wok, werr, wcode = qfl:write(q_format(q))
    if not wok and not res[3] then res = { true, false, nil, werr, wcode } end
  end
  qfl:close()
  if not res[1] then error(res[2], 0) end
  return res[3], res[4], res[5], res[6]
end

function file.acquire(self, key, e, prev, mode, local_busy)
  local got, err, code, head = with_queue(self, key, function(q)
    return q_step(self, q, e, mode, local_busy, function() return file_grab(self, key, e, prev) end)
  end)
  if err == "queue busy" then
    -- A process stopped inside its queue update (SIGSTOP) holds the queue's
    -- flock: stay live, unfairly, by trying the lock itself.
    if local_busy then return nil, "busy" end
    return file_grab(self, key, e, prev)
  end
  return got, err, code, head
end

function file.leave(self, key, _, token)
  with_queue(self, key, function(q) return q_leave(q, token) end)
end

-- lk:remove(): the lock file's path removed (under the break lock, while held),
-- and the queue file when empty. Best effort: a busy break lock leaves them.
function file.remove(self, key, e)
  local bl = break_lock(self.dir)
  if not bl or broken(e) or not bl:lock(min(self.timeout, 1)) then return end
  local name = file_name(key)
  e.removed = os.remove(self.dir .. "/" .. name) and true or nil
  bl:unlock()
  -- not under the break lock: lockers take the queue's flock, then the break lock
  with_queue(self, key, function(q)
    q_purge(q, now_ms())
    if #q.list == 0 then os.remove(self.dir .. "/" .. name .. "q") end
    return false
  end)
end

-- A blocking waiter's wake-up: an inotify watch on the lock file (made
-- before the next attempt, so a release after it is never missed).
function file.blocker(self, key)
  if not core.lock_watch then return nil end
  local w = core.lock_watch()
  if not w then return nil end
  local path = self.dir .. "/" .. file_name(key)
  if not w:add(path) then w:close() return nil end
  return function(s)
    w:add(path) -- (again: a removal or break may have replaced the file)
    return w:wait(s)
  end, function() w:close() end, w
end

function file.keepalive(_, _, e, t)
  e.next_check = t + 1
  if broken(e) then return nil, "expired", "LOCK" end
  return true
end

-- ---------------------------------------------------------------------------
-- redis backend
-- ---------------------------------------------------------------------------

local redis = {}

-- KEYS: lock, queue, deadlines, seq, fence; ARGV: token, lock PX ms, ticket ms, mode
-- ("wait" | "try" | "hold" = only refresh the ticket). Returns { 1, fence } taken,
-- 2 head but the lock is held, 0 waiting behind others. The fence counter
-- starts from the server's clock in ms when missing (see next_fence) and
-- lives a year after its last use.
local ACQUIRE = [[
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function taken()
  redis.call('set', KEYS[5], now, 'NX')
  local f = redis.call('incr', KEYS[5])
  redis.call('pexpire', KEYS[5], 31622400000)
  return { 1, f }
end
local tms = tonumber(ARGV[3])
local dead = redis.call('zrangebyscore', KEYS[3], '-inf', '(' .. now)
for i = 1, #dead do
  redis.call('zrem', KEYS[2], dead[i])
  redis.call('zrem', KEYS[3], dead[i])
end
if ARGV[4] == 'try' then
  if redis.call('zcard', KEYS[2]) > 0 then return 0 end
  if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return taken() end
  return 0
end
if not redis.call('zscore', KEYS[2], ARGV[1]) then
  redis.call('zadd', KEYS[2], redis.call('incr', KEYS[4]), ARGV[1])
end
redis.call('zadd', KEYS[3], now + tms, ARGV[1])
for i = 2, 4 do redis.call('pexpire', KEYS[i], 2 * tms) end
if redis.call('zrange', KEYS[2], 0, 0)[1] ~= ARGV[1] then return 0 end
if ARGV[4] == 'hold' then return 2 end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('zrem', KEYS[2], ARGV[1])
  redis.call('zrem', KEYS[3], ARGV[1])
  return taken()
end
return 2
]]
-- KEYS: lock, queue; ARGV: token, wake list prefix, its PX ms. Deletes our
-- lock and pushes to the wake list of the queue's head.
local RELEASE = [[
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('del', KEYS[1])
local h = redis.call('zrange', KEYS[2], 0, 0)[1]
if h then
  local w = ARGV[2] .. h
  redis.call('rpush', w, 1)
  redis.call('pexpire', w, ARGV[3])
end
return 1
]]
local LEAVE = "redis.call('zrem', KEYS[1], ARGV[1]) redis.call('zrem', KEYS[2], ARGV[1]) return 1"
local UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
local PEXPIRE = "if redis.call('get', KEYS[1]) == ARGV[1] then "
  .. "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
local SET_STATE = "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end "
  .. "if ARGV[2] == '0' then redis.call('del', KEYS[2]) "
  .. "else redis.call('set', KEYS[2], ARGV[3], 'EX', ARGV[4]) end return 1"

-- core.so built without hiredis (CMake's WARMBOX_REDIS) has no core.redis.
local REDIS_NOT_BUILT = "the redis lock is not built: warmbox.core was built without hiredis "
  .. "(install libhiredis-dev and rebuild, or use lock = \"file\")"

local function conn(self)
  local r = self.redis
  local id = fmt("%s:%d:%g", r.host, r.port, r.timeout)
  local c = redis_conns[id]
  if c then return c end
  if not core.redis then return nil, REDIS_NOT_BUILT, "LOCK" end
  local err, code
  c, err, code = core.redis{ host = r.host, port = r.port, timeout = r.timeout }
  if not c then return nil, err, code end
  redis_conns[id] = c
  return c
end

local function ms(t) return max(1, floor(t * 1000 + 0.5)) end

function redis.ns(self)
  local r = self.redis
  return fmt("redis\0%s:%d\0%s\0", r.host, r.port, r.prefix)
end

local function rkeys(self, key)
  local p = self.redis.prefix
  return p .. "lock:" .. key, p .. "queue:" .. key, p .. "qdl:" .. key, p .. "qseq:" .. key, p .. "fence:" .. key
end

-- The keeper's longest cap (core's limit; ~31 years).
local MAX_CAP = 1e9

local function stop_keeper(e)
  if e.keeper then
    e.keeper:stop()
    e.keeper = nil
  end
end

function redis.acquire(self, key, e, prev, mode, local_busy)
  if mode == "try" and local_busy then return nil, "busy" end
  local c, err, code = conn(self)
  if not c then return nil, err, code end
  local lkey, qkey, dkey, seqkey, fkey = rkeys(self, key)
  if prev and prev.token and not local_busy then
    -- Our own in-process holder overran exptime: drop its key if still there.
    stop_keeper(prev)
    c:command("EVAL", UNLOCK, 1, lkey, prev.token)
  end
  local res
  res, err, code = c:command("EVAL", ACQUIRE, 5, lkey, qkey, dkey, seqkey, fkey, e.token, ms(self.ttl),
    ms(self.ticket_ttl), local_busy and "hold" or mode)
  if res == nil then return nil, err, code end
  if type(res) ~= "table" then return nil, "busy", nil, res == 2 end
  e.fence = tonumber(res[2])
  e.lkey, e.skey = lkey, self.redis.prefix .. "state:" .. key
  e.qkey, e.wkey = qkey, self.redis.prefix .. "wake:" .. key .. ":"
  if self.use_keeper then
    -- nil when the thread cannot start: keepalive() then refreshes the key
    e.keeper = c:keeper(lkey, e.token, self.ttl, min(self.exptime, MAX_CAP))
  end
  return e
end

function redis.leave(self, key, _, token)
  local c = conn(self)
  if not c then return end
  local _, qkey, dkey = rkeys(self, key)
  c:command("EVAL", LEAVE, 2, qkey, dkey, token)
end

function redis.release(self, _, e)
  stop_keeper(e)
  local c, err, code = conn(self)
  if not c then return nil, err, code end
  local n
  n, err, code = c:command("EVAL", RELEASE, 2, e.lkey, e.qkey, e.token, e.wkey, ms(2 * self.ticket_ttl))
  if n == nil then return nil, err, code end
  if n == 0 then return nil, "expired", "LOCK" end
  return true
end

-- A blocking waiter's wake-up: BLPOP on its own wake list (see RELEASE),
-- for at most the connection's timeout.
function redis.blocker(self, key, ticket)
  local c = conn(self)
  if not c then return nil end
  local wl = self.redis.prefix .. "wake:" .. key .. ":" .. ticket
  local cap = self.redis.timeout / 2
  return function(s)
    s = min(s, cap)
    if s < 0.001 then return false end
    return c:command("BLPOP", wl, fmt("%.3f", s)) ~= nil
  end, function() c:command("DEL", wl) end
end

-- One compare-and-pexpire to `ttl`: true | nil, "expired", "LOCK" | nil, msg, code
local function refresh(self, e)
  local c, err, code = conn(self)
  if not c then return nil, err, code end
  local n
  n, err, code = c:command("EVAL", PEXPIRE, 1, e.lkey, e.token, ms(self.ttl))
  if n == nil then return nil, err, code end
  if n == 0 then return nil, "expired", "LOCK" end
  return true
end

function redis.expire(self, _, e, t)
  local ok, err, code = refresh(self, e)
  if not ok then
    if err == "expired" then stop_keeper(e) end
    return nil, err, code
  end
  local cap = min(t or self.exptime, MAX_CAP)
  if self.use_keeper and not (e.keeper and e.keeper:extend(cap)) then
    stop_keeper(e)
    local c = conn(self)
    if c then e.keeper = c:keeper(e.lkey, e.token, self.ttl, cap) end
  end
  return true
end

function redis.keepalive(self, _, e, t)
  e.next_check = t + self.ttl / 3
  if not e.keeper then
    if t > e.expires then return nil, "expired (held past exptime)", "LOCK" end
    return refresh(self, e)
  end
  local state, age, err = e.keeper:status()
  if state == "ok" then return true end
  if state == "failing" then
    if age < self.ttl then return true end
    return nil, fmt("lock not refreshed for %.1f s (it may have expired): %s", age, tostring(err)), "TRANSPORT"
  end
  if state == "capped" then return nil, "expired (held past exptime)", "LOCK" end
  return nil, "expired", "LOCK"
end

function redis.get_state(self, _, e)
  local c, err, code = conn(self)
  if not c then return nil, err, code end
  return c:command("GET", e.skey)
end

function redis.set_state(self, _, e, s)
  local c, err, code = conn(self)
  if not c then return nil, err, code end
  local n
  n, err, code = c:command("EVAL", SET_STATE, 2, e.lkey, e.skey, e.token, s and "1" or "0", s or "",
    ceil(self.state_ttl))
  if n == nil then return nil, err, code end
  if n == 0 then return nil, "expired", "LOCK" end
  return true
end

local impl = { memory = memory, file = file, redis = redis }

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
--   wait (function(seconds); default lock.wait), state_ttl (604800, redis),
--   ttl (10, redis: the key's PX), ticket_ttl (5), keeper (true, redis)
function _M.new(opts)
  opts = errors.check_options(opts, OPTS, "new", 1)
  local self = {
    backend = opts.backend or "file",
    dir = opts.dir or ((opts.backend or "file") == "file" and _M.default_dir() or "-"),
    wait = opts.wait,
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
  local r = opts.redis or {}
  errors.check_options(r, REDIS_OPTS, "new", 1, 2, "redis.")
  self.redis = { host = r.host or "127.0.0.1", port = r.port or 6379, timeout = r.timeout or 5,
                 prefix = r.prefix or "warmbox:" }
  self.impl = impl[self.backend]
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
      local woke = (self.wait or _M.wait)(min(step, timeout - elapsed), waker)
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
function _M.failure(what, err)
  if err == "timeout" then return nil, what .. " is busy (another run holds it)", "BUSY" end
  return nil, "cannot lock " .. what .. ": " .. tostring(err), "LOCK"
end

--- For `local _ <close> = lock.closing(lk)`: `lk` itself when `<close>` can
-- close it, else a guard that calls its `close` (a caller's own lock object
-- may have neither).
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
