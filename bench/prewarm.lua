-- What s:prewarm hides: the run's latency with and without a
-- prewarm at the start of each turn, against one warmboxd that takes 1 s to
-- resume a paused sandbox and 0.5 s to create one, every request paying 20 ms
-- (`--rtt-ms 20 --resume-ms 1000 --create-ms 500`).
--
--   lua5.4 bench/prewarm.lua [CONVERSATIONS [TURNS]]     (default 20 and 5; after scripts/setup)
--
-- Two groups of CONVERSATIONS conversations run side by side as tasks of one
-- process (one with a prewarm at the start of every turn, one without), each
-- starting at a random offset in [0, SPREAD) s (SPREAD = 1.5 s per pair, so
-- that warmboxd is not asked to start 2 x CONVERSATIONS kernels at once). A turn starts, the model "thinks"
-- THINK = 2 s, then the turn's run comes (`x += 1; x`), timed; right after
-- it a second run of the same conversation is timed as a warm run (sandbox
-- running, lease fresh: the default configuration's one round trip). Turn 1
-- is a new conversation (create on some path); before every later turn the
-- sandbox is paused and the session's clock jumps past its lease, as E2B
-- leaves a conversation idle longer than idle_timeout. Default configuration
-- (exec_timeout = idle_timeout = 300). Prints p50/p95 per case and the ratio
-- of the prewarmed runs' p95 to the warm runs' p95 (goal: within 1.5x).
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local warmbox = require "warmbox"
local session = require "warmbox.session"
local server = require "warmbox.server"
local core = require "warmbox.core"

local N = tonumber(arg and arg[1]) or 20
local TURNS = tonumber(arg and arg[2]) or 5
local THINK = 2
local RTT, RESUME, CREATE = 20, 1000, 500

local bin = env.warmboxd
local srv = assert(server.start{ bin = bin, args = { "--rtt-ms", tostring(RTT), "--resume-ms", tostring(RESUME),
  "--create-ms", tostring(CREATE) } })
local lockdir = os.tmpname()
os.remove(lockdir)
local wb = assert(warmbox.new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key,
  lock = { backend = "file", dir = lockdir }, exec_timeout = 300, idle_timeout = 300 })
local sched = (function() wb:spawn(function() end); assert(wb:loop()); return wb.runner.sched end)()

local function pct(sorted, p)
  return sorted[math.min(#sorted, math.max(1, math.ceil(p / 100 * #sorted)))]
end

-- samples[case] = { ms, ... }
local samples = { warm = {}, paused_none = {}, paused_prewarm = {}, new_none = {}, new_prewarm = {} }
local failures = 0

local function timed_run(s, case)
  local t0 = core.now()
  local r, err, code = s:run("x += 1\nx")
  local ms = (core.now() - t0) * 1000
  if not r then
    failures = failures + 1
    io.stderr:write(string.format("run failed (%s): %s %s\n", case, tostring(err), tostring(code)))
    return nil
  end
  local list = samples[case]
  list[#list + 1] = ms
  return r
end

local keys = {}
local function conversation(i, prewarm, start)
  -- The session's clock: real time, plus the idle periods skipped between turns.
  local skipped = 0
  local key = string.format("bench-prewarm:%s-%d", prewarm and "p" or "n", i)
  keys[#keys + 1] = key
  local s = session.new(key, { client = wb.client, lock = { backend = "file", dir = lockdir },
    exec_timeout = 300, idle_timeout = 300, parallel = wb.parallel, origin = wb.origin, counters = wb.counters,
    clock = function() return os.time() + skipped end,
    runner = wb.runner })
  sched:sleep(start)
  for turn = 1, TURNS do
    if prewarm then s:prewarm() end
    sched:sleep(THINK)
    local case = (turn == 1 and "new_" or "paused_") .. (prewarm and "prewarm" or "none")
    if turn == 1 then
      -- the first cell of a conversation defines x
      local t0 = core.now()
      local r = s:run("x = 1\nx")
      if r then samples[case][#samples[case] + 1] = (core.now() - t0) * 1000 else failures = failures + 1 end
    else
      timed_run(s, case)
    end
    local r = timed_run(s, "warm")
    if r and turn < TURNS then
      -- Idle past the lease: E2B pauses the sandbox (done by hand here, untimed).
      assert(wb.client:pause(r.sandbox_id))
      skipped = skipped + 300 + 60
    end
  end
end

math.randomseed(16)
local t_start = core.now()
local SPREAD = 1.5 * N
for i = 1, N do
  wb:spawn(conversation, i, true, math.random() * SPREAD)
  wb:spawn(conversation, i, false, math.random() * SPREAD)
end
assert(wb:loop())
local wall = core.now() - t_start

local rows = {
  { "warm run (sandbox running, lease fresh)", "warm" },
  { "paused, no prewarm (the execute resumes it)", "paused_none" },
  { "paused, prewarmed 2 s before the run", "paused_prewarm" },
  { "new conversation, no prewarm", "new_none" },
  { "new conversation, prewarmed 2 s before the run", "new_prewarm" },
}
print(string.format("bench/prewarm.lua: %d + %d conversations x %d turns, think %d s, warmboxd --rtt-ms %d "
  .. "--resume-ms %d --create-ms %d; wall %.1f s", N, N, TURNS, THINK, RTT, RESUME, CREATE, wall))
print("")
print("| run | runs | p50 ms | p95 ms |")
print("|---|---|---|---|")
local p95 = {}
for _, row in ipairs(rows) do
  local list = samples[row[2]]
  table.sort(list)
  p95[row[2]] = pct(list, 95)
  print(string.format("| %s | %d | %.1f | %.1f |", row[1], #list, pct(list, 50) or 0 / 0, pct(list, 95) or 0 / 0))
end
print("")
local st = wb:stats()
print(string.format("prewarms %d: ready %d, warm %d, busy %d, failed %d; runs that waited for one %d; "
  .. "failed runs %d", st.prewarms, st.prewarm_ready, st.prewarm_warm, st.prewarm_busy, st.prewarm_failed,
  st.prewarm_waits, failures))
print(string.format("p95 paused+prewarm / p95 warm = %.2fx (goal <= 1.5x); p95 paused without prewarm / warm = "
  .. "%.2fx", p95.paused_prewarm / p95.warm, p95.paused_none / p95.warm))
print(string.format("p95 new+prewarm / p95 warm = %.2fx; p95 new without prewarm / warm = %.2fx",
  p95.new_prewarm / p95.warm, p95.new_none / p95.warm))

for _, key in ipairs(keys) do wb:release(key) end
wb:close()
srv:stop()
os.execute("rm -rf '" .. lockdir .. "'")
