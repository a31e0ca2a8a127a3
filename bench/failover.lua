-- bench/failover.lua: sessions on a Redis lock whose Redis fails over under
-- load. Starts warmboxd and, per topology, Redis Sentinel (a primary, two
-- replicas, three sentinels) or a Redis Cluster (3 primaries, a replica
-- each) on loopback; HOSTS host processes run cells in CONVS shared
-- conversations (every host in every conversation) while the primary (on a
-- Cluster: the one serving the first conversation) is, FAULTS times each,
-- killed (kill -9; restarted as a replica), stopped (SIGSTOP past the lock's
-- ttl, then SIGCONT) and failed over by hand (SENTINEL FAILOVER, CLUSTER
-- FAILOVER).
--   lua5.4 bench/failover.lua
--   BENCH_TOPOLOGIES=sentinel BENCH_HOSTS=3 BENCH_CONVS=12 BENCH_FAULTS=3 lua5.4 bench/failover.lua
-- Prints per topology: runs (ok / failed, by code), cells executed twice,
-- overlapping executions inside a sandbox (warmboxd's exec_overlap),
-- runs reported ok whose cell did not run, conversations stuck (a last run
-- after the faults fails 3 times), and per kind of fault the seconds from the
-- fault to the new primary and to the first successful run after it of a
-- conversation the failed primary served (median and max over the faults).
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local core = require "warmbox.core"
local cjson = require "cjson"
local wbd = require "spec.helpers.warmboxd"
local redis_ha = require "spec.helpers.redis_ha"

local q = wbd.sh_quote
local HOSTS = tonumber(os.getenv("BENCH_HOSTS")) or 2
local CONVS = tonumber(os.getenv("BENCH_CONVS")) or 4
local FAULTS = tonumber(os.getenv("BENCH_FAULTS")) or 3
local TTL = 2 -- the lock's ttl (s): a stopped primary stays stopped TTL + 1 s
local TOPOLOGIES = {}
for t in (os.getenv("BENCH_TOPOLOGIES") or "sentinel,cluster"):gmatch("[^,]+") do TOPOLOGIES[#TOPOLOGIES + 1] = t end

-- One host process: a task per conversation running marked cells until the
-- stop file appears, then one last run (3 tries). Each run is a line of JSON.
local HOST = [[
local api_url, api_key, ropts, host, nconv, stopf, logf = ...
local wb = assert(require("warmbox").new{ api_url = api_url, sandbox_url = api_url, api_key = api_key,
  exec_timeout = 30, idle_timeout = 120,
  lock = { backend = "redis", redis = assert(load("return " .. ropts))(), ttl = ]] .. TTL .. [[, timeout = 60 } })
local cjson, core = require "cjson", require "warmbox.core"
local log = assert(io.open(logf, "a"))
log:setvbuf("line")
local function stopped() local f = io.open(stopf) if f then f:close() end return f ~= nil end
for c = 1, tonumber(nconv) do
  wb:spawn(function()
    local s = wb:session("fo-conv-" .. c)
    local n = 0
    local function one(final)
      n = n + 1
      local mark = string.format("h%s-c%d-%d", host, c, n)
      local t0 = core.now()
      local r, err, code = s:run("open('/home/user/runs.log', 'a').write('" .. mark .. "\\n')\n"
        .. "import time; time.sleep(0.05)\n")
      log:write(cjson.encode{ mark = mark, conv = c, tag = s.tag_value, ok = r ~= nil, code = code,
        err = not r and tostring(err) or nil, t0 = t0, t = core.now(),
        id = r and r.sandbox_id or nil, lock_error = r and r.lock_error and r.lock_error[2] or nil,
        final = final or nil }, "\n")
      return r ~= nil
    end
    while not stopped() do
      if not one() then core.sleep(0.05) end
    end
    for _ = 1, 3 do if one(true) then break end end
  end)
end
assert(wb:loop())
wb:close()
]]

-- (core.now: CLOCK_MONOTONIC, one clock for every process of this machine)
local function now() return core.now() end

local function median(xs)
  if #xs == 0 then return 0 / 0 end
  table.sort(xs)
  return xs[(#xs + 1) // 2]
end

local function run_topology(kind)
  local srv = wbd.start{ bin = env.warmboxd }
  local t = redis_ha.start(kind)
  local work = os.tmpname()
  os.remove(work)
  assert(os.execute("mkdir -p " .. q(work)))
  local script = work .. "/host.lua"
  local f = assert(io.open(script, "w"))
  f:write(HOST)
  f:close()
  local stopf = work .. "/stop"
  local pids = {}
  for h = 1, HOSTS do
    local cmd = string.format("LUA_PATH=%s LUA_CPATH=%s lua5.4 %s %s %s %s %d %d %s %s >%s 2>&1 & echo $!",
      q(package.path), q(package.cpath), q(script), q(srv.url), q(srv.api_key), q(t:lua_opts("fo:")), h, CONVS,
      q(stopf), q(work .. "/host" .. h .. ".log"), q(work .. "/host" .. h .. ".out"))
    local p = assert(io.popen(cmd))
    pids[h] = tonumber(p:read("l"))
    p:close()
  end
  local function records()
    local list = {}
    for h = 1, HOSTS do
      local g = io.open(work .. "/host" .. h .. ".log")
      if g then
        for line in g:lines() do
          local ok, r = pcall(cjson.decode, line)
          if ok then list[#list + 1] = r end
        end
        g:close()
      end
    end
    return list
  end
  -- warm: every conversation ran once
  local tags = {}
  local deadline = core.now() + 120
  repeat
    core.sleep(0.5)
    for _, r in ipairs(records()) do if r.ok then tags[r.conv] = r.tag end end
    local n = 0
    for _ in pairs(tags) do n = n + 1 end
  until n == CONVS or core.now() > deadline
  local faults = {}
  local function served(addr)
    local list = {}
    for c, tag in pairs(tags) do
      local _, a = t:primary(tag)
      if a == addr then list[c] = true end
    end
    return list
  end
  for _, how in ipairs{ "kill", "stop", "by hand" } do
    for _ = 1, FAULTS do
      local _, old = t:primary(tags[1])
      local fault = { how = how, convs = served(old) }
      if how == "kill" then
        t:signal_primary("KILL", tags[1])
        fault.t = now()
        t:wait_primary(old, tags[1])
        fault.elected = now()
        t:restart(old)
      elseif how == "stop" then
        local pid = t:signal_primary("STOP", tags[1])
        fault.t = now()
        core.sleep(TTL + 1)
        t:wait_primary(old, tags[1])
        fault.elected = now()
        os.execute("kill -CONT " .. pid)
      else
        fault.t = now()
        t:failover(tags[1])
        fault.elected = now()
      end
      faults[#faults + 1] = fault
      core.sleep(3) -- runs go on between faults
    end
  end
  local fh = assert(io.open(stopf, "w"))
  fh:close()
  for _, pid in ipairs(pids) do
    local dl = core.now() + 180
    while wbd.alive(pid) and core.now() < dl do core.sleep(0.1) end
  end
  -- what the sandboxes recorded
  local ran = {}
  local p = io.popen("cat " .. q(srv:ns_path(srv.dir .. "/data")) .. "/*/home/runs.log 2>/dev/null")
  for line in p:lines() do ran[line] = (ran[line] or 0) + 1 end
  p:close()
  local twice, false_ok, ok, failed, codes, stuck_final = 0, 0, 0, 0, {}, {}
  for _, n in pairs(ran) do if n > 1 then twice = twice + 1 end end
  local list = records()
  for _, r in ipairs(list) do
    if r.ok then
      ok = ok + 1
      if not ran[r.mark] then false_ok = false_ok + 1 end
    else
      failed = failed + 1
      local c = tostring(r.code)
      if not codes[c] and os.getenv("BENCH_VERBOSE") then print("  e.g. " .. c .. ": " .. tostring(r.err)) end
      codes[c] = (codes[c] or 0) + 1
    end
    if r.final then
      local key = r.conv
      if r.ok then stuck_final[key] = false elseif stuck_final[key] == nil then stuck_final[key] = true end
    end
  end
  local stuck = 0
  for c = 1, CONVS do if stuck_final[c] ~= false then stuck = stuck + 1 end end
  local st = wbd.stats(srv)
  local code_list = {}
  for c, n in pairs(codes) do code_list[#code_list + 1] = c .. " " .. n end
  table.sort(code_list)
  print(string.format("%s: %d hosts x %d conversations, %d faults: runs ok %d, failed %d (%s)", kind, HOSTS, CONVS,
    #faults, ok, failed, table.concat(code_list, ", ")))
  print(string.format("  cells executed twice %d, overlapping executions in a sandbox %d, runs ok whose cell did "
    .. "not run %d, conversations stuck %d", twice, (st.counters or {}).exec_overlap or 0, false_ok, stuck))
  for _, how in ipairs{ "kill", "stop", "by hand" } do
    local to_primary, to_run = {}, {}
    for _, fl in ipairs(faults) do
      if fl.how == how then
        to_primary[#to_primary + 1] = fl.elected - fl.t
        local first
        for _, r in ipairs(list) do
          if r.ok and r.t0 >= fl.t and fl.convs[r.conv] and (not first or r.t < first) then first = r.t end
        end
        to_run[#to_run + 1] = first and (first - fl.t) or 1 / 0
      end
    end
    local maxp, maxr = 0, 0
    for _, v in ipairs(to_primary) do maxp = math.max(maxp, v) end
    for _, v in ipairs(to_run) do maxr = math.max(maxr, v) end
    print(string.format("  %-8s fault -> new primary: median %.2f s, max %.2f s; fault -> first ok run (a "
      .. "conversation it served, started after it): median %.2f s, max %.2f s", how, median(to_primary), maxp,
      median(to_run), maxr))
  end
  t:stop()
  srv:stop()
  if os.getenv("BENCH_VERBOSE") then print("  (kept " .. work .. ")") else os.execute("rm -rf " .. q(work)) end
end

for _, kind in ipairs(TOPOLOGIES) do run_topology(kind) end
