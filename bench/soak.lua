-- A soak: C conversations, each one long-lived task running cells back to
-- back for SECONDS, against one warmboxd (20 ms round trips) with faults
-- injected meanwhile (every 2 s one of: a 502 on an execute, a 503 on a
-- connect, a delayed list). Prints, every INTERVAL seconds, the runs so far,
-- the Lua heap (after a full collection) and the process's RSS: both stay
-- flat over a long soak.
--
--   lua5.4 bench/soak.lua [SECONDS=120] [CONVERSATIONS=20] [INTERVAL=60]   (after scripts/setup)
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local warmbox = require "warmbox"
local core = require "warmbox.core"
local wbd = require "spec.helpers.warmboxd"

local SECONDS = tonumber(arg and arg[1]) or 120
local CONVS = tonumber(arg and arg[2]) or 20
local INTERVAL = tonumber(arg and arg[3]) or 60

local srv = wbd.start{ args = { "--rtt-ms", "20" } }
local lockdir = os.tmpname()
os.remove(lockdir)
local wb = assert(warmbox.new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key,
  lock = { backend = "file", dir = lockdir }, exec_timeout = 60, idle_timeout = 60, request_timeout = 5 })

local function rss_kb() return env.status_kb("VmRSS") end

local FAULTS = {
  { route = "interp POST /execute", count = 1, status = 502 },
  { route = "POST /sandboxes/{id}/connect", count = 1, status = 503 },
  { route = "GET /v2/sandboxes", count = 1, delay_ms = 200 },
}

local t0 = core.now()
local deadline = t0 + SECONDS
local runs, failed = 0, {}
for i = 1, CONVS do
  wb:spawn(function()
    local s = wb:session("soak:" .. i)
    while core.now() < deadline do
      local r, _, code = s:run("n = globals().get('n', 0) + 1")
      runs = runs + 1
      if not r then failed[code] = (failed[code] or 0) + 1 end
    end
  end)
end

local rows = {}
local function sample()
  collectgarbage()
  collectgarbage()
  rows[#rows + 1] = { math.floor(core.now() - t0 + 0.5), runs, collectgarbage("count"), rss_kb() }
  local r = rows[#rows]
  io.stderr:write(("%5d s  %7d runs  heap %8.0f KB  rss %8d KB\n"):format(r[1], r[2], r[3], r[4]))
end

wb:spawn(function()
  local rn = require("warmbox.runner").running()
  local next_sample, k = t0 + INTERVAL, 0
  sample()
  while core.now() < deadline do
    rn.sched:sleep(2)
    k = k + 1
    local f = FAULTS[(k - 1) % #FAULTS + 1]
    pcall(srv.fault, srv, f)
    if core.now() >= next_sample then
      sample()
      next_sample = next_sample + INTERVAL
    end
  end
end)
assert(wb:loop())
sample()

print(("%d conversations, %d s, faults every 2 s (502 execute, 503 connect, delayed list)"):format(CONVS,
  SECONDS))
print("| t (s) | runs | Lua heap (KB) | RSS (KB) |")
print("|---|---|---|---|")
for _, r in ipairs(rows) do print(("| %d | %d | %.0f | %d |"):format(r[1], r[2], r[3], r[4])) end
local fl = {}
for c, n in pairs(failed) do fl[#fl + 1] = c .. " " .. n end
table.sort(fl)
print("failed runs: " .. (#fl > 0 and table.concat(fl, ", ") or "none"))
wb:close()
srv:stop()
os.execute("rm -rf " .. wbd.sh_quote(lockdir))
