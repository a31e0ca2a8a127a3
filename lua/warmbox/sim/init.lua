--- warmbox.sim: the policy simulator.
--
-- Replays a trace (or a generated workload) of conversation turns against
-- the **same** `warmbox.session`, policy and `warmbox.gc` code a host runs,
-- with a virtual-time model of E2B (`warmbox.sim.model`) as the E2B client
-- and its virtual clock as the clock: leases run out, sandboxes pause and
-- resume, cold starts and round trips cost time, and nothing sleeps or
-- touches the network. GC passes run every `gc_every` seconds of virtual
-- time. The report counts cold starts, resumes and warm hits, the latency
-- warmbox added before the code ran, compute cost, paused storage and GC kills.
--
--   local sim = require "warmbox.sim"
--   local report = assert(sim.run{ workload = { sessions = 50, seed = 7 }, idle_timeout = 300 })
--   local rows = assert(sim.sweep({ trace = "trace.jsonl" }, { param = "idle_timeout", values = { 60, 300, 900 } }))
--   io.write(sim.format(rows))
--   local svg = sim.chart(rows)       -- cost vs p95 added latency, one point per row
--
-- Turns run one at a time in time order (a turn due while another one, or a
-- GC pass, is still running starts when it ends; that wait is not counted
-- as added latency).
-- @module warmbox.sim

local session_mod = require "warmbox.session"
local policy_mod = require "warmbox.policy"
local gc_mod = require "warmbox.gc"
local json = require "warmbox.json"
local errors = require "warmbox.errors"
local model_mod = require "warmbox.sim.model"
local sim_lock = require "warmbox.sim.lock"
local chart_mod = require "warmbox.sim.chart"

local type, pairs, ipairs, tostring, error, pcall =
  type, pairs, ipairs, tostring, error, pcall
local string_format, table_sort, table_concat, math_floor, math_ceil, math_log, math_max, math_huge =
  string.format, table.sort, table.concat, math.floor, math.ceil, math.log, math.max, math.huge
local io_open, math_type = io.open, math.type

local _M = {}

--- E2B's published prices and the default sandbox size (2 vCPU, 512 MiB).
_M.PRICES = {
  vcpu_second = 0.000014,   -- $ per vCPU-second while running
  gib_second = 0.0000045,   -- $ per GiB-RAM-second while running
  vcpus = 2,
  memory_gib = 0.5,
  paused_second = 0,        -- $ per paused sandbox-second (E2B publishes no storage price)
}

local function is_num(v) return type(v) == "number" and v == v and v > -math_huge and v < math_huge end

local function bad(fname, msg, level)
  error(string_format("bad argument #1 to '%s' (%s)", fname, msg), level + 1)
end

-- ------------------------------------------------------------------
-- A deterministic PRNG (splitmix64), independent of math.random
-- ------------------------------------------------------------------

local function prng(seed)
  local s = math_floor(seed) ~ 0x5DEECE66D
  local r = {}
  --- A float in [0, 1).
  function r.next()
    s = s + 0x9E3779B97F4A7C15
    local z = s
    z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ~ (z >> 27)) * 0x94D049BB133111EB
    z = z ~ (z >> 31)
    return (z >> 11) * (1.0 / 9007199254740992)
  end
  function r.uniform(a, b) return a + (b - a) * r.next() end
  function r.int(a, b) return a + math_floor((b - a + 1) * r.next()) end
  function r.exp(mean) return -mean * math_log(1 - r.next()) end
  return r
end
_M.prng = prng

-- ------------------------------------------------------------------
-- Inputs: trace files and generated workloads
-- ------------------------------------------------------------------

local TURN_KEYS = { t = true, session = true, duration = true, timeout = true, language = true }

local function check_turn(e, where)
  if type(e) ~= "table" then return nil, where .. ": a turn must be an object" end
  for k in pairs(e) do
    if not TURN_KEYS[k] then return nil, string_format("%s: unknown field '%s'", where, tostring(k)) end
  end
  if not is_num(e.t) or e.t < 0 then return nil, where .. ": 't' must be a number of seconds >= 0" end
  if type(e.session) ~= "string" or e.session == "" then
    return nil, where .. ": 'session' must be a non-empty string"
  end
  local d = e.duration
  if d == nil then d = 0 end
  if not is_num(d) or d < 0 then return nil, where .. ": 'duration' must be a number of seconds >= 0" end
  if e.timeout ~= nil and (not is_num(e.timeout) or e.timeout <= 0) then
    return nil, where .. ": 'timeout' must be a positive number"
  end
  if e.language ~= nil and type(e.language) ~= "string" then return nil, where .. ": 'language' must be a string" end
  return { t = e.t, session = e.session, duration = d, timeout = e.timeout, language = e.language }
end

-- Sorts turns by time (stable: equal times keep their order).
local function sort_turns(turns)
  local idx = {}
  for i, e in ipairs(turns) do idx[e] = i end
  table_sort(turns, function(a, b) return a.t < b.t or (a.t == b.t and idx[a] < idx[b]) end)
  return turns
end

--- Parse a trace: JSON lines `{"t": seconds, "session": "key", "duration": seconds}`
-- (optional `timeout`, `language`); blank lines and lines starting with `#` are skipped.
-- @tparam string text the file's contents
-- @treturn[1] table turns, sorted by `t`
-- @return[2] nil, message, "BAD_REQUEST"
function _M.parse_trace(text)
  if type(text) ~= "string" then
    error("bad argument #1 to 'parse_trace' (string expected, got " .. type(text) .. ")", 2)
  end
  local turns, n = {}, 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:find("%S") and not line:match("^%s*#") then
      local e, jerr = json.decode(line)
      if e == nil then
        return nil, string_format("trace line %d: invalid json: %s", n, tostring(jerr)), "BAD_REQUEST"
      end
      local turn, err = check_turn(e, "trace line " .. n)
      if not turn then return nil, err, "BAD_REQUEST" end
      turns[#turns + 1] = turn
    end
  end
  return sort_turns(turns)
end

--- Read and parse a trace file.
-- @tparam string path
-- @treturn[1] table turns
-- @return[2] nil, message, "NOT_FOUND" | "BAD_REQUEST"
function _M.load_trace(path)
  if type(path) ~= "string" then
    error("bad argument #1 to 'load_trace' (string expected, got " .. type(path) .. ")", 2)
  end
  local f, err = io_open(path, "rb")
  if not f then return nil, "cannot read trace: " .. tostring(err), "NOT_FOUND" end
  local text = f:read("a")
  f:close()
  return _M.parse_trace(text)
end

local WORKLOAD_KEYS = { sessions = true, turns = true, gap = true, think = true, duration = true, span = true,
  seed = true, prefix = true }

-- A number, or a {min, max} range, drawn with `draw(mean)` for a number.
local function check_range(v, name, integer)
  if is_num(v) and v >= 0 then return end
  if type(v) == "table" and is_num(v[1]) and is_num(v[2]) and v[1] >= 0 and v[2] >= v[1] then
    if integer and (math_type(v[1]) ~= "integer" or math_type(v[2]) ~= "integer") then
      bad("workload", "'" .. name .. "' must be integers", 4)
    end
    return
  end
  bad("workload", "'" .. name .. "' must be a number >= 0 or a {min, max} range", 4)
end

--- Generate a workload's turns (deterministic for a seed).
-- `sessions` conversations start uniformly within `span` seconds (3600); each
-- has `turns` turns (`{1, 10}`: uniform integer range, or a number); a turn's
-- code runs `duration` seconds (2; `{min, max}` uniform); the next turn comes
-- `think` seconds (0) plus an exponential gap of mean `gap` seconds (300;
-- `{min, max}` uniform) after a turn's end. `seed` (1) seeds the PRNG;
-- session keys are `prefix .. i` (`"conv-"`).
-- @tparam table w
-- @treturn table turns, sorted by `t`
function _M.workload(w)
  if type(w) ~= "table" then error("bad argument #1 to 'workload' (table expected, got " .. type(w) .. ")", 2) end
  errors.check_options(w, WORKLOAD_KEYS, "workload", 1)
  local n = w.sessions
  if math_type(n) ~= "integer" or n < 0 then bad("workload", "'sessions' must be an integer >= 0", 2) end
  local turns_r = w.turns or { 1, 10 }
  check_range(turns_r, "turns", true)
  local gap, think, dur, span = w.gap or 300, w.think or 0, w.duration or 2, w.span or 3600
  check_range(gap, "gap")
  check_range(dur, "duration")
  if not is_num(think) or think < 0 then bad("workload", "'think' must be a number >= 0", 2) end
  if not is_num(span) or span < 0 then bad("workload", "'span' must be a number >= 0", 2) end
  local seed = w.seed or 1
  if math_type(seed) ~= "integer" then bad("workload", "'seed' must be an integer", 2) end
  local prefix = w.prefix or "conv-"
  if type(prefix) ~= "string" then bad("workload", "'prefix' must be a string", 2) end
  local r = prng(seed)
  local function draw(v, exp)
    if type(v) == "table" then return r.uniform(v[1], v[2]) end
    return exp and r.exp(v) or v
  end
  local turns = {}
  for i = 1, n do
    local key = prefix .. i
    local t = r.uniform(0, span)
    local count = type(turns_r) == "table" and r.int(turns_r[1], turns_r[2]) or math_floor(turns_r)
    for _ = 1, count do
      local d = draw(dur, false)
      turns[#turns + 1] = { t = t, session = key, duration = d }
      t = t + d + think + draw(gap, true)
    end
  end
  return sort_turns(turns)
end

-- ------------------------------------------------------------------
-- run
-- ------------------------------------------------------------------

local RUN_KEYS = { trace = true, workload = true, policy = true, exec_timeout = true, idle_timeout = true,
  template = true, tag = true, prices = true, model = true, gc_every = true, max_age = true, tail = true,
  details = true, code = true }

local function copy(t)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  return o
end

--- The nearest-rank percentile of a sorted list (nil when empty).
function _M.percentile(sorted, p)
  local n = #sorted
  if n == 0 then return nil end
  local k = math_ceil(p / 100 * n)
  if k < 1 then k = 1 end
  return sorted[k]
end

local function check_run_opts(o, fname, level)
  if type(o) ~= "table" then bad(fname, "table expected, got " .. type(o), level) end
  errors.check_options(o, RUN_KEYS, fname, 1, level)
  if (o.trace == nil) == (o.workload == nil) then
    bad(fname, "exactly one of 'trace' and 'workload' expected", level)
  end
  if o.trace ~= nil and type(o.trace) ~= "string" and type(o.trace) ~= "table" then
    bad(fname, "'trace' must be a path or a table of turns", level)
  end
  for _, k in ipairs{ "exec_timeout", "idle_timeout" } do
    if o[k] ~= nil and (not is_num(o[k]) or o[k] <= 0) then
      bad(fname, "'" .. k .. "' must be a positive number", level)
    end
  end
  for _, k in ipairs{ "max_age", "tail" } do
    if o[k] ~= nil and (not is_num(o[k]) or o[k] < 0) then bad(fname, "'" .. k .. "' must be a number >= 0", level) end
  end
  if o.gc_every ~= nil and o.gc_every ~= false and (not is_num(o.gc_every) or o.gc_every < 0) then
    bad(fname, "'gc_every' must be a number of seconds >= 0 or false", level)
  end
  for _, k in ipairs{ "template", "tag", "code" } do
    if o[k] ~= nil and (type(o[k]) ~= "string" or o[k] == "") then
      bad(fname, "'" .. k .. "' must be a non-empty string", level)
    end
  end
  if o.prices ~= nil then
    if type(o.prices) ~= "table" then bad(fname, "'prices' must be a table", level) end
    for k, v in pairs(o.prices) do
      if _M.PRICES[k] == nil then bad(fname, "unknown price '" .. tostring(k) .. "'", level) end
      if not is_num(v) or v < 0 then bad(fname, "price '" .. k .. "' must be a number >= 0", level) end
    end
  end
  if o.model ~= nil then
    if type(o.model) ~= "table" then bad(fname, "'model' must be a table", level) end
    local ok, err = pcall(model_mod.new, o.model)
    if not ok then bad(fname, (tostring(err):gsub("^[^:]*:%d+: ", "")), level) end
  end
  if o.workload ~= nil then
    local ok, err = pcall(_M.workload, o.workload)
    if not ok then error((tostring(err):gsub("^[^:]*:%d+: ", "")), level) end
  end
  if o.policy ~= nil and type(o.policy) ~= "table" and type(o.policy) ~= "string" then
    bad(fname, "'policy' must be a table, a path or nil", level)
  end
end

local function turns_of(o)
  if o.workload then return _M.workload(o.workload) end
  if type(o.trace) == "string" then return _M.load_trace(o.trace) end
  local turns = {}
  for i, e in ipairs(o.trace) do
    local turn, err = check_turn(e, "trace turn " .. i)
    if not turn then return nil, err, "BAD_REQUEST" end
    turns[i] = turn
  end
  return sort_turns(turns)
end

local function run(o)
  local turns, terr, tcode = turns_of(o)
  if not turns then return nil, terr, tcode end
  local policy, perr, pcode
  if type(o.policy) == "table" and o.policy.name and o.policy.order and o.policy.lease
    and o.policy.should_refresh and o.policy.create_params and o.policy.gc then
    policy = o.policy
  else
    local ok, p, e, c = pcall(policy_mod.resolve, o.policy)
    if not ok then bad("run", (tostring(p):gsub("^[^:]*:%d+: ", "")), 3) end
    policy, perr, pcode = p, e, c
    if not policy then return nil, perr, pcode end
  end
  local prices = copy(_M.PRICES)
  for k, v in pairs(o.prices or {}) do prices[k] = v end
  local model = model_mod.new(o.model)
  local clock = model:clock()
  local t0 = model.now
  local new_lock = sim_lock.factory()
  local exec_timeout, idle_timeout = o.exec_timeout or 300, o.idle_timeout or 300
  local template, tag = o.template or "code-interpreter-v1", o.tag or "warmboxSessionId"
  local max_age = o.max_age or 86400
  local gc_every = o.gc_every
  if gc_every == nil then gc_every = 3600 end
  if gc_every == 0 then gc_every = false end
  local code = o.code or "x = 1"

  local report = {
    turns = #turns, runs = 0, ok = 0, failed = 0, failures = {}, errors = {},
    cold_starts = 0, resumes = 0, warm_hits = 0,
    events = { create = 0, connect = 0, kill = 0, retry = 0 },
    gc_passes = 0, gc_kills = 0, gc_demoted = 0, gc_busy = 0, gc_errors = 0,
    policy = tostring(policy.name), exec_timeout = exec_timeout, idle_timeout = idle_timeout,
    max_age = max_age, gc_every = gc_every or 0, prices = prices,
  }
  local events = report.events
  local function on_event(name) events[name] = (events[name] or 0) + 1 end

  local sessions = {}
  local function session_for(key)
    local s = sessions[key]
    if not s then
      s = session_mod.new(key, { client = model, lock = new_lock, clock = clock, policy = policy,
        template = template, exec_timeout = exec_timeout, idle_timeout = idle_timeout, tag = tag,
        origin = "warmbox.sim", on_event = on_event, max_run_length = model.max_length })
      sessions[key] = s
    end
    return s
  end

  local function fail(c, msg)
    report.failed = report.failed + 1
    report.failures[c] = (report.failures[c] or 0) + 1
    if #report.errors < 10 then report.errors[#report.errors + 1] = { code = c, message = msg } end
  end

  local next_gc = gc_every and t0 + gc_every or math_huge
  local function gc_until(t)
    while next_gc <= t do
      model:advance_to(next_gc)
      local ok, rep, gerr, gcode = pcall(gc_mod.run, { client = model, tag = tag, policy = policy, lock = new_lock,
        clock = clock, max_age = max_age })
      report.gc_passes = report.gc_passes + 1
      if not ok then
        report.gc_errors = report.gc_errors + 1
        if #report.errors < 10 then report.errors[#report.errors + 1] = { code = "GC", message = tostring(rep) } end
      elseif not rep then
        report.gc_errors = report.gc_errors + 1
        if #report.errors < 10 then report.errors[#report.errors + 1] = { code = gcode, message = gerr } end
      else
        report.gc_kills = report.gc_kills + rep.killed
        report.gc_demoted = report.gc_demoted + rep.demoted
        report.gc_busy = report.gc_busy + rep.busy
        report.gc_errors = report.gc_errors + #rep.errors
      end
      next_gc = next_gc + gc_every
    end
  end

  local latencies = {}
  local last_end = t0
  for _, turn in ipairs(turns) do
    gc_until(t0 + turn.t)
    model:advance_to(t0 + turn.t)
    local s = session_for(turn.session)
    model.duration, model.mark = turn.duration, {}
    local start = clock()
    report.runs = report.runs + 1
    local ok, r, err, ecode = pcall(s.run, s, code, { timeout = turn.timeout, language = turn.language })
    if not ok then
      fail("ERROR", tostring(r))
    elseif not r then
      fail(tostring(ecode), tostring(err))
    else
      report.ok = report.ok + 1
      if model.mark.created then
        report.cold_starts = report.cold_starts + 1
      elseif model.mark.resumed then
        report.resumes = report.resumes + 1
      else
        report.warm_hits = report.warm_hits + 1
      end
      -- Virtual times are unix seconds: round away the float noise (to the microsecond).
      local ms = ((model.mark.code_started or clock()) - start) * 1000
      latencies[#latencies + 1] = math_floor(ms * 1000 + 0.5) / 1000
    end
    last_end = math_max(last_end, clock())
  end
  -- The tail: leases run out, GC passes reclaim what was abandoned.
  local tail = o.tail
  if tail == nil then tail = math_max(exec_timeout, idle_timeout) + max_age + (gc_every or 0) end
  local horizon = math_max(last_end + tail, clock())
  gc_until(horizon)
  model:advance_to(horizon)
  local alive = model:close_books()

  table_sort(latencies)
  local sum = 0
  for _, v in ipairs(latencies) do sum = sum + v end
  report.p50_ms = _M.percentile(latencies, 50) or 0
  report.p95_ms = _M.percentile(latencies, 95) or 0
  report.p99_ms = _M.percentile(latencies, 99) or 0
  report.max_ms = latencies[#latencies] or 0
  report.mean_ms = #latencies > 0 and sum / #latencies or 0
  local st = model.stats
  report.compute_seconds = st.running_seconds
  report.compute_cost = st.running_seconds * (prices.vcpus * prices.vcpu_second + prices.memory_gib * prices.gib_second)
  report.paused_seconds = st.paused_seconds
  report.storage_cost = st.paused_seconds * prices.paused_second
  report.cost = report.compute_cost + report.storage_cost
  report.created = st.creates
  report.requests = st.requests
  report.requests_per_run = report.runs > 0 and st.requests / report.runs or 0
  report.auto_pauses = st.auto_pauses
  report.paused_during_run = st.paused_during_run
  report.alive_running, report.alive_paused = alive.running, alive.paused
  report.alive = alive.running + alive.paused
  report.simulated_seconds = model.now - t0
  if o.details then
    report.sandboxes = model:sandboxes()
    report.latencies_ms = latencies
  end
  return report
end

--- Simulate a trace or a workload.
-- @tparam table opts `trace` (a path or a table of turns) or `workload` (see
--   `workload`); `policy` (nil | partial table | path, as `warmbox.new`);
--   `exec_timeout` (300), `idle_timeout` (300), `template`
--   ("code-interpreter-v1"), `tag` ("warmboxSessionId"), `code` (the cell each
--   turn runs, "x = 1"); `prices` (overrides of `PRICES`); `model` (overrides of
--   `warmbox.sim.model.DEFAULTS`: `rtt_ms`, `create_ms`, `kernel_ms`, `resume_ms`,
--   `pause_ms`, `max_length_hours`, ...); `gc_every` (3600 s of virtual time; 0 or
--   false: no GC), `max_age` (86400, given to GC), `tail` (seconds simulated after the
--   last run ends, default `max(exec_timeout, idle_timeout) + max_age + gc_every`: long
--   enough for the default GC policy to reclaim every abandoned sandbox), `details` (add `sandboxes` and
--   `latencies_ms`)
-- @treturn[1] table report: `turns, runs, ok, failed, failures = { CODE = n }, errors,
--   cold_starts, resumes, warm_hits, p50_ms, p95_ms, p99_ms, mean_ms, max_ms` (virtual
--   ms warmbox added before the code ran), `compute_seconds, compute_cost, paused_seconds,
--   storage_cost, cost, created, requests, requests_per_run, auto_pauses,
--   paused_during_run, gc_passes, gc_kills, gc_demoted, gc_busy, gc_errors, alive,
--   alive_running, alive_paused, events = { create, connect, kill, retry },
--   simulated_seconds, policy, exec_timeout, idle_timeout, max_age, gc_every, prices`
-- @return[2] nil, message, code ("NOT_FOUND" or "BAD_REQUEST" for a trace, "POLICY")
function _M.run(opts)
  check_run_opts(opts, "run", 3)
  local report, err, code = run(opts)
  return report, err, code
end

-- ------------------------------------------------------------------
-- sweep
-- ------------------------------------------------------------------

local SWEEPABLE = { exec_timeout = true, idle_timeout = true, max_age = true, gc_every = true, tail = true }

--- Run the same workload once per value of one parameter.
-- @tparam table base run options (as `run`)
-- @tparam table spec `{ param = "idle_timeout", values = { 60, 300, 900 } }`; `param`
--   is `exec_timeout`, `idle_timeout`, `max_age`, `gc_every`, `tail`, `model.NAME`
--   or `prices.NAME`
-- @treturn[1] table rows: one report per value, each with `param` and `value`
-- @return[2] nil, message, code (as `run`)
function _M.sweep(base, spec)
  check_run_opts(base, "sweep", 3)
  if type(spec) ~= "table" then
    error("bad argument #2 to 'sweep' (table expected, got " .. type(spec) .. ")", 2)
  end
  errors.check_options(spec, { param = true, values = true }, "sweep", 2)
  local param, values = spec.param, spec.values
  if type(param) ~= "string" then error("bad argument #2 to 'sweep' ('param' must be a string)", 2) end
  local group, name = param:match("^(%a+)%.([%w_]+)$")
  if group then
    if group ~= "model" and group ~= "prices" then
      error("bad argument #2 to 'sweep' (cannot sweep '" .. param .. "')", 2)
    end
  elseif not SWEEPABLE[param] then
    error("bad argument #2 to 'sweep' (cannot sweep '" .. param .. "')", 2)
  end
  if type(values) ~= "table" or #values == 0 then
    error("bad argument #2 to 'sweep' ('values' must be a non-empty list)", 2)
  end
  -- One workload for every row.
  local shared = copy(base)
  local turns, terr, tcode = turns_of(base)
  if not turns then return nil, terr, tcode end
  shared.trace, shared.workload = turns, nil
  local rows = {}
  for i, v in ipairs(values) do
    local o = copy(shared)
    if group then
      o[group] = copy(base[group] or {})
      o[group][name] = v
    else
      o[param] = v
    end
    check_run_opts(o, "sweep", 3)
    local r, err, code = run(o)
    if not r then return nil, err, code end
    r.param, r.value = param, v
    rows[i] = r
  end
  return rows
end

-- ------------------------------------------------------------------
-- output: a text table and a chart
-- ------------------------------------------------------------------

local COLUMNS = {
  { "runs", "runs", "%d" }, { "cold", "cold_starts", "%d" }, { "resumes", "resumes", "%d" },
  { "warm", "warm_hits", "%d" }, { "failed", "failed", "%d" },
  { "p50 ms", "p50_ms", "%.0f" }, { "p95 ms", "p95_ms", "%.0f" }, { "p99 ms", "p99_ms", "%.0f" },
  { "compute s", "compute_seconds", "%.0f" }, { "compute $", "compute_cost", "%.4f" },
  { "paused s", "paused_seconds", "%.0f" }, { "gc kills", "gc_kills", "%d" }, { "alive", "alive", "%d" },
}

--- Format reports (or sweep rows) as a text table, one line per row.
-- @tparam table rows a report or a list of them
-- @treturn string
function _M.format(rows)
  if type(rows) ~= "table" then error("bad argument #1 to 'format' (table expected, got " .. type(rows) .. ")", 2) end
  if rows.runs then rows = { rows } end
  local header = { rows[1] and rows[1].param or "policy" }
  for _, c in ipairs(COLUMNS) do header[#header + 1] = c[1] end
  local lines = { header }
  for _, r in ipairs(rows) do
    local line = { r.param and tostring(r.value) or tostring(r.policy) }
    for _, c in ipairs(COLUMNS) do
      local v = r[c[2]] or 0
      line[#line + 1] = string_format(c[3], c[3] == "%d" and math_floor(v) or v)
    end
    lines[#lines + 1] = line
  end
  local widths = {}
  for _, l in ipairs(lines) do
    for i, cell in ipairs(l) do widths[i] = math_max(widths[i] or 0, #cell) end
  end
  local out = {}
  for _, l in ipairs(lines) do
    local cells = {}
    for i, cell in ipairs(l) do
      cells[i] = i == 1 and cell .. (" "):rep(widths[i] - #cell) or (" "):rep(widths[i] - #cell) .. cell
    end
    out[#out + 1] = table_concat(cells, "  ")
  end
  local failures = {}
  for _, r in ipairs(rows) do
    local codes = {}
    for c, n in pairs(r.failures or {}) do codes[#codes + 1] = string_format("%s=%d", c, n) end
    table_sort(codes)
    if #codes > 0 then
      failures[#failures + 1] = string_format("failures (%s %s): %s", tostring(r.param or "policy"),
        tostring(r.param and r.value or r.policy), table_concat(codes, ", "))
    end
  end
  return table_concat(out, "\n") .. "\n" .. (#failures > 0 and table_concat(failures, "\n") .. "\n" or "")
end

--- An SVG chart of sweep rows (see `warmbox.sim.chart`).
-- @tparam table rows
-- @tparam[opt] table opts
-- @treturn string SVG text
function _M.chart(rows, opts)
  local svg = chart_mod.chart(rows, opts, 2)
  return svg
end

--- The E2B model (`warmbox.sim.model`).
_M.model = model_mod

return _M
