-- Many conversations at once: one warmboxd with --rtt-ms 20,
-- CONV conversations x RUNS warm runs of a 0.5 s cell, four ways:
--   tasks, one process      wb:spawn per conversation, wb:loop()
--   sequential, one process the same runs one after another
--   one process each        CONV Lua processes, one conversation each
--   reference flow (JS)     the official SDKs, one async flow per
--                           conversation under Promise.all (spec/sdk)
-- Each conversation's sandbox is created and warmed first (untimed; the 32
-- processes wait for each other before their timed runs); wall time spans
-- the first timed run's start to the last one's end. Peak RSS:
-- VmHWM of the process (summed over the processes of "one process each").
--
--   lua5.4 bench/concurrency.lua [CONV] [RUNS]     (after scripts/setup)
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")
local root = env.root

local cjson = require("cjson.safe").new()
local CELL = "import time\ntime.sleep(0.5)\nn = globals().get('n', 0) + 1\nn"

local function vmhwm_kb() return env.status_kb("VmHWM") end

-- Worker mode: `lua5.4 bench/concurrency.lua --worker MODE URL KEY LOCKDIR PREFIX FIRST COUNT RUNS [BARRIER]`
-- prints one JSON line { starts, ends, times, rss_kb }.
if arg[1] == "--worker" then
  local warmbox = require "warmbox"
  local core = require "warmbox.core"
  local mode, url, key, lockdir, prefix = arg[2], arg[3], arg[4], arg[5], arg[6]
  local first, count, runs = tonumber(arg[7]), tonumber(arg[8]), tonumber(arg[9])
  local wb = assert(warmbox.new{ api_url = url, sandbox_url = url, api_key = key,
    lock = { backend = "file", dir = lockdir } })
  local ss = {}
  for i = first, first + count - 1 do
    ss[#ss + 1] = wb:session(prefix .. i)
    assert(ss[#ss]:run("n = 0"))
  end
  -- Barrier: every process has warmed its sessions before any timed run.
  local barrier = arg[10]
  if barrier then
    io.open(barrier .. ".ready." .. first, "w"):close()
    while not io.open(barrier .. ".go") do core.sleep(0.01) end
  end
  local times, t_start, t_end = {}, math.huge, 0
  local function conv(s)
    for _ = 1, runs do
      local t0 = core.now()
      local r, err, code = s:run(CELL)
      local t1 = core.now()
      assert(r, tostring(err) .. " " .. tostring(code))
      times[#times + 1] = (t1 - t0) * 1000
      if t0 < t_start then t_start = t0 end
      if t1 > t_end then t_end = t1 end
    end
  end
  if mode == "tasks" then
    local ts = {}
    for i, s in ipairs(ss) do ts[i] = wb:spawn(conv, s) end
    assert(wb:loop())
    for _, t in ipairs(ts) do assert(t:done() and t:result() == nil and select("#", t:result()) == 0, "task failed") end
  else
    for _, s in ipairs(ss) do conv(s) end
  end
  for i = first, first + count - 1 do wb:release(prefix .. i) end
  wb:close()
  io.write(cjson.encode({ start = t_start, ["end"] = t_end, times = times, rss_kb = vmhwm_kb() }), "\n")
  os.exit(0)
end

local server = require "warmbox.server"
local CONV = tonumber(arg[1]) or 32
local RUNS = tonumber(arg[2]) or 5
local RTT = 20

local bin = env.warmboxd
local srv = assert(server.start{ bin = bin, args = { "--rtt-ms", tostring(RTT) } })
local lockdir = os.tmpname()
os.remove(lockdir)
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function pct(sorted, p)
  return sorted[math.min(#sorted, math.max(1, math.ceil(p / 100 * #sorted)))]
end

local function worker_cmd(mode, prefix, first, count, barrier)
  return table.concat({ "lua5.4", q(arg[0]), "--worker", mode, q(srv.url), q(srv.api_key), q(lockdir), q(prefix),
    first, count, RUNS, barrier and q(barrier) or "" }, " ")
end

local function summarize(label, results)
  local times, t_start, t_end, rss = {}, math.huge, 0, 0
  for _, r in ipairs(results) do
    for _, t in ipairs(r.times) do times[#times + 1] = t end
    if r.start < t_start then t_start = r.start end
    if r["end"] > t_end then t_end = r["end"] end
    rss = rss + r.rss_kb
  end
  table.sort(times)
  local wall = t_end - t_start
  return { label = label, wall = wall, runs = #times, rps = #times / wall, p50 = pct(times, 50), p95 = pct(times, 95),
    rss_mb = rss / 1024 }
end

local function one(mode, label)
  local p = assert(io.popen(worker_cmd(mode, "bench-conc:" .. mode .. ":", 1, CONV) .. " 2>&1"))
  local out = p:read("a")
  p:close()
  local t = cjson.decode(out:match("([^\n]*)\n?$") or "")
  if type(t) ~= "table" then error(label .. " failed:\n" .. out, 0) end
  return summarize(label, { t })
end

local function processes()
  local outs, pipes = {}, {}
  local barrier = os.tmpname()
  for i = 1, CONV do
    outs[i] = os.tmpname()
    pipes[i] = assert(io.popen(worker_cmd("single", "bench-conc:proc:", i, 1, barrier) .. " >" .. outs[i]
      .. " 2>&1; echo $?"))
  end
  -- Start the timed runs together once every process is warm.
  local core = require "warmbox.core"
  local t0 = core.now()
  for i = 1, CONV do
    while not io.open(barrier .. ".ready." .. i) do
      if core.now() - t0 > 300 then error("process " .. i .. " did not get ready", 0) end
      core.sleep(0.02)
    end
  end
  io.open(barrier .. ".go", "w"):close()
  local results = {}
  for i = 1, CONV do
    pipes[i]:read("a")
    pipes[i]:close()
    local f = assert(io.open(outs[i]))
    local out = f:read("a")
    f:close()
    os.remove(outs[i])
    local t = cjson.decode(out:match("([^\n]*)\n?$") or "")
    if type(t) ~= "table" then error("process " .. i .. " failed:\n" .. out, 0) end
    results[#results + 1] = t
  end
  for i = 1, CONV do os.remove(barrier .. ".ready." .. i) end
  os.remove(barrier .. ".go")
  os.remove(barrier)
  return summarize(CONV .. " processes, one each", results)
end

local function reference()
  local cmd = table.concat({ "cd", q(root), "&&", "E2B_API_URL=" .. q(srv.url), "E2B_SANDBOX_URL=" .. q(srv.url),
    "E2B_API_KEY=" .. q(srv.api_key), "E2B_DOMAIN=localhost", "BENCH_CONV=" .. CONV, "BENCH_RUNS=" .. RUNS,
    "timeout 900 node bench/concurrency_ref.mjs 2>&1" }, " ")
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  local t = cjson.decode(out:match("([^\n]*)\n?$") or "")
  if type(t) ~= "table" then return nil, out end
  return summarize("reference flow (JS SDKs, Promise.all)", { t })
end

local ok, err = pcall(function()
  print(string.format("warmboxd %s, --rtt-ms %d, %d conversations x %d warm runs of a 0.5 s cell\n",
    srv.url, RTT, CONV, RUNS))
  local rows = { one("tasks", "tasks, one process"), one("seq", "sequential, one process"), processes() }
  local ref, rerr = reference()
  if ref then rows[#rows + 1] = ref end
  print(string.format("%-40s %8s %8s %8s %8s %12s", "flow", "wall s", "runs/s", "p50 ms", "p95 ms", "peak RSS MB"))
  for _, r in ipairs(rows) do
    print(string.format("%-40s %8.2f %8.1f %8.1f %8.1f %12.1f", r.label, r.wall, r.rps, r.p50, r.p95, r.rss_mb))
  end
  local t, p = rows[1], rows[3]
  print(string.format("\ntasks vs %d processes: %.2fx the wall time, %.2fx the memory", CONV, t.wall / p.wall,
    t.rss_mb / p.rss_mb))
  if ref then
    print(string.format("tasks vs the JS reference: %.2fx the wall time, %.2fx the memory", t.wall / ref.wall,
      t.rss_mb / ref.rss_mb))
  else
    print("\nreference flow skipped or failed (node + spec/sdk/node_modules needed):\n" .. tostring(rerr))
  end
end)
srv:stop()
os.execute("rm -rf " .. q(lockdir))
if not ok then error(err, 0) end
