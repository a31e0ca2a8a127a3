-- bench/lock_queue.lua: queued runs of one conversation.
--   lua5.4 bench/lock_queue.lua          (uses build/; WARMBOX_BUILD_DIR=build-x to change)
--   BENCH_TASKS=5 BENCH_RUNS=20 BENCH_CREATE=1 BENCH_HOLD=0.013 lua5.4 bench/lock_queue.lua
-- TASKS runs of one key queue at once, RUNS each, one after another: a run
-- takes the key's lock (the session's), holds it HOLD s (a warm run) and
-- releases it. On a new key the first holder holds it CREATE s (the sandbox
-- being created) while the others queue; on a warm key nobody does. Prints,
-- per way of waiting, the median and p90 latency (lock wait + hold) of the
-- queued runs (each task's runs after its first, which on a new key waits
-- for the create) on the new key next to the same on the warm key, and
-- their ratio, and the wall time of all the runs. Ways: tasks of one runner (in-process, the lock waits yield
-- to the runner), then TASKS processes with blocking waits on the file lock
-- (and on the redis lock when redis-server is installed), then the same with
-- each process's runs in a runner's task (redis: not woken across
-- processes inside a task, it polls). Also prints the
-- lock's wake-up counters (lock.stats(): polls and wakes of the waits).
dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local lock = require "warmbox.lock"
local core = require "warmbox.core"
local runner = require "warmbox.runner"
local redis_helper = require "spec.helpers.redis"

local TASKS = tonumber(os.getenv("BENCH_TASKS")) or 5
local RUNS = tonumber(os.getenv("BENCH_RUNS")) or 20
local CREATE = tonumber(os.getenv("BENCH_CREATE")) or 1
local HOLD = tonumber(os.getenv("BENCH_HOLD")) or 0.013

local q = require("warmbox.util").sh_quote

local work = os.tmpname()
os.remove(work)
assert(os.execute("mkdir -p " .. q(work)))

local function quantiles(lat)
  table.sort(lat)
  return lat[math.ceil(#lat * 0.5)], lat[math.ceil(#lat * 0.9)]
end

-- One task's (or process's) runs: `new_key` makes the first run of task 1
-- hold for CREATE. Returns the latencies of runs 2..RUNS.
local function runs(lk, key, first_creates, sleep)
  local lat = {}
  for i = 1, RUNS do
    local t0 = core.now()
    assert(lk:lock(key))
    sleep((first_creates and i == 1) and CREATE or HOLD)
    assert(lk:unlock())
    if i > 1 then lat[#lat + 1] = core.now() - t0 end
  end
  return lat
end

local seq = 0
local function in_process(opts, new_key)
  seq = seq + 1
  local key = "queue-" .. seq
  local r = assert(runner.new())
  if not new_key then
    local lk = lock.new(opts)
    assert(lk:lock(key)); assert(lk:unlock())
  end
  local all = {}
  local t0 = core.now()
  for i = 1, TASKS do
    r:spawn(function()
      local lk = lock.new(opts)
      if i > 1 then r.sched:sleep(0.001 * i) end -- task 1 first, the rest queue behind it
      local lat = runs(lk, key, new_key and i == 1, function(s) r.sched:sleep(s) end)
      for _, v in ipairs(lat) do all[#all + 1] = v end
    end)
  end
  assert(r:loop())
  r:close()
  local p50, p90 = quantiles(all)
  return p50, p90, core.now() - t0
end

local CHILD = [[
local backend, dir, port, key, creates, i, runs, create, hold, out, in_task = ...
local lock = require "warmbox.lock"
local core = require "warmbox.core"
local lk = lock.new{ backend = backend, dir = dir, redis = { port = tonumber(port), prefix = "lq:" }, timeout = 120 }
if tonumber(i) > 1 then core.sleep(0.05 + 0.01 * tonumber(i)) end
local lat = {}
local r = in_task == "1" and assert(require("warmbox.runner").new())
local sleep = r and function(s) r.sched:sleep(s) end or core.sleep
local function all()
  for n = 1, tonumber(runs) do
    local t0 = core.now()
    assert(lk:lock(key))
    sleep((creates == "1" and n == 1) and tonumber(create) or tonumber(hold))
    assert(lk:unlock())
    if n > 1 then lat[#lat + 1] = string.format("%.6f", core.now() - t0) end
  end
end
if r then r:spawn(all); assert(r:loop()) else all() end
local s = lock.stats and lock.stats() or {}
local f = assert(io.open(out, "w"))
f:write(string.format("%d %d\n", s.polls or 0, s.wakes or 0), table.concat(lat, " "))
f:close()
]]

local function processes(backend, port, new_key, in_task)
  seq = seq + 1
  local key = "queue-" .. seq .. "-" .. os.time()
  local child = work .. "/child.lua"
  local f = assert(io.open(child, "w"))
  f:write(CHILD)
  f:close()
  local opts = { backend = backend, dir = work .. "/locks", redis = { port = port, prefix = "lq:" } }
  if not new_key then
    local lk = lock.new(opts)
    assert(lk:lock(key)); assert(lk:unlock())
  end
  local env = "LUA_PATH=" .. q(package.path) .. " LUA_CPATH=" .. q(package.cpath)
  local cmd = {}
  for i = 1, TASKS do
    cmd[i] = string.format("%s lua5.4 %s %s %s %d %s %s %d %d %g %g %s %s &", env, q(child), backend,
      q(work .. "/locks"), port or 0, key, (new_key and i == 1) and "1" or "0", i, RUNS, CREATE, HOLD,
      q(work .. "/out" .. i), in_task and "1" or "0")
  end
  local t0 = core.now()
  assert(os.execute(table.concat(cmd, " ") .. " wait"))
  local wall = core.now() - t0
  local all, polls, wakes = {}, 0, 0
  for i = 1, TASKS do
    local g = assert(io.open(work .. "/out" .. i))
    local p, w = g:read("n", "n")
    polls, wakes = polls + p, wakes + w
    for v in g:read("a"):gmatch("%S+") do all[#all + 1] = tonumber(v) end
    g:close()
  end
  local p50, p90 = quantiles(all)
  return p50, p90, wall, polls, wakes
end

-- n, w: { p50, p90, wall } of the new and the warm key
local function report(name, n, w, extra)
  print(string.format("%-31s new key p50 %6.1f ms p90 %6.1f ms, all %5.2f s | warm key p50 %6.1f ms p90 %6.1f ms, "
    .. "all %5.2f s | new/warm p50 %.2fx%s", name, n[1] * 1000, n[2] * 1000, n[3], w[1] * 1000, w[2] * 1000, w[3],
    n[1] / w[1], extra or ""))
end

print(string.format("queued runs: %d tasks x %d runs, hold %g s, create %g s (%s)", TASKS, RUNS, HOLD, CREATE,
  core.module_path()))
local function counters()
  local s = lock.stats and lock.stats()
  return s and string.format("  (polls %d, wakes %d)", s.polls, s.wakes) or ""
end
do
  local opts = { backend = "file", dir = work .. "/locks", timeout = 120 }
  report("runner tasks, file lock", { in_process(opts, true) }, { in_process(opts, false) }, counters())
  local mopts = { backend = "memory", timeout = 120 }
  report("runner tasks, memory lock", { in_process(mopts, true) }, { in_process(mopts, false) }, counters())
end
local function procs(backend, port, in_task)
  local n50, n90, nwall, p1, k1 = processes(backend, port, true, in_task)
  local w50, w90, wwall, p2, k2 = processes(backend, port, false, in_task)
  report(string.format("%d processes%s, %s lock", TASKS, in_task and " (tasks)" or "", backend),
    { n50, n90, nwall }, { w50, w90, wwall }, string.format("  (polls %d, wakes %d)", p1 + p2, k1 + k2))
end
procs("file")
procs("file", nil, true)
if redis_helper.available() then
  local srv = redis_helper.start()
  local ok, err = pcall(function()
    procs("redis", srv.port)
    procs("redis", srv.port, true)
  end)
  srv:stop()
  if not ok then print("redis bench failed: " .. tostring(err)) end
else
  print("redis-server not found: redis rows skipped")
end
os.execute("rm -rf " .. q(work))
