--- `warmbox simulate`: replay a trace or a generated workload against a
-- virtual-time model of E2B (warmbox.sim), one row per setting.
local pairs, ipairs, tostring = pairs, ipairs, tostring
local string_format = string.format

local args_ = require "warmbox.cli.args"
local common = require "warmbox.cli.common"

local parse_args, number_arg = args_.parse_args, args_.number_arg
local fail, note = common.fail, common.note

local _M = {}

local SIM_LISTS = { ["--idle-timeout"] = "idle_timeout", ["--exec-timeout"] = "exec_timeout",
  ["--max-age"] = "max_age", ["--gc-every"] = "gc_every" }
local SIM_MODEL = { ["--rtt-ms"] = "rtt_ms", ["--create-ms"] = "create_ms", ["--kernel-ms"] = "kernel_ms",
  ["--resume-ms"] = "resume_ms", ["--max-length-hours"] = "max_length_hours", ["--max-running"] = "max_running",
  ["--rate"] = "rate_per_s", ["--retry-after"] = "retry_after", ["--snapshot-ms"] = "snapshot_ms",
  ["--snapshot-gb"] = "snapshot_gb" }
local SIM_WORKLOAD = { ["--sessions"] = "sessions", ["--turns"] = "turns", ["--gap"] = "gap",
  ["--duration"] = "duration", ["--think"] = "think", ["--span"] = "span", ["--seed"] = "seed",
  ["--abandon"] = "abandon", ["--lead"] = "lead", ["--no-run"] = "no_run" }
local SIM_DISTS = { lognormal = { "median", "sigma" }, pareto = { "alpha", "min" }, exp = { "mean" } }
local SIM_INTEGER = { sessions = true, turns = true, seed = true }
local SIM_RANGE = { turns = true, duration = true, gap = true }

-- `--x a,b,...` read by `each`: one value sets `opts[k]`; several make the sweep
-- (only one option may list several values).
local function set_or_sweep(st, k, values)
  if #values == 1 then
    st.opts[k] = values[1]
    return
  end
  if st.sweep and st.sweep.param ~= k then error("only one option may list several values", 0) end
  st.sweep = { param = k, values = values }
end

-- A workload value of option `flag` for key `k`: a number, a range A-B (for
-- SIM_RANGE keys) or a distribution NAME:P1[:P2].
local function workload_value(flag, k, v)
  local lo, hi = v:match("^([^-]+)%-([^-]+)$")
  local dname, dargs = v:match("^(%a+):(.*)$")
  if dname then
    local names = SIM_DISTS[dname]
    if not names then error("option " .. flag .. ": unknown distribution '" .. dname .. "'", 0) end
    local d, n = { dist = dname }, 0
    for item in (dargs .. ":"):gmatch("([^:]*):") do
      n = n + 1
      if not names[n] then error("option " .. flag .. ": too many parameters for " .. dname, 0) end
      d[names[n]] = number_arg(flag, item)
    end
    if n < #names then error("option " .. flag .. ": " .. dname .. " needs " .. table.concat(names, ":"), 0) end
    return d
  elseif lo and SIM_RANGE[k] then
    return { number_arg(flag, lo, SIM_INTEGER[k]), number_arg(flag, hi, SIM_INTEGER[k]) }
  end
  return number_arg(flag, v, SIM_INTEGER[k])
end

-- `--policies all|P,P...`: the policies to compare, in order: built-in names
-- (`all`: every one) and policy files (a path: it has a "/" or ends in ".lua").
-- → { { builtin = name } | { path = file }, ... }
local function policies_arg(sim, v)
  local policies = {}
  for item in (v .. ","):gmatch("([^,]*),") do
    if item == "all" then
      for _, n in ipairs(sim.POLICY_ORDER) do policies[#policies + 1] = { builtin = n } end
    elseif sim.POLICIES[item] then
      policies[#policies + 1] = { builtin = item }
    elseif item:find("/", 1, true) or item:match("%.lua$") then
      policies[#policies + 1] = { path = item }
    else
      error("unknown policy '" .. item .. "' to --policies (known: " .. table.concat(sim.POLICY_ORDER, ", ")
        .. ", all, or a policy file: a path with a '/' or ending in .lua)", 0)
    end
  end
  return policies
end

-- simulate's arguments: `{ opts, workload, model, sweep, policies, chart, chart_x, chart_y, csv }`.
local function simulate_args(o, args, sim)
  local st = { opts = { exec_timeout = o.exec_timeout, idle_timeout = o.idle_timeout, policy = o.policy,
    template = o.template, tag = o.tag } }
  local opts = st.opts
  local function workload() st.workload = st.workload or {} return st.workload end
  local flags = {
    ["--trace"] = function(v) opts.trace = v end,
    ["--events"] = function(v) st.events = v end,
    ["--policy"] = function(v) opts.policy = v end,
    ["--chart"] = function(v) st.chart = v end,
    ["--chart-x"] = function(v) st.chart_x = v end,
    ["--chart-y"] = function(v) st.chart_y = v end,
    ["--tail"] = function(v, a) opts.tail = number_arg(a, v) end,
    ["--csv"] = function(v) st.csv = v end,
    ["--policies"] = function(v) st.policies = policies_arg(sim, v) end,
    ["--exact"] = { function() opts.exact = true end },
    ["--prewarm"] = function(v)
      local map, values = { on = true, off = false, jit = "jit" }, {}
      for item in (v .. ","):gmatch("([^,]*),") do
        if map[item] == nil then
          error("option --prewarm needs on, off, jit or a list (off,on,jit), got '" .. v .. "'", 0)
        end
        values[#values + 1] = map[item]
      end
      set_or_sweep(st, "prewarm", values)
    end,
    ["--paused-price"] = function(v, a)
      opts.prices = opts.prices or {}
      opts.prices.paused_second = number_arg(a, v) / 3600
    end,
    ["--snapshot-price"] = function(v, a)
      opts.prices = opts.prices or {}
      opts.prices.snapshot_gib_month = number_arg(a, v)
    end,
    ["--arrival"] = function(v) workload().arrival = v end,
  }
  for flag, k in pairs(SIM_LISTS) do
    flags[flag] = function(v, a)
      local values = {}
      for item in (v .. ","):gmatch("([^,]*),") do values[#values + 1] = number_arg(a, item) end
      set_or_sweep(st, k, values)
    end
  end
  for flag, k in pairs(SIM_MODEL) do
    flags[flag] = function(v, a)
      st.model = st.model or {}
      st.model[k] = number_arg(a, v)
    end
  end
  for flag, k in pairs(SIM_WORKLOAD) do
    flags[flag] = function(v, a) workload()[k] = workload_value(a, k, v) end
  end
  parse_args(args, "simulate", flags)
  return st
end

-- The rows of one configuration: the sweep's when a list of values is given,
-- else one run's. → rows | nil, msg, code
local function run_rows(sim, opts, sweep)
  if sweep then return sim.sweep(opts, sweep) end
  local r, msg, code = sim.run(opts)
  if not r then return nil, msg, code end
  return { r }
end

-- The rows of the policies compared (`--policies`, and `--policy FILE` beside
-- them): a run each, or the sweep for each when a list of values is given
-- (`series` names the policy of each row). → rows | nil, msg, code
local function compare_rows(sim, opts, policies, sweep)
  local rows = {}
  for _, p in ipairs(policies) do
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.builtin, o.policy = p.builtin, p.path
    local got, msg, code = run_rows(sim, o, sweep)
    if not got then return nil, msg, code end
    for _, r in ipairs(got) do
      local name = p.builtin or r.policy or p.path
      if sweep then r.series = name else r.param, r.value = "policy", name end
      rows[#rows + 1] = r
    end
  end
  return rows
end

-- The first error a raising (or misbehaving) policy hook gave, and in how many
-- runs: `POLICY` failures and GC errors. → message | nil
local function policy_error(rows)
  for _, r in ipairs(rows) do
    for _, e in ipairs(r.errors or {}) do
      if e.code == "POLICY" then
        local n = (r.failures or {}).POLICY or 0
        return string_format("%s (%d of %d runs failed%s)", tostring(e.message), n, r.runs or 0,
          (r.gc_errors or 0) > 0 and string_format(", %d GC errors", r.gc_errors) or "")
      end
    end
  end
  return nil
end

-- The chart's axes must be numbers of the report: a clean error otherwise.
local function check_chart_axes(rows, st)
  local known = require("warmbox.sim.chart").metrics(rows)
  local set = {}
  for _, k in ipairs(known) do set[k] = true end
  for flag, k in pairs({ ["--chart-x"] = st.chart_x, ["--chart-y"] = st.chart_y }) do
    if not set[k] then
      error(string_format("%s: '%s' is not a number of the report (one of: %s)", flag, k,
        table.concat(known, ", ")), 0)
    end
  end
end

-- `--events FILE`: the recorded lifecycle events as the trace (and the size most runs had).
-- The header's label | false, msg, code.
local function events_trace(st, opts)
  if not st.events then return opts.trace end
  if opts.trace then error("give --trace or --events, not both", 0) end
  local ev = require "warmbox.sim.events"
  local list, emsg, ecode = ev.load(st.events)
  if not list then return false, emsg, ecode end
  local turns, info = ev.trace(list, { tag = opts.tag })
  if not turns then return false, info, "BAD_REQUEST" end
  opts.trace, opts.size = turns, opts.size or info.size
  return "events " .. st.events
end

--- The command: status 0 or 2 (also when a policy hook raised: its first error on stderr).
function _M.execute(o, args, io_)
  local sim = require "warmbox.sim"
  local st = simulate_args(o, args, sim)
  local opts, workload, model, sweep, policies = st.opts, st.workload, st.model, st.sweep, st.policies
  local chart, csv = st.chart, st.csv
  local label, emsg, ecode = events_trace(st, opts)
  if label == false then return fail(io_.stderr, emsg, ecode) end
  if opts.trace and workload then error("give --trace or a generated workload (--sessions ...), not both", 0) end
  if not opts.trace then
    workload = workload or {}
    workload.sessions = workload.sessions or 20
    opts.workload = workload
  end
  opts.model = model
  local rows, msg, code
  if policies then
    -- --policy FILE sits beside the policies compared
    if opts.policy then policies[#policies + 1] = { path = opts.policy } end
    opts.policy = nil
    rows, msg, code = compare_rows(sim, opts, policies, sweep)
  else
    rows, msg, code = run_rows(sim, opts, sweep)
  end
  if not rows then return fail(io_.stderr, msg, code) end
  st.chart_x, st.chart_y = st.chart_x or "compute_cost", st.chart_y or "p95_ms"
  if chart then check_chart_axes(rows, st) end
  local r1 = rows[1]
  local function shown(k)
    if sweep and sweep.param == k then return "(swept)" end
    return string_format("%gs", r1[k])
  end
  io_.stdout:write(string_format("%s: %d conversations, %d turns, exec timeout %s, idle timeout %s, max age %s, "
    .. "GC every %s, policy %s, %s path\n", label or "generated workload", r1.conversations, r1.turns,
    shown("exec_timeout"), shown("idle_timeout"), shown("max_age"), shown("gc_every"),
    policies and "(compared)" or r1.policy, r1.path))
  io_.stdout:write(sim.format(rows))
  if csv then
    local f, ferr = io.open(csv, "wb")
    if not f then return fail(io_.stderr, "cannot write " .. csv .. ": " .. tostring(ferr), "IO") end
    f:write(sim.csv(rows))
    f:close()
    note(io_, string_format("warmbox: rows written to %s\n", csv))
  end
  if chart then
    local how, perr, pcode = sim.plot(rows, chart, { x = st.chart_x, y = st.chart_y })
    if not how then return fail(io_.stderr, perr, pcode) end
    note(io_, string_format("warmbox: chart written to %s%s\n", chart, how ~= "svg" and " (" .. how .. ")" or ""))
  end
  local perr = policy_error(rows)
  if perr then return fail(io_.stderr, perr, "POLICY") end
  return 0
end

return _M
