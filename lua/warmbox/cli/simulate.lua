--- `warmbox simulate`: replay a trace or a generated workload against a
-- virtual-time model of E2B (warmbox.sim), one row per setting.
local pairs = pairs
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

-- `--policies all|P,P...`: the built-in policies to compare, in order.
local function policies_arg(sim, v)
  if v == "all" then return { table.unpack(sim.POLICY_ORDER) } end
  local policies = {}
  for item in (v .. ","):gmatch("([^,]*),") do
    if not sim.POLICIES[item] then
      error("unknown policy '" .. item .. "' to --policies (known: " .. table.concat(sim.POLICY_ORDER, ", ")
        .. ", all)", 0)
    end
    policies[#policies + 1] = item
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
      local map, values = { on = true, off = false }, {}
      for item in (v .. ","):gmatch("([^,]*),") do
        if map[item] == nil then error("option --prewarm needs on, off or off,on, got '" .. v .. "'", 0) end
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

--- The command: status 0 or 2.
function _M.execute(o, args, io_)
  local sim = require "warmbox.sim"
  local st = simulate_args(o, args, sim)
  local opts, workload, model, sweep, policies = st.opts, st.workload, st.model, st.sweep, st.policies
  local chart, chart_x, chart_y, csv = st.chart, st.chart_x, st.chart_y, st.csv
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
    if sweep then error("give --policies or a list of values, not both", 0) end
    if opts.policy then error("give --policies or --policy, not both", 0) end
    rows, msg, code = sim.compare(opts, policies)
  elseif sweep then
    rows, msg, code = sim.sweep(opts, sweep)
  else
    local r
    r, msg, code = sim.run(opts)
    rows = r and { r }
  end
  if not rows then return fail(io_.stderr, msg, code) end
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
    local how, perr, pcode = sim.plot(rows, chart, { x = chart_x, y = chart_y })
    if not how then return fail(io_.stderr, perr, pcode) end
    note(io_, string_format("warmbox: chart written to %s%s\n", chart,
      how == "gnuplot" and " (gnuplot)" or ""))
  end
  return 0
end

return _M
