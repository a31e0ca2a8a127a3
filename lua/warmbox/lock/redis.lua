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
--
-- Topologies (lock/redis_client.lua): one node, a primary behind Sentinel
-- (found again after a failover, by core.redis and by the keeper thread),
-- or a Cluster (every name of one key carries the hash tag `{key}`, so each
-- script touches one slot; MOVED and ASK followed). A failover may lose the
-- last writes: the fence is never lower than the primary's clock in
-- microseconds (see ACQUIRE), and a lost lock key is seen by the keeper
-- (`keepalive`) and by `held` (one GET) before a run collects its outputs.
local rc = require "warmbox.lock.redis_client"
local stop_keeper = require("warmbox.lock.common").stop_keeper

local type, tostring, tonumber = type, tostring, tonumber
local fmt, min, max, floor, ceil = string.format, math.min, math.max, math.floor, math.ceil

local _M = {}

-- KEYS: lock, queue, deadlines, seq, fence; ARGV: token, lock PX ms, ticket ms, mode
-- ("wait" | "try" | "hold" = only refresh the ticket). Returns { 1, fence } taken,
-- 2 head but the lock is held, 0 waiting behind others. The fence is the
-- counter plus one, raised to the server's clock in microseconds when that
-- is higher: after a failover whose new primary lost the last increments
-- (or the whole counter), the next number is still above every one handed
-- out, as long as the primaries' clocks agree within the failover's length
-- (holds of one key are far fewer than one a microsecond). It lives a year
-- after its last use. A lock key that already holds ARGV[1] is ours (the
-- reply of an earlier try was lost): taken again, with a new fence.
local ACQUIRE = [[
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function taken()
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local f = redis.call('incr', KEYS[5])
  if f < us then
    f = us
    redis.call('set', KEYS[5], string.format('%.0f', us))
  end
  redis.call('pexpire', KEYS[5], 31622400000)
  return { 1, f }
end
if ARGV[4] ~= 'hold' and redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('zrem', KEYS[2], ARGV[1])
  redis.call('zrem', KEYS[3], ARGV[1])
  return taken()
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

local function conn(lk)
  return rc.client(lk.redis)
end

local function ms(t) return max(1, floor(t * 1000 + 0.5)) end

function _M.ns(lk)
  return fmt("redis\0%s\0%s\0", rc.id(lk.redis), lk.redis.prefix)
end

-- The names of key's lock, queue, deadlines, sequence, fence, and its routing tag.
local function rkeys(lk, key)
  local r, name = lk.redis, rc.name
  local lkey, tag = name(r, "lock", key)
  return lkey, name(r, "queue", key), name(r, "qdl", key), name(r, "qseq", key), name(r, "fence", key), tag
end

-- The keeper's longest cap (core's limit; ~31 years).
local MAX_CAP = 1e9

function _M.acquire(lk, key, e, prev, mode, local_busy)
  if mode == "try" and local_busy then return nil, "busy" end
  local c = conn(lk)
  local lkey, qkey, dkey, seqkey, fkey, tag = rkeys(lk, key)
  if prev and prev.token and not local_busy then
    -- Our own in-process holder overran exptime: drop its key if still there.
    stop_keeper(prev)
    c:call(tag, "EVAL", UNLOCK, 1, lkey, prev.token)
  end
  local res, err, code = c:call(tag, "EVAL", ACQUIRE, 5, lkey, qkey, dkey, seqkey, fkey, e.token, ms(lk.ttl),
    ms(lk.ticket_ttl), local_busy and "hold" or mode)
  if res == nil then return nil, err, code end
  if type(res) ~= "table" then return nil, "busy", nil, res == 2 end
  e.fence = tonumber(res[2])
  e.lkey, e.skey, e.tag = lkey, (rc.name(lk.redis, "state", key)), tag
  e.qkey, e.wkey = qkey, (rc.name(lk.redis, "wake", key)) .. ":"
  if lk.use_keeper then
    -- nil when the thread cannot start: keepalive() then refreshes the key
    e.keeper = c:keeper(tag, lkey, e.token, lk.ttl, min(lk.exptime, MAX_CAP))
  end
  return e
end

function _M.leave(lk, key, _, token)
  local _, qkey, dkey, _, _, tag = rkeys(lk, key)
  conn(lk):call(tag, "EVAL", LEAVE, 2, qkey, dkey, token)
end

function _M.release(lk, _, e)
  stop_keeper(e)
  local n, err, code = conn(lk):call(e.tag, "EVAL", RELEASE, 2, e.lkey, e.qkey, e.token, e.wkey,
    ms(2 * lk.ticket_ttl))
  if n == nil then return nil, err, code end
  if n == 0 then return nil, "expired", "LOCK" end
  return true
end

-- A blocking waiter's wake-up: BLPOP on its own wake list (see RELEASE),
-- for at most the connection's timeout.
function _M.blocker(lk, key, ticket)
  local c = conn(lk)
  local wl, tag = rc.name(lk.redis, "wake", key)
  wl = wl .. ":" .. ticket
  local cap = lk.redis.timeout / 2
  return function(s)
    s = min(s, cap)
    if s < 0.001 then return false end
    return c:call(tag, "BLPOP", wl, fmt("%.3f", s)) ~= nil
  end, function() c:call(tag, "DEL", wl) end
end

-- One compare-and-pexpire to `ttl`: true | nil, "expired", "LOCK" | nil, msg, code
local function refresh(lk, e)
  local n, err, code = conn(lk):call(e.tag, "EVAL", PEXPIRE, 1, e.lkey, e.token, ms(lk.ttl))
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
    e.keeper = conn(lk):keeper(e.tag, e.lkey, e.token, lk.ttl, cap)
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

--- Whether the key still holds this hold's token, asked of the primary now
-- (one GET; a failover that lost the key answers "expired"): true | nil,
-- "expired", "LOCK" | nil, msg, code (Redis could not be asked).
function _M.held(lk, _, e)
  local v, err, code = conn(lk):call(e.tag, "GET", e.lkey)
  if v == nil and err then return nil, err, code end
  if v ~= e.token then
    stop_keeper(e)
    return nil, "expired", "LOCK"
  end
  return true
end

function _M.get_state(lk, _, e)
  return conn(lk):call(e.tag, "GET", e.skey)
end

function _M.set_state(lk, _, e, s)
  local n, err, code = conn(lk):call(e.tag, "EVAL", SET_STATE, 2, e.lkey, e.skey, e.token, s and "1" or "0", s or "",
    ceil(lk.state_ttl))
  if n == nil then return nil, err, code end
  if n == 0 then return nil, "expired", "LOCK" end
  return true
end

return _M
