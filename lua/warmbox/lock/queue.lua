--- warmbox.lock.queue: the ticket queue that makes the lock fair (the
-- memory and file backends; the redis backend does the same in a script).
--
-- A queue is `{ next = <seq>, list = { { seq =, dl = <deadline ms>, ttl =
-- <ms>, token = }, ... } }`, its list in arrival order (by seq). Each waiting
-- `lock()` holds a ticket and refreshes its deadline on every attempt; only
-- the head may take the lock, and `try_lock` only when the list is empty. A
-- ticket not refreshed for its ttl (its waiter died or gave up) is dropped by
-- the next waiter's purge, so a dead waiter delays the queue by one ttl at most.
--
-- The file form (`<lock file>q`): a line `warmbox-queue 1 <next seq>`, then
-- one line `<seq> <deadline ms> <ttl ms> <token>` per ticket (deadlines on
-- CLOCK_MONOTONIC, which all processes of a host share).
local now_ms = require("warmbox.lock.common").now_ms

local ipairs, tonumber = ipairs, tonumber
local fmt, ceil, concat = string.format, math.ceil, table.concat

local _M = {}

--- An empty queue.
-- syntax: q = queue.new()
function _M.new() return { next = 1, list = {} } end

--- Drops lapsed tickets (and deadlines further away than twice their own
-- ttl: the clock was reset, e.g. by a reboot) at time `t` (ms); true when
-- something changed.
-- syntax: changed = queue.purge(q, now_ms)
function _M.purge(q, t)
  local keep = {}
  for _, tk in ipairs(q.list) do
    if tk.dl >= t and tk.dl <= t + 2 * tk.ttl then keep[#keep + 1] = tk end
  end
  local changed = #keep ~= #q.list
  q.list = keep
  return changed
end

--- Enters (or refreshes) `token` with a deadline `ttl_ms` after `t`; true
-- when it is the head.
-- syntax: is_head = queue.enter(q, token, now_ms, ttl_ms)
function _M.enter(q, token, t, ttl_ms)
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

--- Takes `token`'s ticket out; true when it was there.
-- syntax: was_there = queue.leave(q, token)
function _M.leave(q, token)
  for i, tk in ipairs(q.list) do
    if tk.token == token then
      table.remove(q.list, i)
      return true
    end
  end
  return false
end

--- The queue in file form `s` (an empty queue when `s` is not one).
-- syntax: q = queue.parse(s)
function _M.parse(s)
  local nxt, pos = s:match("^warmbox%-queue 1 (%d+)\n()")
  local q = _M.new()
  if not nxt then return q end
  q.next = tonumber(nxt)
  for seq, dl, ttl, token in s:sub(pos):gmatch("(%d+) (%d+) (%d+) (%x+)\n") do
    q.list[#q.list + 1] = { seq = tonumber(seq), dl = tonumber(dl), ttl = tonumber(ttl), token = token }
  end
  table.sort(q.list, function(a, b) return a.seq < b.seq end)
  return q
end

--- The file form of queue `q`.
-- syntax: s = queue.format(q)
function _M.format(q)
  local t = { fmt("warmbox-queue 1 %d\n", q.next) }
  for _, tk in ipairs(q.list) do t[#t + 1] = fmt("%d %d %d %s\n", tk.seq, tk.dl, tk.ttl, tk.token) end
  return concat(t)
end

--- One step of lock object `lk` on queue `q` for entry `e` and acquisition
-- mode `mode` ("wait" | "try"): calls `grab()` when this waiter may take the
-- lock (the head, or "try" on an empty queue) and the key is not busy in
-- this process (`local_busy`). Returns changed, (e | nil, err, code, head).
-- syntax: changed, e, err, code, head = queue.step(lk, q, e, mode, local_busy, grab)
function _M.step(lk, q, e, mode, local_busy, grab)
  local t, ttl_ms = now_ms(), ceil(lk.ticket_ttl * 1000)
  local changed = _M.purge(q, t)
  local may
  if mode == "try" then
    may = #q.list == 0
  else
    changed, may = true, _M.enter(q, e.token, t, ttl_ms)
  end
  if not may or local_busy then return changed, nil, "busy", nil, may end
  local got, err, code = grab()
  if got and mode ~= "try" then _M.leave(q, e.token) end
  if got then return changed, got end
  return changed, nil, err, code, may
end

return _M
