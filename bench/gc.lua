-- bench/gc.lua: GC at scale. warmboxd (--rtt-ms 20) is seeded with N tagged
-- paused sandboxes (BENCH_N, default 100,000) spread over BENCH_SESSIONS
-- sessions (200) of 20 tenants, half of them paused 30 days ago (past the 7-day
-- retention), half an hour ago; then one GC pass runs in a child process and
-- the table shows its total time, items classified per second, kills per
-- second and the child's peak RSS: a dry run, then at concurrency 1, 8 and 32; in the same
-- run, the baseline: the reference's sweep with the official e2b JS SDK
-- (bench/gc_reference.mjs: drain the paginator, then kill with Promise.all,
-- and sequentially). Every row gets a freshly seeded warmboxd.
--   lua5.4 bench/gc.lua
--   BENCH_N=100000 BENCH_SLOW_N=10000 BENCH_RTT_MS=20 BENCH_ROWS=dry,c1,c8,c32,all,seq lua5.4 bench/gc.lua
-- The slow rows (concurrency 1 and the sequential SDK sweep: one round trip per
-- kill, ~1,000 s at full scale) run on BENCH_SLOW_N sandboxes unless it equals N.
-- Seeding and the admin API go through spec/helpers/warmboxd.lua.
dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local RETENTION = 7 * 86400
local TAG = "warmboxSessionId"

local function vm(field)
  local f = io.open("/proc/self/status", "r")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return tonumber(s:match(field .. ":%s*(%d+)"))
end

-- ---- the child: one GC pass, figures as one JSON line ----------------------
if arg[1] == "child" then
  local core = require "warmbox.core"
  local e2b = require "warmbox.e2b"
  local gc = require "warmbox.gc"
  local json = require "warmbox.json"
  local url, key, conc, dir, dry = arg[2], arg[3], tonumber(arg[4]), arg[5], arg[6] == "dry"
  local client = e2b.new{ api_key = key, api_url = url, sandbox_url = url }
  local peak_lua = 0
  local t0 = core.now()
  local rep, err, code = gc.run{ client = client, tag = TAG, max_age = RETENTION, concurrency = conc,
    lock = { backend = "file", dir = dir }, actions = false, dry_run = dry,
    on_page = function()
      local kb = collectgarbage("count")
      if kb > peak_lua then peak_lua = kb end
    end }
  local secs = core.now() - t0
  assert(rep, tostring(err) .. " " .. tostring(code))
  io.write(json.encode({ seconds = secs, listed = rep.listed, tagged = rep.tagged, killed = rep.killed,
    failed = rep.failed, skipped = rep.skipped, busy = rep.busy, pages = rep.pages,
    peak_lua_kb = peak_lua, rss_kb = vm("VmHWM") }), "\n")
  os.exit(0)
end

-- ---- the parent --------------------------------------------------------------
local wbd = require "spec.helpers.warmboxd"
local tag_mod = require "warmbox.tag"
local cjson = require "cjson.safe"

local N = tonumber(os.getenv("BENCH_N")) or 100000
local SLOW_N = tonumber(os.getenv("BENCH_SLOW_N")) or 10000
local RTT = os.getenv("BENCH_RTT_MS") or "20"
local SESSIONS = tonumber(os.getenv("BENCH_SESSIONS")) or 200
local ROWS = os.getenv("BENCH_ROWS") or "dry,c1,c8,c32,all,seq"
local q = wbd.sh_quote

local function seeded(n)
  local srv = wbd.start{ args = { "--rtt-ms", RTT } }
  -- seeding is not what is measured: no added latency meanwhile
  assert(wbd.admin(srv, "POST", "config", { rtt_ms = 0 }).status == 204)
  local per = n // SESSIONS
  for i = 1, SESSIONS do
    local key = string.format("tenant-%d:conv-%d", i % 20, i)
    local tv = tag_mod.tag_value(key, {})
    local count = i == SESSIONS and n - per * (SESSIONS - 1) or per
    local old = count // 2
    wbd.seed(srv, { count = old, state = "paused", metadata = { [TAG] = tv },
      started_ago_s = 31 * 86400, paused_ago_s = 30 * 86400 })
    if count - old > 0 then
      wbd.seed(srv, { count = count - old, state = "paused", metadata = { [TAG] = tv },
        started_ago_s = 7200, paused_ago_s = 1800 })
    end
  end
  assert(wbd.admin(srv, "POST", "config", { rtt_ms = tonumber(RTT) }).status == 204)
  return srv
end

local function run(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  local line = out:match("(%b{})%s*$")
  return line and cjson.decode(line), out
end

local rows = {}
for name in ROWS:gmatch("[^,]+") do
  local slow = name == "c1" or name == "seq"
  local n = slow and math.min(SLOW_N, N) or N
  io.stderr:write(string.format("bench/gc: %s on %d sandboxes (rtt %s ms)...\n", name, n, RTT))
  local srv = seeded(n)
  local r, out
  local ok, err = pcall(function()
    if name:match("^c%d+$") or name == "dry" then
      local dir = os.tmpname()
      os.remove(dir)
      local conc = name == "dry" and 8 or tonumber(name:sub(2))
      r, out = run(string.format("lua5.4 bench/gc.lua child %s %s %d %s %s 2>&1", q(srv.url), q(srv.api_key),
        conc, q(dir), name == "dry" and "dry" or "real"))
      os.execute("rm -rf " .. q(dir))
      if r then
        r.what = name == "dry" and "warmbox gc --dry-run" or "warmbox gc, concurrency " .. name:sub(2)
        if name == "dry" then r.would_kill, r.killed = r.killed, 0 end
      end
    else
      r, out = run(string.format("env E2B_API_URL=%s E2B_API_KEY=%s node bench/gc_reference.mjs %s %d %s 2>&1",
        q(srv.url), q(srv.api_key), name, RETENTION, TAG))
      if r then
        r.what = name == "all" and "e2b JS SDK, Promise.all" or "e2b JS SDK, sequential"
        r.rss_kb = r.max_rss_kb
      end
    end
  end)
  srv:stop()
  if not ok or not r then
    io.stderr:write("bench/gc: ", name, " failed: ", tostring(err or out), "\n")
  else
    r.n = n
    rows[#rows + 1] = r
  end
end

print(string.format("GC of %s tagged paused sandboxes (half past a 7-day retention), warmboxd --rtt-ms %s",
  N, RTT))
print(string.format("%-30s %9s %9s %8s %12s %9s %7s %9s", "sweep", "sandboxes", "seconds", "killed",
  "classified/s", "kills/s", "failed", "peak RSS"))
for _, r in ipairs(rows) do
  local listed = r.listed or 0
  print(string.format("%-30s %9d %9.1f %8d %12.0f %9.0f %7d %6.1f MB", r.what, r.n, r.seconds, r.killed or 0,
    listed / r.seconds, (r.killed or 0) / r.seconds, r.failed or 0, (r.rss_kb or 0) / 1024))
end
