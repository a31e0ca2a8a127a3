--- warmbox.lock: one holder per key, across the coroutines of one process
-- (every backend), the processes of one host (`file`) and hosts (`redis`).
-- Mirrors lua-resty-lock: `elapsed, err = lk:lock(key)`, `lk:unlock()`,
-- `lk:expire(t)`, errors "timeout" | "locked" | "unlocked"; new for 5.4,
-- `local lk <close> = lock.new(opts)` unlocks when the block is left.
--
-- Each lock also carries a small per-key state (`get_state`/`set_state`,
-- only while held): the session code keeps the remembered sandbox id and
-- lease there, so processes that share a key share that memory. The state
-- is a cache: losing it (a broken lock, a wiped /tmp) costs one lookup.
--
-- Backends:
--   memory  this Lua state only (the in-process table below).
--   file    one file per key under `dir`, locked with flock(2). The kernel
--           releases the lock when the holder dies. File contents: a header
--           line `warmbox-lock 1 <pid> <expires unix s> <token> <0|1>` then
--           the state. Lock files are never removed in normal operation (an
--           unlink racing a flock would let two holders in).
--           exptime and hung holders: a holder that is alive but stuck past
--           its expiry (header) may be broken by a waiter. Breaking happens
--           under `dir/.break` (exclusive) and only if the path still names
--           the same file, it is still flock-held and its header is the same
--           expired one; the breaker removes the path, so new lockers use a
--           fresh file (the state is carried over) while the stuck holder
--           keeps a lock on an orphan inode. Every locker, after taking
--           flock, checks under `dir/.break` (shared) that its file is still
--           the one at the path before writing its header, so a break can
--           never race a fresh holder. Expiry uses the wall clock in whole
--           seconds (a lock is breakable once now > expires).
--   redis   SET key token NX PX exptime; unlock, expire and set_state are
--           compare-and-{delete,pexpire,set} scripts, so a holder whose
--           lock expired can never release or touch the next holder's.
--           The state lives under a sibling key (`<prefix>state:<key>`)
--           with its own TTL (`state_ttl`).
--
-- Every backend first takes an in-process table entry, so coroutines of one
-- process serialize without a second flock on another descriptor (which
-- would block the whole process). A waiter calls `wait(step)` between
-- attempts (default: coroutine.yield() when yieldable, else core.sleep(step))
-- with step * ratio backoff capped at max_step, until `timeout`.
local core = require "warmbox.core"

local error, pairs, pcall, setmetatable, type, tostring, tonumber =
  error, pairs, pcall, setmetatable, type, tostring, tonumber
local fmt, min, floor, ceil = string.format, math.min, math.floor, math.ceil
local co_yield, co_isyieldable = coroutine.yield, coroutine.isyieldable
local now, sleep = core.now, core.sleep

local _M = { _VERSION = "0.1.0" }
local mt = { __index = _M }

-- The in-process table: namespace .. key -> entry { token, expires, ... }.
local held = {}
-- memory backend state: key -> string
local mem_state = {}
-- created directories, break-lock handles per dir, redis connections
local made_dirs, break_locks, redis_conns = {}, {}, {}

local counter = 0
local function new_token()
  counter = counter + 1
  return core.sha256(fmt("%d:%.9f:%d:%s:%.17g", core.getpid(), now(), counter,
    tostring({}), math.random())):sub(1, 32)
end

local function default_wait(step)
  if co_isyieldable() then
    co_yield()
  else
    sleep(step)
  end
end

local function sh_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- ---------------------------------------------------------------------------
-- option checking (misuse raises)
-- ---------------------------------------------------------------------------

local OPTS = {
  backend = "string", dir = "string", redis = "table", timeout = "number", exptime = "number",
  step = "number", ratio = "number", max_step = "number", wait = "function", state_ttl = "number",
}
local REDIS_OPTS = { host = "string", port = "number", timeout = "number", prefix = "string" }
local BACKENDS = { memory = true, file = true, redis = true }

local function check_fields(t, spec, what, level)
  for k, v in pairs(t) do
    local want = spec[k]
    if not want then
      error(fmt("bad argument #1 to 'new' (unknown option '%s%s')", what, tostring(k)), level)
    end
    if type(v) ~= want then
      error(fmt("bad argument #1 to 'new' (option '%s%s' must be a %s, got %s)", what, k, want, type(v)), level)
    end
  end
end

-- ---------------------------------------------------------------------------
-- memory backend
-- ---------------------------------------------------------------------------

local memory = {}

function memory.ns() return "memory\0" end
function memory.acquire() return {} end
function memory.release() return true end
function memory.expire() return true end
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

local function open_in(dir, name)
  local path = dir .. "/" .. name
  local fl, err, code = core.flock_open(path)
  if not fl and not made_dirs[dir] then
    -- Create the directory (owner-only) once, then retry.
    os.execute("mkdir -p -m 0700 " .. sh_quote(dir) .. " 2>/dev/null")
    made_dirs[dir] = true
    fl, err, code = core.flock_open(path)
  end
  if fl then made_dirs[dir] = true end
  return fl, err, code
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
  local pid, exp, token, has, pos = content:match("^warmbox%-lock 1 (%d+) (%d+) (%x+) ([01])\n()")
  if not pid then return nil end
  return { pid = tonumber(pid), expires = tonumber(exp), token = token,
           state = has == "1" and content:sub(pos) or nil }
end

local function header(e, state)
  return fmt("warmbox-lock 1 %d %d %s %s\n", core.getpid(), e.wall_expires, e.token,
    state and "1" or "0") .. (state or "")
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
    if cur and cur.token == seen.token and cur.expires < os.time() then
      local name = file_name(seen.key)
      broke = os.remove(self.dir .. "/" .. name) and true or false
      if broke and cur.state then
        -- Carry the state over into the fresh file (no one can have written
        -- a header there yet: that needs the break lock we hold).
        local nfl = open_in(self.dir, name)
        if nfl and nfl:try_lock() then
          nfl:write(header({ token = cur.token, wall_expires = 0 }, cur.state))
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

function file.acquire(self, key, e, prev)
  if prev and prev.fl then
    -- This process still holds the flock for an entry that overran its
    -- exptime: take the handle over.
    prev.fl_taken = true
    e.fl, e.state = prev.fl, prev.state
    e.wall_expires = os.time() + ceil(self.exptime)
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
      if cur and cur.expires < os.time() then
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
      e.fl, e.state = fl, cur and cur.state
      e.wall_expires = os.time() + ceil(self.exptime)
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
  local was_broken = broken(e)
  e.fl:unlock()
  e.fl:close()
  if was_broken then return nil, "expired" end
  return true
end

function file.expire(self, _, e, t)
  if broken(e) then return nil, "expired" end
  e.wall_expires = os.time() + ceil(t or self.exptime)
  return e.fl:write(header(e, e.state))
end

function file.get_state(_, _, e) return e.state end

function file.set_state(_, _, e, s)
  if broken(e) then return nil, "expired" end
  local ok, err, code = e.fl:write(header(e, s))
  if not ok then return nil, err, code end
  e.state = s
  return true
end

-- ---------------------------------------------------------------------------
-- redis backend
-- ---------------------------------------------------------------------------

local redis = {}

local UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
local PEXPIRE = "if redis.call('get', KEYS[1]) == ARGV[1] then "
  .. "return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
local SET_STATE = "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end "
  .. "if ARGV[2] == '0' then redis.call('del', KEYS[2]) "
  .. "else redis.call('set', KEYS[2], ARGV[3], 'EX', ARGV[4]) end return 1"

local function conn(self)
  local r = self.redis
  local id = fmt("%s:%d:%g", r.host, r.port, r.timeout)
  local c = redis_conns[id]
  if c then return c end
  local err, code
  c, err, code = core.redis{ host = r.host, port = r.port, timeout = r.timeout }
  if not c then return nil, err, code end
  redis_conns[id] = c
  return c
end

local function ms(t) return math.max(1, floor(t * 1000 + 0.5)) end

function redis.ns(self)
  local r = self.redis
  return fmt("redis\0%s:%d\0%s\0", r.host, r.port, r.prefix)
end

function redis.acquire(self, key, e, prev)
  local c, err, code = conn(self)
  if not c then return nil, err, code end
  local lkey = self.redis.prefix .. "lock:" .. key
  if prev and prev.token then
    -- Our own in-process holder overran exptime: drop its key if still there.
    c:command("EVAL", UNLOCK, 1, lkey, prev.token)
  end
  local res
  res, err, code = c:command("SET", lkey, e.token, "NX", "PX", ms(self.exptime))
  if res == nil then
    if err then return nil, err, code end
    return nil, "busy"
  end
  e.lkey, e.skey = lkey, self.redis.prefix .. "state:" .. key
  return e
end

function redis.release(self, _, e)
  local c, err, code = conn(self)
  if not c then return nil, err, code end
  local n
  n, err, code = c:command("EVAL", UNLOCK, 1, e.lkey, e.token)
  if n == nil then return nil, err, code end
  if n == 0 then return nil, "expired" end
  return true
end

function redis.expire(self, _, e, t)
  local c, err, code = conn(self)
  if not c then return nil, err, code end
  local n
  n, err, code = c:command("EVAL", PEXPIRE, 1, e.lkey, e.token, ms(t or self.exptime))
  if n == nil then return nil, err, code end
  if n == 0 then return nil, "expired" end
  return true
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
  if n == 0 then return nil, "expired" end
  return true
end

local impl = { memory = memory, file = file, redis = redis }

-- ---------------------------------------------------------------------------
-- the lock object
-- ---------------------------------------------------------------------------

--- Creates a lock object (holds at most one key at a time).
-- @tparam[opt] table opts backend ("file"), dir ("/tmp/warmbox-locks"),
--   redis {host="127.0.0.1", port=6379, timeout=5, prefix="warmbox:"},
--   timeout (30), exptime (600), step (0.01), ratio (2), max_step (0.5),
--   wait (function(step)), state_ttl (604800, redis only)
function _M.new(opts)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then
    error("bad argument #1 to 'new' (table expected, got " .. type(opts) .. ")", 2)
  end
  check_fields(opts, OPTS, "", 3)
  local self = {
    backend = opts.backend or "file",
    dir = opts.dir or "/tmp/warmbox-locks",
    timeout = opts.timeout or 30,
    exptime = opts.exptime or 600,
    step = opts.step or 0.01,
    ratio = opts.ratio or 2,
    max_step = opts.max_step or 0.5,
    wait = opts.wait or default_wait,
    state_ttl = opts.state_ttl or 604800,
  }
  if not BACKENDS[self.backend] then
    error("bad argument #1 to 'new' (unknown backend '" .. self.backend .. "')", 2)
  end
  if self.dir == "" then error("bad argument #1 to 'new' (option 'dir' must not be empty)", 2) end
  self.dir = (self.dir:gsub("(.)/+$", "%1"))
  local function bad(k, what) error("bad argument #1 to 'new' (option '" .. k .. "' must be " .. what .. ")", 3) end
  if self.timeout ~= self.timeout or self.timeout < 0 then bad("timeout", ">= 0") end
  for _, k in pairs{ "exptime", "step", "max_step", "state_ttl" } do
    if self[k] ~= self[k] or self[k] <= 0 then bad(k, "> 0") end
  end
  if self.ratio ~= self.ratio or self.ratio < 1 then bad("ratio", ">= 1") end
  local r = opts.redis or {}
  check_fields(r, REDIS_OPTS, "redis.", 3)
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

-- One non-blocking attempt: true | nil, "busy" | nil, msg, code
local function attempt(self, key)
  local pkey = self.ns .. key
  local prev = held[pkey]
  local t = now()
  if prev and prev.expires > t then return nil, "busy" end
  local e = { token = new_token(), expires = t + self.exptime, pkey = pkey }
  local ok, err, code = self.impl.acquire(self, key, e, prev)
  if not ok then return nil, err, code end
  held[pkey] = e
  self._key, self._entry = key, e
  return true
end

--- Takes the lock on `key`, waiting up to `timeout` seconds.
-- @treturn[1] number seconds waited
-- @return[2] nil, "timeout" | "locked" | message, code
function _M:lock(key)
  check_key(key, "lock")
  if self._entry then return nil, "locked" end
  local start = now()
  local step, timeout = self.step, self.timeout
  while true do
    local ok, err, code = attempt(self, key)
    if ok then return now() - start end
    if err ~= "busy" then return nil, err, code end
    local elapsed = now() - start
    if elapsed >= timeout then return nil, "timeout" end
    self.wait(min(step, timeout - elapsed))
    step = min(step * self.ratio, self.max_step)
  end
end

--- Takes the lock on `key` if it is free.
-- @return true | nil, "busy" | nil, "locked" | nil, msg, code
function _M:try_lock(key)
  check_key(key, "try_lock")
  if self._entry then return nil, "locked" end
  return attempt(self, key)
end

local function current(self)
  local e = self._entry
  if not e then return nil end
  if held[e.pkey] ~= e then
    -- Our exptime passed and another holder took the key over.
    self._key, self._entry = nil, nil
    return nil, "expired"
  end
  return e
end

--- Releases the lock.
-- @return true | nil, "unlocked" | nil, "expired" (it had been taken over)
function _M:unlock()
  local e = self._entry
  if not e then return nil, "unlocked" end
  local key = self._key
  self._key, self._entry = nil, nil
  if held[e.pkey] ~= e then return nil, "expired" end
  held[e.pkey] = nil
  return self.impl.release(self, key, e)
end

--- Sets the lock's expiry to `t` seconds from now (default exptime).
function _M:expire(t)
  if t ~= nil and (type(t) ~= "number" or t ~= t or t <= 0) then
    error("bad argument #1 to 'expire' (positive number expected, got " .. tostring(t) .. ")", 2)
  end
  local e, err = current(self)
  if not e then return nil, err or "unlocked" end
  e.expires = now() + (t or self.exptime)
  return self.impl.expire(self, self._key, e, t)
end

--- The key's shared state (string or nil), only while held.
function _M:get_state()
  local e, err = current(self)
  if not e then return nil, err or "unlocked" end
  return self.impl.get_state(self, self._key, e)
end

--- Replaces the key's shared state (nil clears it), only while held.
function _M:set_state(s)
  if s ~= nil and type(s) ~= "string" then
    error("bad argument #1 to 'set_state' (string or nil expected, got " .. type(s) .. ")", 2)
  end
  local e, err = current(self)
  if not e then return nil, err or "unlocked" end
  return self.impl.set_state(self, self._key, e, s)
end

--- The key this object holds, or nil.
function _M:key()
  return (current(self)) and self._key or nil
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
