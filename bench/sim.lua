-- bench/sim.lua: the simulator at a production size.
--   lua5.4 bench/sim.lua                              (uses build/; WARMBOX_BUILD_DIR=build-x to change)
--   BENCH_CONVS=100000 BENCH_TURNS=10 lua5.4 bench/sim.lua
--   BENCH_EXACT=1 BENCH_CONVS=2000 lua5.4 bench/sim.lua (the exact path: the real warmbox.session code)
--   BENCH_PROFILE=1 BENCH_EXACT=1 lua5.4 bench/sim.lua (exact path: where the wall time goes, one
--                                                     conversation of BENCH_CONVS * BENCH_TURNS turns)
-- Simulates BENCH_CONVS conversations (Poisson arrivals over BENCH_SPAN
-- seconds, BENCH_TURNS turns each, exponential gaps of mean 300 s, 2 s cells)
-- with warmbox's default policy and a GC pass every hour, on the fast path
-- (warmbox.sim.fast: the session's decisions and GC's, with the same policy
-- hooks, played on the virtual-time model) unless BENCH_EXACT=1. Prints
-- simulated runs per second of wall time and of CPU time, the wall and CPU
-- time, and the peak memory: the process's peak RSS (VmHWM; nothing samples
-- the Lua heap while it runs: a count hook would slow every VM instruction by
-- a third), and the Lua heap at the end.
local build = os.getenv("WARMBOX_BUILD_DIR") or "build"
package.path = "lua/?.lua;lua/?/init.lua;./?.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local core = require "warmbox.core"
local sim = require "warmbox.sim"

local CONVS = tonumber(os.getenv("BENCH_CONVS")) or 100000
local TURNS = tonumber(os.getenv("BENCH_TURNS")) or 10
local SPAN = tonumber(os.getenv("BENCH_SPAN")) or 86400
local EXACT = os.getenv("BENCH_EXACT") == "1"
local PROFILE = EXACT and os.getenv("BENCH_PROFILE") == "1"

local function vm_hwm_mib()
  local f = io.open("/proc/self/status")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  local kb = text:match("VmHWM:%s*(%d+)")
  return kb and tonumber(kb) / 1024
end

-- Where the time goes: wall time inside Session:run (the real session code
-- plus the model calls it makes) and inside the model's methods.
local spent = { session = 0, model = 0 }
if PROFILE then
  local now = core.now
  local session = require "warmbox.session"
  local model = require "warmbox.sim.model"
  local probe = session.new("probe", { client = model.new(), lock = require("warmbox.sim.lock").factory() })
  local S = getmetatable(probe).__index
  local run = S.run
  S.run = function(...)
    local t = now()
    local a, b, c = run(...)
    spent.session = spent.session + now() - t
    return a, b, c
  end
  local depth = 0
  for _, cls in ipairs{ model.Model, model.Sandbox } do
    for name, fn in pairs(cls) do
      if type(fn) == "function" and not name:match("^__") and name ~= "clock" and name ~= "list" then
        cls[name] = function(...)
          depth = depth + 1
          local t = now()
          local a, b, c = fn(...)
          depth = depth - 1
          if depth == 0 then spent.model = spent.model + now() - t end
          return a, b, c
        end
      end
    end
  end
end

local w = { sessions = CONVS, turns = TURNS, gap = 300, duration = 2, span = SPAN, arrival = "poisson", seed = 7 }
if PROFILE then w.sessions, w.turns = 1, CONVS * TURNS end
io.write(string.format("simulating %d conversations x %d turns (Poisson arrivals over %g s, gaps exp(300 s), "
  .. "2 s cells), default policy, GC every hour, %s path\n", CONVS, TURNS, SPAN, EXACT and "exact" or "fast"))
io.flush()
local t0, c0 = core.now(), os.clock()
local r = assert(sim.run{ workload = w, tail = 0, exact = EXACT })
local wall, cpu = core.now() - t0, os.clock() - c0
local kb = collectgarbage("count")

io.write(string.format("runs %d (ok %d, failed %d), simulated %.1f h\n", r.runs, r.ok, r.failed,
  r.simulated_seconds / 3600))
io.write(string.format("wall %.2f s (CPU %.2f s), %.0f simulated runs/s of wall time (%.0f per CPU second)\n",
  wall, cpu, r.runs / wall, r.runs / cpu))
io.write(string.format("peak RSS (VmHWM) %.0f MiB, Lua heap at the end %.0f MiB\n", vm_hwm_mib() or -1, kb / 1024))
io.write(string.format("cold %d, resumes %d, warm %d, gc passes %d, gc kills %d, peak running %d\n",
  r.cold_starts, r.resumes, r.warm_hits, r.gc_passes, r.gc_kills, r.peak_running))

if PROFILE then
  io.write(string.format("wall inside Session:run %.2f s (of which model calls %.2f s); outside it (scheduler, "
    .. "GC passes, workload, books) %.2f s\n", spent.session, spent.model, wall - spent.session))
end
