--- warmbox.lock.redis: the redis backend of warmbox.lock, one holder per
-- key across hosts. The backend interface (every backend has it;
-- warmbox.lock calls it) is described in lua/warmbox/lock/init.lua.
--
-- The lock is `<prefix>lock:<key>` = token (SET NX PX ttl, taken by the queue
-- script only for the queue's head); unlock, expire, keepalive and set_state
-- are compare-and-{delete,pexpire,set} scripts, so a holder whose lock
-- expired can never release or touch the next holder's. The key's PX is
-- short (`ttl`, 10 s) and a keeper thread of the holder's process
-- (core.redis keeper) refreshes it every ttl/3 until unlock or exptime, also
-- while the holder's Lua side is inside a long blocking call (a silent
-- cell): a crashed, stopped or cut-off holder frees the key within `ttl`.
-- With `keeper = false`, `lk:keepalive()` refreshes the key itself.
--
-- The queue: `<prefix>queue:<key>` (ZSET token -> arrival number from INCR
-- `<prefix>qseq:<key>`) and `<prefix>qdl:<key>` (ZSET token -> deadline,
-- server ms), updated by one script with the server's clock; the three
-- expire 2 x ticket_ttl after the last waiter's refresh. The state lives
-- under `<prefix>state:<key>` with its own TTL (`state_ttl`). A blocking
-- waiter BLPOPs `<prefix>wake:<key>:<ticket>`, which the release script
-- pushes to for the queue's head.
local core = require "warmbox.core"
local stop_keeper = require("warmbox.lock.common").stop_keeper

local type, tostring, tonumber = type, tostring, tonumber
local fmt, min, max, floor, ceil = string.format, math.min, math.max, math.floor, math.ceil

local _M = {}

-- connections by host:port:timeout
local redis_conns = {}

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

local function conn(lk)
  local r = lk.redis
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

function _M.ns(lk)
  local r = lk.redis
  return fmt("redis\0%s:%d\0%s\0", r.host, r.port, r.prefix)
end

local function rkeys(lk, key)
  local p = lk.redis.prefix
  return p .. "lock:" .. key, p .. "queue:" .. key, p .. "qdl:" .. key, p .. "qseq:" .. key, p .. "fence:" .. key
end

-- The keeper's longest cap (core's limit; ~31 years).
local MAX_CAP = 1e9

function _M.acquire(lk, key, e, prev, mode, local_busy)
  if mode == "try" and local_busy then return nil, "busy" end
  local c, err, code = conn(lk)
  if not c then return nil, err, code end
  local lkey, qkey, dkey, seqkey, fkey = rkeys(lk, key)
  if prev and prev.token and not local_busy then
    -- Our own in-process holder overran exptime: drop its key if still there.
    stop_keeper(prev)
    c:command("EVAL", UNLOCK, 1, lkey, prev.token)
  end
  local res
  res, err, code = c:command("EVAL", ACQUIRE, 5, lkey, qkey, dkey, seqkey, fkey, e.token, ms(lk.ttl),
    ms(lk.ticket_ttl), local_busy and "hold" or mode)
  if res == nil then return nil, err, code end
  if type(res) ~= "table" then return nil, "busy", nil, res == 2 end
  e.fence = tonumber(res[2])
  e.lkey, e.skey = lkey, lk.redis.prefix .. "state:" .. key
  e.qkey, e.wkey = qkey, lk.redis.prefix .. "wake:" .. key .. ":"
  if lk.use_keeper then
    -- nil when the thread cannot start: keepalive() then refreshes the key
    e.keeper = c:keeper(lkey, e.token, lk.ttl, min(lk.exptime, MAX_CAP))
  end
  return e
end

function _M.leave(lk, key, _, token)
  local c = conn(lk)
  if not c then return end
  local _, qkey, dkey = rkeys(lk, key)
  c:command("EVAL", LEAVE, 2, qkey, dkey, token)
end

function _M.release(lk, _, e)
  stop_keeper(e)
  local c, err, code = conn(lk)
  if not c then return nil, err, code end
  local n
  n, err, code = c:command("EVAL", RELEASE, 2, e.lkey, e.qkey, e.token, e.wkey, ms(2 * lk.ticket_ttl))
  if n == nil then return nil, err, code end
  if n == 0 then return nil, "expired", "LOCK" end
  return true
end

-- A blocking waiter's wake-up: BLPOP on its own wake list (see RELEASE),
-- for at most the connection's timeout.
function _M.blocker(lk, key, ticket)
  local c = conn(lk)
  if not c then return nil end
  local wl = lk.redis.prefix .. "wake:" .. key .. ":" .. ticket
  local cap = lk.redis.timeout / 2
  return function(s)
    s = min(s, cap)
    if s < 0.001 then return false end
    return c:command("BLPOP", wl, fmt("%.3f", s)) ~= nil
  end, function() c:command("DEL", wl) end
end

-- One compare-and-pexpire to `ttl`: true | nil, "expired", "LOCK" | nil, msg, code
local function refresh(lk, e)
  local c, err, code = conn(lk)
  if not c then return nil, err, code end
  local n
  n, err, code = c:command("EVAL", PEXPIRE, 1, e.lkey, e.token, ms(lk.ttl))
  if n == nil then return nil, err, code end
  if n == 0 then return nil, "expired", "LOCK" end
  return true
end

function _M.expire(lk, _, e, t)
  local ok, err, code = refresh(lk, e)
  if not ok then
    if err == "expired" then stop_keeper(e) end
    return nil, err, code
  end
  local cap = min(t or lk.exptime, MAX_CAP)
  if lk.use_keeper and not (e.keeper and e.keeper:extend(cap)) then
    stop_keeper(e)
    local c = conn(lk)
    if c then e.keeper = c:keeper(e.lkey, e.token, lk.ttl, cap) end
  end
  return true
end

function _M.keepalive(lk, _, e, t)
  e.next_check = t + lk.ttl / 3
  if not e.keeper then
    if t > e.expires then return nil, "expired (held past exptime)", "LOCK" end
    return refresh(lk, e)
  end
  local state, age, err = e.keeper:status()
  if state == "ok" then return true end
  if state == "failing" then
    if age < lk.ttl then return true end
    return nil, fmt("lock not refreshed for %.1f s (it may have expired): %s", age, tostring(err)), "TRANSPORT"
  end
  if state == "capped" then return nil, "expired (held past exptime)", "LOCK" end
  return nil, "expired", "LOCK"
end

function _M.get_state(lk, _, e)
  local c, err, code = conn(lk)
  if not c then return nil, err, code end
  return c:command("GET", e.skey)
end

function _M.set_state(lk, _, e, s)
  local c, err, code = conn(lk)
  if not c then return nil, err, code end
  local n
  n, err, code = c:command("EVAL", SET_STATE, 2, e.lkey, e.skey, e.token, s and "1" or "0", s or "",
    ceil(lk.state_ttl))
  if n == nil then return nil, err, code end
  if n == 0 then return nil, "expired", "LOCK" end
  return true
end

return _M
