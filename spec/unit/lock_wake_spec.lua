-- Lock waiters are woken by a release, not by their backoff: in one process
-- (runner tasks) and across processes (blocking
-- waits on the file and redis locks). A waiter that is not the queue's head
-- sleeps steps of 5 s here: it gets the lock after the release with none
-- of its waits run to the end (lk:wait_counts(): polls 0, wakes >= 1).
local lock = require "warmbox.lock"
local core = require "warmbox.core"
local runner = require "warmbox.runner"
local redis_ha = require "spec.helpers.redis_ha"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- (the head polls every 5 s too: any wait that ran to its end is a missed wake-up)
local SLOW = { step = 5, max_step = 5, head_step = 5, ticket_ttl = 60, timeout = 60 }

local function with(base, extra)
  local o = {}
  for k, v in pairs(base) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

local work
setup(function()
  work = os.tmpname()
  os.remove(work)
  assert(os.execute("mkdir -p " .. q(work)))
end)
teardown(function()
  if work and work:match("^/tmp/") then os.execute("rm -rf " .. q(work)) end
end)

describe("lock wake-up, in one process (runner tasks)", function()
  for _, backend in ipairs{ "memory", "file" } do
    it(backend .. ": the second waiter gets the lock when it is released, without sleeping its 5 s step", function()
      local r = assert(runner.new())
      local key = "wake-" .. backend .. "-" .. core.getpid()
      local opts = { backend = backend, dir = work .. "/locks" }
      local order, b_lock = {}, nil
      r:spawn(function()
        local lk = lock.new(opts)
        assert(lk:lock(key))
        r.sched:sleep(0.05)
        order[#order + 1] = "holder out"
        assert(lk:unlock())
      end)
      r:spawn(function() -- A: the head
        local lk = lock.new(with(opts, SLOW))
        assert(lk:lock(key))
        order[#order + 1] = "A in"
        assert(lk:unlock())
      end)
      r:spawn(function() -- B: behind A
        b_lock = lock.new(with(opts, SLOW))
        assert(b_lock:lock(key))
        order[#order + 1] = "B in"
        assert(b_lock:unlock())
      end)
      local before = lock.stats()
      assert(r:loop())
      r:close()
      assert.same({ "holder out", "A in", "B in" }, order)
      local polls, wakes = b_lock:wait_counts()
      assert.equal(0, polls)
      assert.is_true(wakes >= 1)
      assert.is_true(lock.stats().wakes >= before.wakes + 1)
    end)
  end
end)

-- Child processes: "hold" takes the lock, writes <dir>/held, waits for
-- <dir>/go, releases; "head" waits for <dir>/held, queues (default steps),
-- takes the lock and releases it at once.
local CHILD = [[
local mode, backend, dir, ropts, key = ...
local lock = require "warmbox.lock"
local core = require "warmbox.core"
local lk = lock.new{ backend = backend, dir = dir .. "/locks", redis = assert(load("return " .. ropts))(),
                     timeout = 60 }
local function exists(p) local f = io.open(p) if f then f:close() end return f ~= nil end
if mode == "hold" then
  assert(lk:lock(key))
  io.open(dir .. "/held", "w"):close()
  while not exists(dir .. "/go") do core.sleep(0.005) end
  assert(lk:unlock())
else
  while not exists(dir .. "/held") do core.sleep(0.005) end
  assert(lk:lock(key))
  assert(lk:unlock())
end
]]

local function queued(backend, t, key, dir)
  if backend == "file" then
    local f = io.open(dir .. "/locks/" .. lock._file_name(key) .. "q")
    if not f then return 0 end
    local n = select(2, f:read("a"):gsub("\n", "")) - 1
    f:close()
    return n
  end
  return t:call(key, "ZCARD", t:name("wake:", "queue", key))
end

local runs = 0
-- t: the Redis topology (spec.helpers.redis_ha) for backend "redis"
local function across(backend, t, in_task)
  runs = runs + 1
  local dir = work .. "/" .. backend .. "-" .. runs
  assert(os.execute("mkdir -p " .. q(dir)))
  local child = dir .. "/child.lua"
  local f = assert(io.open(child, "w"))
  f:write(CHILD)
  f:close()
  local key = "wake-across-" .. backend .. "-" .. runs .. "-" .. os.time()
  local env = "LUA_PATH=" .. q(package.path) .. " LUA_CPATH=" .. q(package.cpath)
  for _, mode in ipairs{ "hold", "head" } do
    assert(os.execute(string.format("%s lua5.4 %s %s %s %s %s %s >>%s 2>&1 &", env, q(child), mode, backend,
      q(dir), q(t and t:lua_opts("wake:") or "{}"), key, q(dir .. "/log"))))
  end
  -- wait until the head child has queued (its ticket is in the queue)
  local deadline = core.now() + 30
  while queued(backend, t, key, dir) < 1 do
    assert(core.now() < deadline, "the head child never queued")
    core.sleep(0.01)
  end
  local go = false
  local lk = lock.new(with({ backend = backend, dir = dir .. "/locks",
    redis = t and t:opts("wake:") or nil }, with(SLOW, {
    -- the default blocking wait; the holder is told to release once we are queued
    wait = function(s, waker)
      if not go then
        go = true
        io.open(dir .. "/go", "w"):close()
      end
      return lock.wait(s, waker)
    end })))
  if in_task then
    local r = assert(runner.new())
    r:spawn(function()
      assert(lk:lock(key))
      assert(lk:unlock())
    end)
    assert(r:loop())
    r:close()
  else
    assert(lk:lock(key))
    assert(lk:unlock())
  end
  return lk:wait_counts()
end

describe("lock wake-up, across processes (blocking waits)", function()
  it("file: the waiter behind the head gets the lock after the release without sleeping its step", function()
    local polls, wakes = across("file")
    assert.equal(0, polls)
    assert.is_true(wakes >= 1)
  end)

  it("file: a waiter in a runner's task is woken too (the watch is in the engine's poll)", function()
    local polls, wakes = across("file", nil, true)
    assert.equal(0, polls)
    assert.is_true(wakes >= 1)
  end)

  for _, kind in ipairs(redis_ha.kinds()) do
    it("redis (" .. kind .. "): the waiter behind the head is woken through its wake list", function()
      local t = redis_ha.start(kind)
      local ok, polls, wakes = pcall(across, "redis", t)
      t:stop()
      assert(ok, polls)
      assert.equal(0, polls)
      assert.is_true(wakes >= 1)
    end)
  end
  if #redis_ha.kinds() == 0 then pending("redis-server is not installed") end
end)
