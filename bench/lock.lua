-- bench/lock.lua: warmbox.lock throughput.
--   lua5.4 bench/lock.lua                 (uses build/; WARMBOX_BUILD_DIR=build-x to change)
--   BENCH_N=20000 BENCH_PROCS=4 lua5.4 bench/lock.lua
-- Prints, per backend: uncontended lock+unlock pairs per second in one
-- process (and with a set_state each time), keepalive() calls per second
-- while held, then the total rate of 4 processes hammering one key
-- (contention) with the fairness figures: the longest and the 99th
-- percentile wait of one lock() and the spread of the processes' finish
-- times. The redis rows need redis-server (started on a free loopback port
-- and stopped afterwards).
dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local lock = require "warmbox.lock"
local core = require "warmbox.core"
local redis_helper = require "spec.helpers.redis"

local N = tonumber(os.getenv("BENCH_N")) or 20000
local PROCS = tonumber(os.getenv("BENCH_PROCS")) or 4
local PER_PROC = tonumber(os.getenv("BENCH_PER_PROC")) or 2000

local q = require("warmbox.util").sh_quote

local work = os.tmpname()
os.remove(work)
assert(os.execute("mkdir -p " .. q(work)))

local function uncontended(opts, with_state)
  local lk = lock.new(opts)
  local key = "bench-key"
  for _ = 1, 100 do assert(lk:lock(key)); lk:unlock() end -- warm up
  local t0 = core.now()
  for i = 1, N do
    assert(lk:lock(key))
    if with_state then assert(lk:set_state("state " .. i)) end
    assert(lk:unlock())
  end
  return N / (core.now() - t0)
end

local function keepalives(opts)
  local lk = lock.new(opts)
  assert(lk:lock("bench-keepalive"))
  local t0 = core.now()
  for _ = 1, N * 10 do assert(lk:keepalive()) end
  local rate = N * 10 / (core.now() - t0)
  assert(lk:unlock())
  return rate
end

local CHILD = [[
local backend, dir, port, n, out = ...
local lock = require "warmbox.lock"
local core = require "warmbox.core"
local lk = lock.new{ backend = backend, dir = dir, redis = { port = tonumber(port) }, timeout = 300,
                     step = 0.0005, max_step = 0.005 }
local waits = {}
local t0 = core.now()
for i = 1, tonumber(n) do
  waits[i] = assert(lk:lock("contended"))
  assert(lk:unlock())
end
local t1 = core.now()
table.sort(waits)
local f = assert(io.open(out, "w"))
f:write(string.format("%.6f %.6f %.6f %.6f", t1 - t0, waits[#waits], waits[math.ceil(#waits * 0.99)], t1))
f:close()
]]

local function contended(backend, port)
  local child = work .. "/child.lua"
  local f = assert(io.open(child, "w"))
  f:write(CHILD)
  f:close()
  local env = "LUA_PATH=" .. q(package.path) .. " LUA_PATH_5_4=" .. q(package.path)
      .. " LUA_CPATH=" .. q(package.cpath) .. " LUA_CPATH_5_4=" .. q(package.cpath)
  local cmd = {}
  for i = 1, PROCS do
    cmd[i] = string.format("%s lua5.4 %s %s %s %d %d %s &", env, q(child), backend, q(work .. "/locks"),
      port or 0, PER_PROC, q(work .. "/out" .. i))
  end
  local t0 = core.now()
  assert(os.execute(table.concat(cmd, " ") .. " wait"))
  local wall = core.now() - t0
  local max_wait, p99, first_end, last_end = 0, 0, math.huge, 0
  for i = 1, PROCS do
    local g = assert(io.open(work .. "/out" .. i))
    local _, mx, p, t_end = g:read("a"):match("(%S+) (%S+) (%S+) (%S+)")
    g:close()
    max_wait, p99 = math.max(max_wait, tonumber(mx)), math.max(p99, tonumber(p))
    first_end, last_end = math.min(first_end, tonumber(t_end)), math.max(last_end, tonumber(t_end))
  end
  return PROCS * PER_PROC / wall, string.format("(%.2fs wall; longest wait %.1f ms, worst p99 %.1f ms, "
    .. "finish spread %.0f ms)", wall, max_wait * 1000, p99 * 1000, (last_end - first_end) * 1000)
end

-- One process locks back to back (20 ms holds) for 3 s; 3 others each want
-- the key once, 0.5 s in: their waits (the issue's starvation case).
local STARVE = [[
local backend, dir, port, mode, out = ...
local lock = require "warmbox.lock"
local core = require "warmbox.core"
local lk = lock.new{ backend = backend, dir = dir, redis = { port = tonumber(port), prefix = "starve:" }, timeout = 30 }
if mode == "looper" then
  local t_end = core.now() + 3
  while core.now() < t_end do
    assert(lk:lock("starve")); core.sleep(0.02); assert(lk:unlock())
  end
else
  core.sleep(0.5)
  local waited, err = lk:lock("starve")
  local f = assert(io.open(out, "w")); f:write(waited and string.format("%.6f", waited) or ("fail " .. err)); f:close()
  if waited then lk:unlock() end
end
]]

local function starvation(backend, port)
  local child = work .. "/starve.lua"
  local f = assert(io.open(child, "w"))
  f:write(STARVE)
  f:close()
  local env = "LUA_PATH=" .. q(package.path) .. " LUA_CPATH=" .. q(package.cpath)
  local cmd = {}
  for i = 0, 3 do
    cmd[#cmd + 1] = string.format("%s lua5.4 %s %s %s %d %s %s &", env, q(child), backend, q(work .. "/locks"),
      port or 0, i == 0 and "looper" or "want", q(work .. "/starve" .. i))
  end
  assert(os.execute(table.concat(cmd, " ") .. " wait"))
  local waits = {}
  for i = 1, 3 do
    local g = assert(io.open(work .. "/starve" .. i))
    local v = g:read("a")
    g:close()
    waits[i] = tonumber(v) and string.format("%.0f ms", tonumber(v) * 1000) or v
  end
  return table.concat(waits, ", ")
end

local rows = {}
local function row(name, rate, note)
  rows[#rows + 1] = string.format("%-34s %12.0f ops/s%s", name, rate, note and ("  " .. note) or "")
  print(rows[#rows])
end

print(string.format("warmbox.lock bench: N=%d uncontended, %d procs x %d contended (%s)", N, PROCS, PER_PROC,
  core.module_path()))
row("memory lock+unlock", uncontended{ backend = "memory" })
row("memory lock+set_state+unlock", uncontended({ backend = "memory" }, true))
row("file lock+unlock", uncontended{ backend = "file", dir = work .. "/locks" })
row("file lock+set_state+unlock", uncontended({ backend = "file", dir = work .. "/locks" }, true))
row("memory keepalive", keepalives{ backend = "memory" })
row("file keepalive", keepalives{ backend = "file", dir = work .. "/locks" })
local r, note = contended("file")
row(string.format("file contended, %d procs", PROCS), r, note)
print(string.format("%-34s %s", "file: 3 waits vs a looper (20 ms)", starvation("file")))

if redis_helper.available() then
  local srv = redis_helper.start()
  local ok, err = pcall(function()
    local ro = { backend = "redis", redis = { port = srv.port } }
    row("redis lock+unlock", uncontended(ro))
    row("redis lock+set_state+unlock", uncontended(ro, true))
    row("redis lock+unlock, keeper = false", uncontended{ backend = "redis", redis = { port = srv.port },
      keeper = false })
    row("redis keepalive (keeper thread)", keepalives(ro))
    row("redis keepalive (keeper = false)", keepalives{ backend = "redis", redis = { port = srv.port },
      keeper = false })
    local rr, w = contended("redis", srv.port)
    row(string.format("redis contended, %d procs", PROCS), rr, w)
    print(string.format("%-34s %s", "redis: 3 waits vs a looper (20 ms)", starvation("redis", srv.port)))
  end)
  srv:stop()
  if not ok then print("redis bench failed: " .. tostring(err)) end
else
  print("redis-server not found: redis rows skipped")
end
os.execute("rm -rf " .. q(work))
