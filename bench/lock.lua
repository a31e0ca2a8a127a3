-- bench/lock.lua: warmbox.lock throughput.
--   lua5.4 bench/lock.lua                 (uses build/; WARMBOX_BUILD_DIR=build-x to change)
--   BENCH_N=20000 BENCH_PROCS=4 lua5.4 bench/lock.lua
-- Prints, per backend: uncontended lock+unlock pairs per second in one
-- process (and with a set_state each time), then the total rate of 4
-- processes hammering one key (contention). The redis rows need
-- redis-server (started on a free loopback port and stopped afterwards).
local build = os.getenv("WARMBOX_BUILD_DIR") or "build"
package.path = "lua/?.lua;lua/?/init.lua;./?.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local lock = require "warmbox.lock"
local core = require "warmbox.core"
local redis_helper = require "spec.helpers.redis"

local N = tonumber(os.getenv("BENCH_N")) or 20000
local PROCS = tonumber(os.getenv("BENCH_PROCS")) or 4
local PER_PROC = tonumber(os.getenv("BENCH_PER_PROC")) or 2000

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

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

local CHILD = [[
local backend, dir, port, n, out = ...
local lock = require "warmbox.lock"
local core = require "warmbox.core"
local lk = lock.new{ backend = backend, dir = dir, redis = { port = tonumber(port) }, timeout = 300,
                     step = 0.0005, max_step = 0.005 }
local t0 = core.now()
for _ = 1, tonumber(n) do
  assert(lk:lock("contended"))
  assert(lk:unlock())
end
local f = assert(io.open(out, "w")); f:write(core.now() - t0); f:close()
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
  return PROCS * PER_PROC / wall, wall
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
local r, wall = contended("file")
row(string.format("file contended, %d procs", PROCS), r, string.format("(%.2fs wall)", wall))

if redis_helper.available() then
  local srv = redis_helper.start()
  local ok, err = pcall(function()
    local ro = { backend = "redis", redis = { port = srv.port } }
    row("redis lock+unlock", uncontended(ro))
    row("redis lock+set_state+unlock", uncontended(ro, true))
    local rr, w = contended("redis", srv.port)
    row(string.format("redis contended, %d procs", PROCS), rr, string.format("(%.2fs wall)", w))
  end)
  srv:stop()
  if not ok then print("redis bench failed: " .. tostring(err)) end
else
  print("redis-server not found: redis rows skipped")
end
os.execute("rm -rf " .. q(work))
