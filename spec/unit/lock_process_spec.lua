-- warmbox.lock (file backend) across real processes: mutual exclusion,
-- a killed holder releases, a hung holder is covered by the timeout and,
-- past its exptime, broken without disturbing the next holder.
local lock = require "warmbox.lock"
local core = require "warmbox.core"

local LUA = "lua5.4"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function read_all(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function write_file(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- The child: lua5.4 child.lua <mode> <dir> <key> <arg1> <arg2> <arg3>
local CHILD = [[
local mode, dir, key, a1, a2, a3 = ...
local lock = require "warmbox.lock"
local core = require "warmbox.core"
if mode == "loop" then
  -- a1 = iterations, a2 = shared log
  local lk = lock.new{ backend = "file", dir = dir, timeout = 120, step = 0.001, max_step = 0.01 }
  local pid = core.getpid()
  for i = 1, tonumber(a1) do
    assert(lk:lock(key))
    local f = assert(io.open(a2, "a")); f:write("enter ", pid, " ", i, "\n"); f:close()
    core.sleep(0.001)
    local g = assert(io.open(a2, "a")); g:write("exit ", pid, " ", i, "\n"); g:close()
    assert(lk:unlock())
  end
  os.exit(0)
elseif mode == "hold" then
  -- a1 = ready file, a2 = exptime, a3 = seconds to hold; then reports unlock's result
  local lk = lock.new{ backend = "file", dir = dir, timeout = 10, exptime = tonumber(a2) }
  assert(lk:lock(key))
  assert(lk:set_state("from-child"))
  local f = assert(io.open(a1, "w")); f:write(core.getpid()); f:close()
  core.sleep(tonumber(a3))
  local ok, err = lk:unlock()
  local g = assert(io.open(a1 .. ".done", "w")); g:write(tostring(ok), " ", tostring(err)); g:close()
  os.exit(0)
elseif mode == "want" then
  -- a1 = log, a2 = name, a3 = timeout: one lock, held 0.05 s; logs the outcome
  local lk = lock.new{ backend = "file", dir = dir, timeout = tonumber(a3) }
  local waited, err = lk:lock(key)
  local f = assert(io.open(a1, "a"))
  f:write(waited and ("got " .. a2) or ("fail " .. a2 .. " " .. tostring(err)), "\n")
  f:close()
  if waited then
    core.sleep(0.05)
    assert(lk:unlock())
  end
  os.exit(0)
elseif mode == "looper" then
  -- a1 = seconds, a2 = stop file: back-to-back lock / 20 ms / unlock
  local lk = lock.new{ backend = "file", dir = dir, timeout = 60 }
  local t_end = core.now() + tonumber(a1)
  local n = 0
  while core.now() < t_end do
    assert(lk:lock(key))
    core.sleep(0.02)
    assert(lk:unlock())
    n = n + 1
  end
  local f = assert(io.open(a2, "w")); f:write(n); f:close()
  os.exit(0)
end
]]

describe("warmbox.lock (file backend) across processes", function()
  local dir, work, child

  local function spawn(args)
    local parts = {}
    for i, a in ipairs(args) do parts[i] = q(a) end
    local env = "LUA_PATH=" .. q(package.path) .. " LUA_PATH_5_4=" .. q(package.path)
      .. " LUA_CPATH=" .. q(package.cpath) .. " LUA_CPATH_5_4=" .. q(package.cpath)
    local p = assert(io.popen(string.format("%s %s %s %s >>%s 2>&1 & echo $!", env, LUA, q(child),
      table.concat(parts, " "), q(work .. "/child.out"))))
    local pid = tonumber(p:read("l"))
    p:close()
    return assert(pid)
  end

  local function alive(pid)
    return os.execute("kill -0 " .. pid .. " 2>/dev/null") == true
  end

  local function wait_for(pred, limit)
    local deadline = core.now() + (limit or 30)
    while not pred() do
      if core.now() > deadline then return false end
      core.sleep(0.01)
    end
    return true
  end

  before_each(function()
    work = os.tmpname()
    os.remove(work)
    assert(os.execute("mkdir -p " .. q(work)))
    dir = work .. "/locks"
    child = work .. "/child.lua"
    write_file(child, CHILD)
  end)

  after_each(function()
    if work and work:match("^/tmp/") then os.execute("rm -rf " .. q(work)) end
  end)

  it("never lets two of 5 processes x 40 iterations hold one key at once", function()
    local N, M = 5, 40
    local log = work .. "/log"
    local pids = {}
    for i = 1, N do pids[i] = spawn{ "loop", dir, "shared/key:é", M, log } end
    assert.is_true(wait_for(function()
      for _, pid in ipairs(pids) do if alive(pid) then return false end end
      return true
    end, 120), "children did not finish")
    local lines = {}
    for l in (read_all(log) or ""):gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(2 * N * M, #lines, read_all(work .. "/child.out"))
    local per = {}
    for i = 1, #lines, 2 do
      local p1, n1 = lines[i]:match("^enter (%d+) (%d+)$")
      local p2, n2 = lines[i + 1]:match("^exit (%d+) (%d+)$")
      assert.truthy(p1, "line " .. i .. " should be an enter: " .. lines[i])
      assert.truthy(p2, "line " .. (i + 1) .. " should be an exit: " .. lines[i + 1])
      assert.equal(p1, p2)
      assert.equal(n1, n2)
      per[p1] = (per[p1] or 0) + 1
    end
    local procs = 0
    for _, c in pairs(per) do
      procs = procs + 1
      assert.equal(M, c)
    end
    assert.equal(N, procs)
  end)

  -- tickets in the key's queue file
  local function queued(key)
    local n = 0
    for _ in (read_all(dir .. "/" .. lock._file_name(key) .. "q") or ""):gmatch("\n%d+ %d+ %d+ %x+") do n = n + 1 end
    return n
  end

  it("serves waiting processes in arrival order", function()
    local holder = lock.new{ backend = "file", dir = dir }
    assert.truthy(holder:lock("k"))
    local log = work .. "/log"
    local pids = {}
    for i = 1, 4 do
      pids[i] = spawn{ "want", dir, "k", log, "w" .. i, 60 }
      assert.is_true(wait_for(function() return queued("k") == i end), read_all(work .. "/child.out"))
    end
    assert.is_true(holder:unlock())
    -- the holder comes back at once: it queues behind the four
    assert.truthy(holder:lock("k"))
    local f = assert(io.open(log, "a"))
    f:write("got holder\n")
    f:close()
    holder:unlock()
    assert.is_true(wait_for(function()
      for _, pid in ipairs(pids) do if alive(pid) then return false end end
      return true
    end))
    assert.equal("got w1\ngot w2\ngot w3\ngot w4\ngot holder\n", read_all(log))
    assert.equal(0, queued("k"))
  end)

  it("drops a killed waiter's ticket after ticket_ttl, so the queue moves on", function()
    local holder = lock.new{ backend = "file", dir = dir }
    assert.truthy(holder:lock("k"))
    local log = work .. "/log"
    local dead = spawn{ "want", dir, "k", log, "dead", 60 }
    assert.is_true(wait_for(function() return queued("k") == 1 end))
    os.execute("kill -KILL " .. dead)
    assert.is_true(wait_for(function() return not alive(dead) end))
    local pid = spawn{ "want", dir, "k", log, "next", 60 }
    assert.is_true(wait_for(function() return queued("k") == 2 end))
    holder:unlock()
    -- the dead ticket is at the head: nobody may take the key until it lapses (5 s)
    assert.same({ nil, "busy" }, { lock.new{ backend = "file", dir = dir }:try_lock("k") })
    assert.is_true(wait_for(function() return not alive(pid) end, 30))
    assert.equal("got next\n", read_all(log))
    assert.equal(0, queued("k"))
  end)

  it("lets 3 processes in while a fourth locks back to back (none times out)", function()
    local stop = work .. "/looper.done"
    local looper = spawn{ "looper", dir, "k", 4, stop }
    assert.is_true(wait_for(function() return queued("k") > 0 or read_all(dir .. "/k.lock") ~= nil end))
    core.sleep(0.3)
    local log = work .. "/log"
    local pids = {}
    -- each may wait at most 2 s: a few of the looper's 20 ms turns, never its 4 s
    for i = 1, 3 do pids[i] = spawn{ "want", dir, "k", log, "w" .. i, 2 } end
    assert.is_true(wait_for(function()
      for _, pid in ipairs(pids) do if alive(pid) then return false end end
      return not alive(looper)
    end, 60))
    local got = {}
    for l in (read_all(log) or ""):gmatch("[^\n]+") do got[#got + 1] = l end
    table.sort(got)
    assert.same({ "got w1", "got w2", "got w3" }, got)
    assert.truthy(tonumber(read_all(stop)) > 10, "the looper kept running")
  end)

  it("is released by the kernel when its holder is killed (SIGKILL)", function()
    local ready = work .. "/ready"
    local pid = spawn{ "hold", dir, "k", ready, 600, 600 }
    assert.is_true(wait_for(function() return read_all(ready) ~= nil end), read_all(work .. "/child.out"))
    local lk = lock.new{ backend = "file", dir = dir, timeout = 0 }
    assert.same({ nil, "timeout" }, { lk:lock("k") })
    os.execute("kill -KILL " .. pid)
    assert.is_true(wait_for(function() return not alive(pid) end))
    lk = lock.new{ backend = "file", dir = dir, timeout = 30 }
    assert.truthy(lk:lock("k"))
    assert.equal("from-child", lk:get_state())
    lk:unlock()
  end)

  it("makes waiters time out while a hung holder (SIGSTOP) is within its exptime", function()
    local ready = work .. "/ready"
    local pid = spawn{ "hold", dir, "k", ready, 600, 600 }
    assert.is_true(wait_for(function() return read_all(ready) ~= nil end), read_all(work .. "/child.out"))
    os.execute("kill -STOP " .. pid)
    local lk = lock.new{ backend = "file", dir = dir, timeout = 0.3 }
    assert.same({ nil, "timeout" }, { lk:lock("k") })
    os.execute("kill -KILL " .. pid .. "; kill -CONT " .. pid)
    assert.is_true(wait_for(function() return not alive(pid) end))
  end)

  it("never lets a second process in on a wall-clock step past a live holder's exptime", function()
    local ready = work .. "/ready"
    local pid = spawn{ "hold", dir, "k", ready, 10, 600 }
    assert.is_true(wait_for(function() return read_all(ready) ~= nil end), read_all(work .. "/child.out"))
    local real_time = os.time
    os.time = function(t) return t and real_time(t) or real_time() + 200 end -- luacheck: ignore 122
    local lk = lock.new{ backend = "file", dir = dir, timeout = 0.3 }
    local got = { lk:lock("k") }
    os.time = real_time -- luacheck: ignore 122
    lk:close()
    os.execute("kill -KILL " .. pid)
    assert.same({ nil, "timeout" }, got)
    assert.is_true(wait_for(function() return not alive(pid) end))
  end)

  it("keeps 4 racing breakers of a hung holder's expired lock mutually exclusive", function()
    local ready = work .. "/ready"
    local hung = spawn{ "hold", dir, "k", ready, 1, 600 }
    assert.is_true(wait_for(function() return read_all(ready) ~= nil end), read_all(work .. "/child.out"))
    os.execute("kill -STOP " .. hung)
    local log = work .. "/log"
    local pids = {}
    for i = 1, 4 do pids[i] = spawn{ "loop", dir, "k", 15, log } end
    assert.is_true(wait_for(function()
      for _, pid in ipairs(pids) do if alive(pid) then return false end end
      return true
    end, 120), "children did not finish")
    os.execute("kill -KILL " .. hung .. "; kill -CONT " .. hung)
    local lines = {}
    for l in (read_all(log) or ""):gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(2 * 4 * 15, #lines, read_all(work .. "/child.out"))
    for i = 1, #lines, 2 do
      local p1, n1 = lines[i]:match("^enter (%d+) (%d+)$")
      local p2, n2 = lines[i + 1]:match("^exit (%d+) (%d+)$")
      assert.truthy(p1 and p2, lines[i] .. " / " .. lines[i + 1])
      assert.equal(p1 .. " " .. n1, p2 .. " " .. n2)
    end
  end)

  it("breaks a hung holder's lock past its exptime; the holder then learns it expired", function()
    local ready = work .. "/ready"
    local pid = spawn{ "hold", dir, "k", ready, 1, 3 }
    assert.is_true(wait_for(function() return read_all(ready) ~= nil end), read_all(work .. "/child.out"))
    os.execute("kill -STOP " .. pid)
    local lk = lock.new{ backend = "file", dir = dir, timeout = 30 }
    assert.truthy(lk:lock("k"))
    -- the state came along, and the fencing count: the hung holder's number is lower
    assert.equal("from-child", lk:get_state())
    assert.is_true(lk:fence() > 0)
    os.execute("kill -CONT " .. pid)
    assert.is_true(wait_for(function() return read_all(ready .. ".done") ~= nil end),
      read_all(work .. "/child.out"))
    assert.equal("nil expired", read_all(ready .. ".done"))
    -- the resumed holder's unlock did not free our lock
    assert.same({ nil, "busy" }, { lock.new{ backend = "file", dir = dir }:try_lock("k") })
    assert.is_true(lk:set_state("mine"))
    assert.is_true(lk:unlock())
    local again = lock.new{ backend = "file", dir = dir, timeout = 0 }
    assert.truthy(again:lock("k"))
    assert.equal("mine", again:get_state())
    again:unlock()
    assert.is_true(wait_for(function() return not alive(pid) end))
  end)
end)
