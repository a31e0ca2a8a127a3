--- warmbox.sim: the policy simulator.
--
-- Replays a trace (or a generated workload) of conversation turns against
-- the **same** `warmbox.session`, policy and `warmbox.gc` code a host runs,
-- with a virtual-time model of E2B (`warmbox.sim.model`) as the E2B client
-- and its virtual clock as the clock: leases run out, sandboxes pause and
-- resume, cold starts and round trips cost time, and nothing sleeps or
-- touches the network. GC passes run every `gc_every` seconds of virtual
-- time. The report counts cold starts, resumes and warm hits, the latency
-- warmbox added before the code ran, compute cost, paused storage and GC kills;
-- with a policy's checkpoint hooks (exact path only) the checkpoints taken,
-- pruned and their storage cost (`prices.snapshot_gib_month`).
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
local errors = require "warmbox.errors"
local model_mod = require "warmbox.sim.model"
local sim_lock = require "warmbox.sim.lock"
local fast_mod = require "warmbox.sim.fast"
local exact_mod = require "warmbox.sim.exact"
local workload_mod = require "warmbox.sim.workload"
local report_mod = require "warmbox.sim.report"
local task_mod = require "warmbox.task"

local type, pairs, ipairs, tostring, error, pcall = type, pairs, ipairs, tostring, error, pcall
local string_format, table_concat, math_floor, math_max = string.format, table.concat, math.floor, math.max
local math_type = math.type
local is_num, bad, trace_turns, check_workload = workload_mod.is_num, workload_mod.bad, workload_mod.trace_turns,
  workload_mod.check_workload

local _M = {}

-- The inputs (`warmbox.sim.workload`) and the output (`warmbox.sim.report`), as this module's names.
_M.prng, _M.parse_trace, _M.load_trace, _M.workload, _M.parse_csv_trace = workload_mod.prng,
  workload_mod.parse_trace, workload_mod.load_trace, workload_mod.workload, workload_mod.parse_csv_trace
_M.PRICES, _M.MONTH_HOURS, _M.percentile = report_mod.PRICES, report_mod.MONTH_HOURS, report_mod.percentile
_M.COLUMNS, _M.CSV_FIELDS, _M.csv, _M.format = report_mod.COLUMNS, report_mod.CSV_FIELDS, report_mod.csv,
  report_mod.format
_M.plot, _M.chart = report_mod.plot, report_mod.chart

-- ------------------------------------------------------------------
-- Built-in policies
-- ------------------------------------------------------------------

local CREATED_KEY = "warmboxCreatedAt"

--- The built-in policies `compare` runs side by side (`warmbox simulate --policies`).
-- * `reference`: E2B's documented flow (the seed's): a 5 minute lease
--   refreshed on every run, paused on timeout, resumed on traffic; GC kills a
--   sandbox `max_age` (24 h) after it was created, whatever its activity.
-- * `pause-per-turn`: the sandbox paused at the end of every turn (as
--   AutoGPT's copilot does to stop idle billing) and resumed by a connect at
--   the next: the cost floor of keeping a conversation's sandbox, a resume
--   on every turn.
-- * `no-reuse`: a fresh sandbox per call, killed after it (as before the
--   reference change); nothing survives a turn.
-- * `keep-alive`: one sandbox per conversation kept running
--   `max(exec_timeout, idle_timeout)` after each run (at least the run's timeout
--   + `LEASE_MARGIN`, as every lease), then killed (no pause).
-- * `default`: warmbox's default policy (pause after the idle window, GC by
--   last activity).
_M.POLICIES = {
  reference = { policy = {
    name = "reference",
    lease = function() return 300 end,
    should_refresh = function() return true end,
    create_params = function(ctx)
      return { template = ctx.template, timeout = ctx.lease, env_vars = ctx.env,
        metadata = { [ctx.tag] = ctx.tag_value, [CREATED_KEY] = string_format("%d", math_floor(ctx.now)) },
        lifecycle = { on_timeout = "pause", auto_resume = true } }
    end,
    gc = function(item, ctx)
      local created = item.metadata and tonumber(item.metadata[CREATED_KEY])
      if created and ctx.now - created > (ctx.max_age or 86400) then return "kill" end
      return "keep"
    end,
  } },
  ["no-reuse"] = { per_call = true, policy = {
    name = "no-reuse",
    lease = function(ctx) return ctx.exec_timeout end,
    create_params = function(ctx)
      return { template = ctx.template, timeout = ctx.lease, env_vars = ctx.env,
        metadata = { [ctx.tag] = ctx.tag_value }, lifecycle = { on_timeout = "kill" } }
    end,
  } },
  ["keep-alive"] = { policy = {
    name = "keep-alive",
    create_params = function(ctx)
      return { template = ctx.template, timeout = ctx.lease, env_vars = ctx.env,
        metadata = { [ctx.tag] = ctx.tag_value }, lifecycle = { on_timeout = "kill" } }
    end,
  } },
  ["pause-per-turn"] = { policy = { name = "pause-per-turn", pause_after_run = true } },
  default = { policy = { name = "default" } },
}
_M.POLICY_ORDER = { "reference", "pause-per-turn", "no-reuse", "keep-alive", "default" }

-- ------------------------------------------------------------------
-- run
-- ------------------------------------------------------------------

local RUN_KEYS = { trace = true, workload = true, policy = true, exec_timeout = true, idle_timeout = true,
  template = true, tag = true, prices = true, model = true, gc_every = true, max_age = true, tail = true,
  details = true, code = true, builtin = true, exact = true, prewarm = true, gc_full = true, size = true }

local function copy(t)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  return o
end


-- Raises unless run options' timeouts, max_age, tail, gc_every, template, tag and code are valid.
local function check_run_scalars(o, fname, level)
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
end

-- Raises unless run options' prices, model and workload tables are valid.
local function check_run_tables(o, fname, level)
  if o.prices ~= nil then
    if type(o.prices) ~= "table" then bad(fname, "'prices' must be a table", level) end
    for k, v in pairs(o.prices) do
      if _M.PRICES[k] == nil then bad(fname, "unknown price '" .. tostring(k) .. "'", level) end
      if not is_num(v) or v < 0 then bad(fname, "price '" .. k .. "' must be a number >= 0", level) end
    end
  end
  if o.size ~= nil then
    local sz = o.size
    if type(sz) ~= "table" or math_type(sz.cpu_count) ~= "integer" or sz.cpu_count < 1
      or math_type(sz.memory_mb) ~= "integer" or sz.memory_mb < 1 then
      bad(fname, "'size' must be { cpu_count = N, memory_mb = M } (integers >= 1)", level)
    end
  end
  if o.model ~= nil then
    if type(o.model) ~= "table" then bad(fname, "'model' must be a table", level) end
    local ok, err = pcall(model_mod.new, o.model)
    if not ok then bad(fname, (tostring(err):gsub("^[^:]*:%d+: ", "")), level) end
  end
  if o.workload ~= nil then
    local ok, err = pcall(check_workload, o.workload, 1)
    if not ok then error((tostring(err):gsub("^[^:]*:%d+: ", "")), level) end
  end
end

-- Raises unless run options' builtin, policy, exact and prewarm are valid.
local function check_run_choices(o, fname, level)
  if o.builtin ~= nil then
    if not _M.POLICIES[o.builtin] then
      bad(fname, "'builtin' must be one of " .. table_concat(_M.POLICY_ORDER, ", "), level)
    end
    if o.policy ~= nil then bad(fname, "give 'builtin' or 'policy', not both", level) end
  end
  if o.policy ~= nil and type(o.policy) ~= "table" and type(o.policy) ~= "string" then
    bad(fname, "'policy' must be a table, a path or nil", level)
  end
  if o.exact ~= nil and type(o.exact) ~= "boolean" then bad(fname, "'exact' must be a boolean", level) end
  if o.prewarm ~= nil and type(o.prewarm) ~= "boolean" and o.prewarm ~= "jit" then
    bad(fname, "'prewarm' must be a boolean or \"jit\"", level)
  end
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
  -- the helpers' errors count their own frame: level + 1 (and none is a tail call)
  check_run_scalars(o, fname, level + 1)
  check_run_tables(o, fname, level + 1)
  check_run_choices(o, fname, level + 1)
end

local function resolve_policy(o)
  if o.builtin then
    local b = _M.POLICIES[o.builtin]
    local p, err, code = policy_mod.resolve(b.policy)
    return p, err, code, b.per_call
  end
  if type(o.policy) == "table" and o.policy.name and o.policy.order and o.policy.lease
    and o.policy.should_refresh and o.policy.create_params and o.policy.gc then
    return o.policy
  end
  local ok, p, e, c = pcall(policy_mod.resolve, o.policy)
  if not ok then bad("run", (tostring(p):gsub("^[^:]*:%d+: ", "")), 4) end
  return p, e, c
end

-- A run's settings, defaults filled: exec_timeout, idle_timeout, template, tag, max_age, gc_every (false: none), code.
local function run_settings(o)
  local gc_every = o.gc_every
  if gc_every == nil then gc_every = 3600 end
  if gc_every == 0 then gc_every = false end
  return o.exec_timeout or 300, o.idle_timeout or 300, o.template or "code-interpreter-v1",
    o.tag or "warmboxSessionId", o.max_age or 86400, gc_every, o.code or "x = 1"
end

-- A run's prices: `PRICES` with the run's `prices` overrides.
local function run_prices(o)
  local prices = copy(_M.PRICES)
  for k, v in pairs(o.prices or {}) do prices[k] = v end
  return prices
end
-- The path a run takes (true: exact, false: fast), or nil, message, "BAD_REQUEST" when its options rule it out.
local function run_path(o, policy)
  local exact = o.exact
  local checkpoints = policy.checkpoint ~= nil or policy.checkpoint_gc ~= nil
  if exact == nil then exact = checkpoints or not fast_mod.supports(o.model) end
  if checkpoints and not exact then
    return nil, "checkpoints (the policy's checkpoint or checkpoint_gc hook) are modelled by the exact path "
      .. "only (give no exact = false)", "BAD_REQUEST"
  end
  if o.prewarm and exact then
    return nil, "prewarm is modelled by the fast path only (give exact = false, and no max_running or "
      .. "rate_per_s)", "BAD_REQUEST"
  end
  if not exact and not fast_mod.supports(o.model) then
    return nil, "the fast path does not model max_running or rate_per_s: use the exact path", "BAD_REQUEST"
  end
  return exact
end

-- A new report of a run: its counts at zero, its settings.
local function new_report(n, policy, exec_timeout, idle_timeout, max_age, gc_every, prices)
  return {
    turns = 0, runs = 0, ok = 0, failed = 0, failures = {}, errors = {},
    conversations = n, conversations_lost_state = 0, turns_lost_state = 0,
    cold_starts = 0, resumes = 0, warm_hits = 0,
    events = { create = 0, connect = 0, kill = 0, retry = 0 },
    gc_passes = 0, gc_kills = 0, gc_demoted = 0, gc_busy = 0, gc_errors = 0,
    policy = tostring(policy.name), exec_timeout = exec_timeout, idle_timeout = idle_timeout,
    max_age = max_age, gc_every = gc_every or 0, prices = prices,
  }
end

local function run(o)
  local convs, terr, tcode = workload_mod.conversations_of(o)
  if not convs then return nil, terr, tcode end
  local policy, perr, pcode, per_call = resolve_policy(o)
  if not policy then return nil, perr, pcode end
  local prices = run_prices(o)
  local start = (o.model and o.model.start) or model_mod.DEFAULTS.start
  local sched = task_mod.scheduler{ backend = task_mod.virtual(start) }
  local model = model_mod.new(o.model, sched)
  model.size = o.size
  model.keep_history = o.details and true or false
  local t0 = model.now
  local exec_timeout, idle_timeout, template, tag, max_age, gc_every, code = run_settings(o)
  local report = new_report(#convs, policy, exec_timeout, idle_timeout, max_age, gc_every, prices)
  local function note_error(c, msg)
    if #report.errors < 10 then report.errors[#report.errors + 1] = { code = c, message = msg } end
  end
  local function fail(c, msg)
    report.failed = report.failed + 1
    report.failures[c] = (report.failures[c] or 0) + 1
    note_error(c, msg)
  end
  local latencies = {}
  local log = o.details and {} or nil
  local tail = o.tail
  if tail == nil then
    -- Long enough for any lease: the run's timeout + LEASE_MARGIN, or the idle window.
    tail = math_max(exec_timeout + session_mod.LEASE_MARGIN, idle_timeout) + max_age + (gc_every or 0)
  end
  local exact, xerr, xcode = run_path(o, policy)
  if exact == nil then return nil, xerr, xcode end
  report.path = exact and "exact" or "fast"
  local X = { convs = convs, policy = policy, per_call = per_call, model = model,
    report = report, latencies = latencies, log = log, t0 = t0, exec_timeout = exec_timeout,
    idle_timeout = idle_timeout, template = template, tag = tag, env = {}, max_age = max_age,
    gc_every = gc_every, tail = tail, prewarm = o.prewarm == "jit" and "jit" or (o.prewarm and true or false),
    gc_full = o.gc_full == true, fail = fail, note_error = note_error }
  local horizon, nlat
  if not exact then
    horizon = fast_mod.simulate(X)
    nlat = #latencies
  else
    X.sched, X.clock, X.new_lock, X.code = sched, model:clock(), sim_lock.factory(sched), code
    horizon, nlat = exact_mod.simulate(X)
  end
  model:advance_to(math_max(horizon, model:clock()()))
  return report_mod.finish_report(report, o, model, prices, latencies, nlat, log, t0)
end

--- Simulate a trace or a workload.
-- Each conversation is a `warmbox.task` on a virtual clock: turns of
-- different conversations overlap, one conversation's turns run one after
-- another (a turn due while the previous one runs starts when it ends).
-- @tparam table opts `trace` (a path or a table of turns) or `workload` (see
--   `workload`); `policy` (nil | partial table | path, as `warmbox.new`) or
--   `builtin` (a name of `POLICIES`);
--   `exec_timeout` (300), `idle_timeout` (300), `template`
--   ("code-interpreter-v1"), `tag` ("warmboxSessionId"), `code` (the cell each
--   turn runs, "x = 1"); `prices` (overrides of `PRICES`); `model` (overrides of
--   `warmbox.sim.model.DEFAULTS`: `rtt_ms`, `create_ms`, `kernel_ms`, `resume_ms`,
--   `pause_ms`, `max_length_hours`, `max_running`, `rate_per_s`, ...); `gc_every`
--   (3600 s of virtual time; 0 or false: no GC), `max_age` (86400, given to GC),
--   `tail` (seconds simulated after the last run ends, default
--   `max(exec_timeout + 5, idle_timeout) + max_age + gc_every` (the default lease,
--   the age and one GC period): long enough for the default GC policy to reclaim
--   every abandoned sandbox), `details` (add
--   `sandboxes`, `latencies_ms` and `log`: one record per run in the order runs
--   ended, `{ session, due, start, code_started, finish, ok, code, created, resumed }`,
--   times in seconds from the start)
-- @treturn[1] table report: `conversations, turns, runs, ok, failed, failures = { CODE = n },
--   errors, cold_starts, resumes, warm_hits, conversations_lost_state, turns_lost_state,
--   p50_ms, p95_ms, p99_ms, mean_ms, max_ms` (virtual ms warmbox added before the code
--   ran), `compute_seconds, compute_cost, paused_seconds, paused_hours, storage_cost, cost,
--   created, model_resumes, pauses, kills, timeout_kills, requests, requests_per_run,
--   auto_pauses, paused_during_run, rejected_cap, rejected_rate, retries, peak_running,
--   gc_passes, gc_kills, gc_demoted, gc_busy, gc_errors, checkpoints_taken, checkpoints_deleted,
--   peak_checkpoints, checkpoints_alive, checkpoint_gib_hours, checkpoint_cost, alive, alive_running,
--   alive_paused, events = { create, connect, kill, retry }, simulated_seconds, policy,
--   exec_timeout, idle_timeout, max_age, gc_every, prices`
-- @return[2] nil, message, code ("NOT_FOUND" or "BAD_REQUEST" for a trace, "POLICY")
function _M.run(opts)
  check_run_opts(opts, "run", 3)
  local report, err, code = run(opts)
  return report, err, code
end

--- Run the same workload once per built-in policy (`POLICIES`).
-- @tparam table base run options (as `run`, without `policy`/`builtin`)
-- @tparam[opt] table names policy names (default: all, in `POLICY_ORDER`)
-- @treturn[1] table rows: one report per policy, each with `param = "policy"` and `value`
-- @return[2] nil, message, code
function _M.compare(base, names)
  check_run_opts(base, "compare", 3)
  if base.policy ~= nil or base.builtin ~= nil then
    error("bad argument #1 to 'compare' (give no 'policy' or 'builtin': compare runs the built-in ones)", 2)
  end
  names = names or _M.POLICY_ORDER
  if type(names) ~= "table" or #names == 0 then
    error("bad argument #2 to 'compare' (a non-empty list of policy names expected)", 2)
  end
  for _, n in ipairs(names) do
    if not _M.POLICIES[n] then
      error("bad argument #2 to 'compare' (unknown policy '" .. tostring(n) .. "'; known: "
        .. table_concat(_M.POLICY_ORDER, ", ") .. ")", 2)
    end
  end
  local shared = copy(base)
  if base.trace then
    local turns, terr, tcode = trace_turns(base)
    if not turns then return nil, terr, tcode end
    shared.trace = turns
  end
  local rows = {}
  for i, n in ipairs(names) do
    local o = copy(shared)
    o.builtin = n
    local r, err, code = run(o)
    if not r then return nil, err, code end
    r.param, r.value = "policy", n
    rows[i] = r
  end
  return rows
end

-- ------------------------------------------------------------------
-- sweep
-- ------------------------------------------------------------------

local SWEEPABLE = { exec_timeout = true, idle_timeout = true, max_age = true, gc_every = true, tail = true,
  prewarm = true }

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
  -- One workload for every row (a generated one is drawn again from its seed).
  local shared = copy(base)
  if base.trace then
    local turns, terr, tcode = trace_turns(base)
    if not turns then return nil, terr, tcode end
    shared.trace = turns
  end
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

--- The E2B model (`warmbox.sim.model`).
_M.model = model_mod

return _M
