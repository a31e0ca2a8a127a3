-- Warm-run cost: warmbox vs the reference flow (official JS SDKs), against one
-- warmboxd with --rtt-ms 20 (every request pays 20 ms).
--
--   lua5.4 bench/session.lua [RUNS]          (after scripts/setup)
--   WARMBOX_BUILD_DIR=build-x lua5.4 bench/session.lua
--
-- Prints round trips per warm run (from warmboxd's request counters) and the
-- p50/p95 latency of a warm run, for:
--   warmbox, lease covers the run   steady state: one request (the run itself)
--   warmbox, default config         exec_timeout = idle_timeout = 300: the lease is the idle
--                                   window, refreshed (alongside the execute) only once half
--                                   of it is gone (the session's clock moves 2 s per run)
--   warmbox, paused before each run the sandbox is paused by hand (untimed) before every
--                                   run: the execute resumes it (autoResume: a 300 s lease,
--                                   the idle window's); the watchdog extends it only for a long cell
--   reference flow (JS SDKs)         list, connect, setTimeout, exists, remove, makeDir, runCode, list
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")
local root = env.root

local warmbox = require "warmbox"
local server = require "warmbox.server"
local core = require "warmbox.core"
local cjson = require("cjson.safe").new()

local RUNS = tonumber(arg and arg[1]) or 30
local RTT = 20

local bin = env.warmboxd
local srv = assert(server.start{ bin = bin, args = { "--rtt-ms", tostring(RTT) } })
local http = core.http{ timeout = 30 }

local function stats()
  local res = assert(http:request{ method = "GET", url = srv.url .. "/_warmboxd/stats",
    headers = { ["X-Warmboxd-Token"] = srv.admin_token } })
  return assert(cjson.decode(res.body))
end

local function pct(sorted, p)
  return sorted[math.min(#sorted, math.max(1, math.ceil(p / 100 * #sorted)))]
end

local lockdir = os.tmpname()
os.remove(lockdir)

local function bench_warmbox(label, run_timeout, paused, advance)
  local skew = 0
  local wb = assert(warmbox.new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key,
    lock = { backend = "file", dir = lockdir }, exec_timeout = 300, idle_timeout = 300,
    clock = function() return os.time() + skew end })
  local s = wb:session("bench-workspace:" .. label)
  assert(s:run("x = 1"))     -- cold start
  assert(s:run("x += 1"))    -- the kernel gets warmbox's output hooks
  local times, nreq = {}, 0
  for i = 1, RUNS do
    if paused then assert(wb.client:pause(s:state().sandbox_id)) end
    skew = skew + (advance or 0)
    local n0 = stats().total_requests
    local t0 = core.now()
    local r, err, code = s:run("x += 1\nx", { timeout = run_timeout })
    times[i] = (core.now() - t0) * 1000
    assert(r, tostring(err) .. " " .. tostring(code))
    nreq = nreq + stats().total_requests - n0
  end
  table.sort(times)
  local sandbox = s:state().sandbox_id
  wb:release("bench-workspace:" .. label)
  wb:close()
  return { label = label, requests_per_run = nreq / RUNS, p50_ms = pct(times, 50), p95_ms = pct(times, 95),
    sandbox = sandbox }
end

local function bench_reference()
  local q = function(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
  local cmd = table.concat({ "cd", q(root), "&&", "E2B_API_URL=" .. q(srv.url), "E2B_SANDBOX_URL=" .. q(srv.url),
    "WARMBOXD_ADMIN_TOKEN=" .. q(srv.admin_token),
    "E2B_API_KEY=" .. q(srv.api_key), "E2B_DOMAIN=localhost", "BENCH_RUNS=" .. RUNS,
    "timeout 600 node bench/reference_flow.mjs 2>&1" }, " ")
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  local last = out:match("([^\n]*)\n?$")
  local t = cjson.decode(last or "")
  if type(t) ~= "table" then return nil, out end
  t.label = "reference flow (JS SDKs)"
  return t
end

local ok, err = pcall(function()
  print(string.format("warmboxd %s, --rtt-ms %d, %d warm runs each ('x += 1; x', no files)\n", srv.url, RTT, RUNS))
  local rows = {
    bench_warmbox("warmbox, lease covers the run", 60),
    bench_warmbox("warmbox, default config", nil, false, 2),
    bench_warmbox("warmbox, paused before each run", nil, true),
  }
  local ref, rerr = bench_reference()
  if ref then rows[#rows + 1] = ref end
  print(string.format("%-34s %12s %10s %10s", "flow", "requests/run", "p50 ms", "p95 ms"))
  for _, r in ipairs(rows) do
    print(string.format("%-34s %12.2f %10.1f %10.1f", r.label, r.requests_per_run, r.p50_ms, r.p95_ms))
  end
  if ref then
    print()
    for i = 1, 3 do
      local r = rows[i]
      print(string.format("%s: %.1fx fewer requests, %.1fx lower p50, %.1fx lower p95 than the reference flow",
        r.label, ref.requests_per_run / r.requests_per_run, ref.p50_ms / r.p50_ms, ref.p95_ms / r.p95_ms))
    end
    if type(ref.requests) == "table" then
      local parts = {}
      for k, v in pairs(ref.requests) do parts[#parts + 1] = string.format("%s %.2g", k, v) end
      table.sort(parts)
      print("reference requests per run: " .. table.concat(parts, ", "))
    end
  else
    print("\nreference flow skipped or failed (node + spec/sdk/node_modules needed):\n" .. tostring(rerr))
  end
end)
http:close()
srv:stop()
os.execute("rm -rf '" .. lockdir .. "'")
if not ok then error(err, 0) end
