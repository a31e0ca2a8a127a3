--- warmbox.lock.file: the file backend of warmbox.lock, one holder per key
-- across the processes of one host. The backend interface (every backend
-- has it; warmbox.lock calls it) is described in lua/warmbox/lock/init.lua.
--
-- One file per key under `dir`, locked with flock(2): the kernel drops the
-- flock when the holder's process dies, at once. File contents: a header line
-- `warmbox-lock 1 <pid> <expires, monotonic s> <token> <0|1> <fence>` then the
-- state. A lock file is removed only by `lk:remove()` (the conversation is
-- gone: release, GC) and by a break (below), both under `dir/.break`
-- (exclusive) while its flock is held, so a locker that flocked the old inode
-- sees it stale and retries; the queue file goes with it when no one is
-- queued. A fence count lost with the file starts again from the clock
-- (warmbox.lock.common's next_fence).
--
-- exptime and hung holders: a holder that is alive but stuck past its expiry
-- (header) may be broken by a waiter. Breaking happens under `dir/.break`
-- (exclusive) and only if the path still names the same file, it is still
-- flock-held and its header is the same expired one; the breaker removes the
-- path, so new lockers use a fresh file (the state is carried over) while the
-- stuck holder keeps a lock on an orphan inode. Every locker, after taking
-- flock, checks under `dir/.break` (shared) that its file is still the one at
-- the path before writing its header, so a break can never race a fresh
-- holder. Expiry uses CLOCK_MONOTONIC (which all processes of a host share)
-- in whole seconds (a lock is breakable once now > expires): a step of the
-- wall clock never lets a second holder in. A holder broken past its expiry
-- is fenced (`lk:fence()`: the next holder's number is higher).
--
-- The queue (warmbox.lock.queue) is the file `<name>q` next to the lock file,
-- read and rewritten under its own flock. A blocking waiter is woken by an
-- inotify watch on the lock file (`core.lock_watch`; the releaser touches the
-- file after its unlock).
local core = require "warmbox.core"
local queue = require "warmbox.lock.queue"
local common = require "warmbox.lock.common"

local os, io, tostring, tonumber, pcall = os, io, tostring, tonumber, pcall
local fmt, min, ceil = string.format, math.min, math.ceil
local now = core.now
local next_fence, now_ms = common.next_fence, common.now_ms
local sh_quote = require("warmbox.util").sh_quote

local _M = {}

-- directories checked private, break-lock handles per dir
local made_dirs, break_locks = {}, {}

--- A safe, injective file name for any key: bytes outside [A-Za-z0-9_-] are
-- %XX-escaped (so no '/', no '.', no '..'); long keys are hashed. The two
-- forms differ by suffix ('.' never appears in an escaped name).
-- syntax: name = lock_file.file_name(key) (`warmbox.lock._file_name` is the same function)
function _M.file_name(key)
  local enc = key:gsub("[^A-Za-z0-9_%-]", function(c) return fmt("%%%02X", c:byte()) end)
  if #enc > 200 then return core.sha256(key) .. ".hlock" end
  return enc .. ".lock"
end
local file_name = _M.file_name

-- The lock directory is used only when it is this user's and no one else
-- may write to it (its files hold sessions' sandbox ids and access tokens):
-- made owner-only when missing, checked once per directory and process.
local function private_dir(dir)
  if made_dirs[dir] then return true end
  if not core.private_dir(dir) then
    os.execute("mkdir -p -m 0700 " .. sh_quote(dir) .. " 2>/dev/null")
  end
  local ok, err, code = core.private_dir(dir)
  if not ok then
    return nil, "lock directory: " .. err .. "; fix: remove it if it is not yours, or give warmbox.lock.new a dir "
      .. "of your own (the default is $XDG_RUNTIME_DIR/warmbox/locks, else ~/.local/state/warmbox/locks)", code
  end
  made_dirs[dir] = true
  return true
end

local function open_in(dir, name)
  local ok, err, code = private_dir(dir)
  if not ok then return nil, err, code end
  return core.flock_open(dir .. "/" .. name)
end

local function nonempty(v) return v ~= nil and v ~= "" and v or nil end

--- The default directory of the file lock, one per user, never shared:
-- `$XDG_RUNTIME_DIR/warmbox/locks` when set, else `$XDG_STATE_HOME/warmbox/locks`,
-- else `~/.local/state/warmbox/locks` (as warmbox.server's state directory):
-- never a name under /tmp that another local user could make first. Only
-- without any of them (no HOME) `/tmp/warmbox-locks-<uid>`, checked as any.
function _M.default_dir()
  local run = nonempty(os.getenv("XDG_RUNTIME_DIR"))
  if run then return run .. "/warmbox/locks" end
  local st = nonempty(os.getenv("XDG_STATE_HOME"))
  if st then return st .. "/warmbox/locks" end
  local home = nonempty(os.getenv("HOME"))
  if home then return home .. "/.local/state/warmbox/locks" end
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

function _M.ns(lk) return "file\0" .. lk.dir .. "\0" end

-- Tries to break a stuck holder's lock on `fl` (see the header comment).
-- Returns true when the path was removed (the caller retries at once).
local function try_break(lk, fl, seen)
  local bl = break_lock(lk.dir)
  if not bl then return false end
  if not bl:lock(min(lk.timeout, 1)) then return false end
  local broke = false
  local stale = fl:stale()
  if stale == false and not fl:try_lock() then
    local cur = parse(fl:read() or "")
    if cur and cur.token == seen.token and cur.expires < now() then
      local name = file_name(seen.key)
      broke = os.remove(lk.dir .. "/" .. name) and true or false
      if broke then
        -- Carry the state over into the fresh file (no one can have written
        -- a header there yet: that needs the break lock we hold).
        local nfl = open_in(lk.dir, name)
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

-- With our flock on `fl`, under the break lock (shared): is our file still
-- the one at the path? Then the header is ours. e | nil, "busy" | nil,
-- "stale" (the caller opens the path again) | nil, msg, code
local function take_file(lk, e, fl)
  local bl = break_lock(lk.dir)
  local shared = bl and bl:lock(1, true)
  if bl and not shared then
    -- a break is in progress (or stuck): report busy, the caller retries
    fl:close()
    return nil, "busy"
  end
  if fl:stale() then
    if shared then bl:unlock() end
    fl:close()
    return nil, "stale"
  end
  local cur = parse(fl:read() or "")
  e.fl, e.state, e.fence = fl, cur and cur.state, next_fence(cur and cur.fence)
  e.expires_at = ceil(now() + lk.exptime)
  local ok, err, code = fl:write(header(e, e.state))
  if shared then bl:unlock() end
  if not ok then
    fl:close()
    return nil, err, code
  end
  return e
end

local function grab(lk, key, e, prev)
  if prev and prev.fl then
    -- This process still holds the flock for an entry that overran its
    -- exptime: take the handle over.
    prev.fl_taken = true
    e.fl, e.state, e.fence = prev.fl, prev.state, next_fence(prev.fence)
    e.expires_at = ceil(now() + lk.exptime)
    local ok, err, code = e.fl:write(header(e, e.state))
    if not ok then return nil, err, code end
    return e
  end
  local name = file_name(key)
  for _ = 1, 8 do
    local fl, err, code = open_in(lk.dir, name)
    if not fl then return nil, err, code end
    local ok
    ok, err, code = fl:try_lock()
    if ok then
      local got
      got, err, code = take_file(lk, e, fl)
      if got or err ~= "stale" then return got, err, code end
    elseif err ~= "busy" then
      fl:close()
      return nil, err, code
    else
      local cur = parse(fl:read() or "")
      local broke = false
      if cur and cur.expires < now() then
        cur.key = key
        broke = try_break(lk, fl, cur)
      end
      fl:close()
      if not broke then return nil, "busy" end
    end
  end
  return nil, "busy"
end

-- A holder whose lock was broken (see the header) finds its file gone from
-- the path: it reports "expired" and never writes into the live file.
local function broken(e)
  return e.fl:stale() ~= false
end

function _M.release(_, _, e)
  if e.fl_taken then return true end
  local was_broken = broken(e) and not e.removed
  e.fl:unlock()
  -- wakes the waiters of other processes (after the unlock: they try at once)
  if e.fl.touch then e.fl:touch() end
  e.fl:close()
  if was_broken then return nil, "expired", "LOCK" end
  return true
end

function _M.expire(lk, _, e, t)
  if broken(e) then return nil, "expired", "LOCK" end
  e.expires_at = ceil(now() + (t or lk.exptime))
  return e.fl:write(header(e, e.state))
end

function _M.get_state(_, _, e) return e.state end

function _M.set_state(_, _, e, s)
  if broken(e) then return nil, "expired", "LOCK" end
  local ok, err, code = e.fl:write(header(e, s))
  if not ok then return nil, err, code end
  e.state = s
  return true
end

-- Runs fn(q) -> changed, ... under the queue file's flock; rewrites the file
-- when changed. A queue lock held for over a second (its holder stopped
-- mid-update) answers nil, "queue busy".
local function with_queue(lk, key, fn)
  -- opened per update (a handle kept per key would hold a descriptor for
  -- every session the process ever saw)
  local qfl, err, code = open_in(lk.dir, file_name(key) .. "q")
  if not qfl then return nil, err, code end
  local ok
  ok, err, code = qfl:lock(1)
  if not ok then
    qfl:close()
    if err == "timeout" then return nil, "queue busy" end
    return nil, err, code
  end
  local q = queue.parse(qfl:read() or "")
  local res = table.pack(pcall(fn, q))
  if res[1] and res[2] then
    -- A lost write costs fairness only (a ticket kept until it lapses), but
    -- a waiter must know: its ticket may not be there.
    local wok, werr, wcode = qfl:write(queue.format(q))
    if not wok and not res[3] then res = { true, false, nil, werr, wcode } end
  end
  qfl:close()
  if not res[1] then error(res[2], 0) end
  return res[3], res[4], res[5], res[6]
end

function _M.acquire(lk, key, e, prev, mode, local_busy)
  local got, err, code, head = with_queue(lk, key, function(q)
    return queue.step(lk, q, e, mode, local_busy, function() return grab(lk, key, e, prev) end)
  end)
  if err == "queue busy" then
    -- A process stopped inside its queue update (SIGSTOP) holds the queue's
    -- flock: stay live, unfairly, by trying the lock itself.
    if local_busy then return nil, "busy" end
    return grab(lk, key, e, prev)
  end
  return got, err, code, head
end

function _M.leave(lk, key, _, token)
  with_queue(lk, key, function(q) return queue.leave(q, token) end)
end

-- lk:remove(): the lock file's path removed (under the break lock, while held),
-- and the queue file when empty. Best effort: a busy break lock leaves them.
function _M.remove(lk, key, e)
  local bl = break_lock(lk.dir)
  if not bl or broken(e) or not bl:lock(min(lk.timeout, 1)) then return end
  local name = file_name(key)
  e.removed = os.remove(lk.dir .. "/" .. name) and true or nil
  bl:unlock()
  -- not under the break lock: lockers take the queue's flock, then the break lock
  with_queue(lk, key, function(q)
    queue.purge(q, now_ms())
    if #q.list == 0 then os.remove(lk.dir .. "/" .. name .. "q") end
    return false
  end)
end

-- A blocking waiter's wake-up: an inotify watch on the lock file (made
-- before the next attempt, so a release after it is never missed).
function _M.blocker(lk, key)
  if not core.lock_watch then return nil end
  local w = core.lock_watch()
  if not w then return nil end
  local path = lk.dir .. "/" .. file_name(key)
  if not w:add(path) then w:close() return nil end
  return function(s)
    w:add(path) -- (again: a removal or break may have replaced the file)
    return w:wait(s)
  end, function() w:close() end, w
end

function _M.keepalive(_, _, e, t)
  e.next_check = t + 1
  if broken(e) then return nil, "expired", "LOCK" end
  return true
end

return _M
