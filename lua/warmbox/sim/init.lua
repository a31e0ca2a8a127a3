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
local gc_mod = require "warmbox.gc"
local json = require "warmbox.json"
local errors = require "warmbox.errors"
local model_mod = require "warmbox.sim.model"
local sim_lock = require "warmbox.sim.lock"
local chart_mod = require "warmbox.sim.chart"
local fast_mod = require "warmbox.sim.fast"
local gc_cp_mod = require "warmbox.gc_checkpoints"

local type, pairs, ipairs, tostring, error, pcall, setmetatable =
  type, pairs, ipairs, tostring, error, pcall, setmetatable
local string_format, table_sort, table_concat, math_floor, math_ceil, math_log, math_max, math_huge =
  string.format, table.sort, table.concat, math.floor, math.ceil, math.log, math.max, math.huge
local io_open, math_type = io.open, math.type
local math_exp, math_sqrt, math_cos = math.exp, math.sqrt, math.cos
local task_mod = require "warmbox.task"

local _M = {}

--- E2B's published rates (its pricing page, FAQ "How do I calculate the price of a
-- sandbox?": billed per second while running, $0.000014 per vCPU-second and
-- $0.0000045 per GiB-second; "Paused and killed sandboxes are not billed").
-- A sandbox's size comes from its template (`sim.model.TEMPLATE_SIZES`) or
-- the run's `size`; `paused_second` prices paused storage for other providers
-- or checkpoint storage (0 at E2B).
_M.PRICES = {
  vcpu_second = 0.000014,   -- $ per vCPU-second while running
  gib_second = 0.0000045,   -- $ per GiB-RAM-second while running
  paused_second = 0,        -- $ per paused sandbox-second (E2B: not billed)
  -- $ per GiB-month (730 h) a checkpoint (persistent snapshot) stores: E2B's pricing page and
  -- its FAQ "How do I calculate the price of a sandbox?" name no price for snapshots (disk is
  -- "Included"), so 0 unless given
  snapshot_gib_month = 0,
}
--- Hours in the month `snapshot_gib_month` prices (730: a year's 8760 / 12, as cloud storage bills).
_M.MONTH_HOURS = 730

local function is_num(v) return type(v) == "number" and v == v and v > -math_huge and v < math_huge end

local function bad(fname, msg, level)
  error(string_format("bad argument #1 to '%s' (%s)", fname, msg), level + 1)
end

-- ------------------------------------------------------------------
-- A deterministic PRNG (splitmix64), independent of math.random
-- ------------------------------------------------------------------

-- A generator is one table (its state) with methods: a conversation each,
-- so a large workload makes no closures per conversation.
local Prng = {}
Prng.__index = Prng

--- A float in [0, 1).
function Prng:next()
  local s = self.s + 0x9E3779B97F4A7C15
  self.s = s
  local z = (s ~ (s >> 30)) * 0xBF58476D1CE4E5B9
  z = (z ~ (z >> 27)) * 0x94D049BB133111EB
  z = z ~ (z >> 31)
  return (z >> 11) * (1.0 / 9007199254740992)
end
function Prng:uniform(a, b) return a + (b - a) * self:next() end
function Prng:int(a, b) return a + math_floor((b - a + 1) * self:next()) end
function Prng:exp(mean) return -mean * math_log(1 - self:next()) end
--- A standard normal deviate (Box-Muller).
function Prng:normal()
  local u = 1 - self:next()
  return math_sqrt(-2 * math_log(u)) * math_cos(2 * math.pi * self:next())
end

local function prng(seed)
  return setmetatable({ s = math_floor(seed) ~ 0x5DEECE66D }, Prng)
end
_M.prng = prng

-- ------------------------------------------------------------------
-- Inputs: trace files and generated workloads
-- ------------------------------------------------------------------

local TURN_KEYS = { t = true, session = true, duration = true, timeout = true, language = true, lead = true,
  run = true }

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
  if e.lead ~= nil and (not is_num(e.lead) or e.lead < 0) then
    return nil, where .. ": 'lead' must be a number of seconds >= 0"
  end
  if e.run ~= nil and type(e.run) ~= "boolean" then return nil, where .. ": 'run' must be true or false" end
  return { t = e.t, session = e.session, duration = d, timeout = e.timeout, language = e.language,
    lead = e.lead, run = e.run }
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

--- Read and parse a trace file: JSON lines, or CSV when the name ends in `.csv`
-- (a header naming the columns `t, session, duration, timeout, language`).
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
  if path:lower():match("%.csv$") then return _M.parse_csv_trace(text) end
  return _M.parse_trace(text)
end

-- ------------------------------------------------------------------
-- Distributions (documented in the README: parameters and their meaning)
-- ------------------------------------------------------------------

local DISTS = { exp = { mean = true }, lognormal = { median = true, sigma = true, max = true },
  pareto = { alpha = true, min = true, max = true } }

-- Raises unless `v` is a valid distribution table for the value `name` (check_value's part).
local function check_dist(v, name)
  local keys = DISTS[v.dist]
  if not keys then bad("workload", "'" .. name .. ".dist' must be exp, lognormal or pareto", 5) end
  for k, x in pairs(v) do
    if k ~= "dist" then
      if not keys[k] then bad("workload", "unknown parameter '" .. name .. "." .. tostring(k) .. "'", 5) end
      if not is_num(x) or x < 0 then bad("workload", "'" .. name .. "." .. k .. "' must be a number >= 0", 5) end
    end
  end
  local need = v.dist == "exp" and { "mean" } or v.dist == "lognormal" and { "median", "sigma" }
    or { "alpha", "min" }
  for _, k in ipairs(need) do
    if v[k] == nil then bad("workload", "'" .. name .. "' needs '" .. k .. "'", 5) end
  end
  if v.dist == "pareto" and v.alpha <= 0 then bad("workload", "'" .. name .. ".alpha' must be > 0", 5) end
end

-- A value spec: a number, a {min, max} uniform range, or a distribution
-- table `{ dist = "exp" | "lognormal" | "pareto", ... }`. Raises on misuse.
local function check_value(v, name, integer)
  if is_num(v) and v >= 0 then return end
  if type(v) == "table" and v.dist == nil then
    if is_num(v[1]) and is_num(v[2]) and v[1] >= 0 and v[2] >= v[1] then
      if integer and (math_type(v[1]) ~= "integer" or math_type(v[2]) ~= "integer") then
        bad("workload", "'" .. name .. "' must be integers", 4)
      end
      return
    end
  elseif type(v) == "table" then
    check_dist(v, name)  -- not a tail call: the error levels count this frame
    return
  end
  bad("workload", "'" .. name .. "' must be a number >= 0, a {min, max} range or a distribution", 4)
end

-- Draw a value: `plain` says what a bare number means ("fixed" or "exp").
local function draw(r, v, plain)
  if type(v) == "number" then
    if plain == "exp" then return r:exp(v) end
    return v
  end
  local d = v.dist
  local x
  if d == nil then return r:uniform(v[1], v[2])
  elseif d == "exp" then x = r:exp(v.mean)
  elseif d == "lognormal" then x = v.median * math_exp(v.sigma * r:normal())
  else x = v.min / (1 - r:next()) ^ (1 / v.alpha) end
  if v.max and x > v.max then x = v.max end
  return x
end

local function draw_count(r, v)
  if type(v) == "number" then return math_floor(v) end
  if v.dist == nil then return r:int(v[1], v[2]) end
  return math_max(1, math_floor(draw(r, v) + 0.5))
end

-- ------------------------------------------------------------------
-- Generated workloads
-- ------------------------------------------------------------------

local WORKLOAD_KEYS = { sessions = true, turns = true, gap = true, think = true, duration = true, span = true,
  seed = true, prefix = true, arrival = true, abandon = true, lead = true, no_run = true }

-- Raises unless a workload's optional seed, prefix, arrival, abandon and no_run are valid.
local function check_workload_options(w, level)
  if w.seed ~= nil and math_type(w.seed) ~= "integer" then bad("workload", "'seed' must be an integer", level) end
  if w.prefix ~= nil and type(w.prefix) ~= "string" then bad("workload", "'prefix' must be a string", level) end
  if w.arrival ~= nil and w.arrival ~= "uniform" and w.arrival ~= "poisson" then
    bad("workload", "'arrival' must be \"uniform\" or \"poisson\"", level)
  end
  if w.abandon ~= nil and (not is_num(w.abandon) or w.abandon < 0 or w.abandon >= 1) then
    bad("workload", "'abandon' must be a probability in [0, 1)", level)
  end
  if w.no_run ~= nil and (not is_num(w.no_run) or w.no_run < 0 or w.no_run > 1) then
    bad("workload", "'no_run' must be a probability in [0, 1]", level)
  end
end

local function check_workload(w, level)
  if type(w) ~= "table" then error("bad argument #1 to 'workload' (table expected, got " .. type(w) .. ")", level) end
  errors.check_options(w, WORKLOAD_KEYS, "workload", 1, level)
  local n = w.sessions
  if math_type(n) ~= "integer" or n < 0 then bad("workload", "'sessions' must be an integer >= 0", level) end
  check_value(w.turns or { 1, 10 }, "turns", true)
  check_value(w.gap or 300, "gap")
  check_value(w.duration or 2, "duration")
  check_value(w.think or 0, "think")
  check_value(w.lead or 0, "lead")
  local span = w.span or 3600
  if not is_num(span) or span < 0 then bad("workload", "'span' must be a number >= 0", level) end
  check_workload_options(w, level + 1)  -- not a tail call: the error levels count this frame
end

-- The conversations of a workload in order of arrival: a list of
-- `{ key, start, seed }` (each conversation's turns are drawn from its own
-- PRNG, so they do not depend on the order tasks run in).
local function arrivals(w)
  local seed = w.seed or 1
  local r = prng(seed)
  local n, span, prefix = w.sessions, w.span or 3600, w.prefix or "conv-"
  local convs = {}
  if w.arrival == "poisson" then
    local t, mean = 0, n > 0 and span / n or 0
    for i = 1, n do
      t = t + r:exp(mean)
      convs[i] = { key = prefix .. i, start = t, seed = (seed << 24) ~ i }
    end
  else
    for i = 1, n do convs[i] = { key = prefix .. i, start = r:uniform(0, span), seed = (seed << 24) ~ i } end
    table_sort(convs, function(a, b) return a.start < b.start or (a.start == b.start and a.seed < b.seed) end)
  end
  return convs
end

-- Iterator over one generated conversation's turns: t (the run's time,
-- relative to the simulation's start), duration, nil, nil, lead, runs. A
-- turn starts, its run comes `lead` seconds later (the model's thinking
-- time); the next turn starts `think` plus `gap` after the run's planned end
-- (its time plus its duration, so every policy sees the same times); a turn
-- runs no code with probability `no_run`; after each turn the user leaves
-- with probability `abandon`. Draws only what is set, so a workload without
-- `lead` or `no_run` gives the same turns as before they existed.
-- A generator is one table: the PRNG's state (`s`, so Prng's methods work on
-- it), the workload's settings and where the conversation is. Kept as one
-- table (not a closure with a dozen upvalues) because a large simulation
-- touches each conversation's once per turn, far apart in time.
local Gen = setmetatable({}, { __index = Prng })
Gen.__index = Gen

--- The next turn: t, duration, nil, nil, lead, runs | nil when done.
function Gen:turn()
  local i, count = self.i, self.count
  if i >= count then return nil end
  if i > 0 then
    local abandon = self.abandon
    if abandon > 0 and self:next() < abandon then self.i = count; return nil end
    self.st = self.st + self.l + self.d + draw(self, self.think, "fixed") + draw(self, self.gap, "exp")
  end
  self.i = i + 1
  local d = draw(self, self.dur, "fixed")
  local lead = self.lead
  local l = lead ~= 0 and draw(self, lead, "fixed") or 0
  self.d, self.l = d, l
  local runs = true
  local no_run = self.no_run
  if no_run > 0 and self:next() < no_run then runs = false end
  return self.st + l, d, nil, nil, l, runs
end

local function conv_gen(w, conv)
  local g = setmetatable({ s = math_floor(conv.seed) ~ 0x5DEECE66D }, Gen)
  g.count = draw_count(g, w.turns or { 1, 10 })
  g.dur, g.gap, g.think, g.abandon = w.duration or 2, w.gap or 300, w.think or 0, w.abandon or 0
  g.lead, g.no_run = w.lead or 0, w.no_run or 0
  g.i, g.st, g.d, g.l = 0, conv.start, 0, 0
  return g
end

-- A trace's conversation as a generator.
local TraceGen = {}
TraceGen.__index = TraceGen
function TraceGen:turn()
  local i = self.i + 1
  self.i = i
  local e = self.list[i]
  if not e then return nil end
  return e.t, e.duration, e.timeout, e.language, e.lead, e.run
end

local function conv_turns(w, conv)
  local g = conv_gen(w, conv)
  return function() return g:turn() end
end


--- Generate a workload's turns (deterministic for a seed).
-- `sessions` conversations arrive within `span` seconds (3600): uniformly
-- (`arrival = "uniform"`, the default) or as a Poisson process of rate
-- `sessions / span` (`"poisson"`). Each has `turns` turns (`{1, 10}`); a
-- turn's code runs `duration` seconds (2); the next turn comes `think`
-- seconds (0) plus `gap` (300) after a turn's end; after each turn the user
-- abandons the conversation with probability `abandon` (0). A value is a
-- number (`gap`: the mean of an exponential; others: fixed), a `{min, max}`
-- uniform range, or a distribution: `{ dist = "exp", mean }`,
-- `{ dist = "lognormal", median, sigma [, max] }`, `{ dist = "pareto", alpha,
-- min [, max] }` (turn counts are rounded, at least 1). `seed` (1) seeds
-- the PRNG; session keys are `prefix .. i` (`"conv-"`).
-- @tparam table w
-- @treturn table turns, sorted by `t`
function _M.workload(w)
  check_workload(w, 3)
  local turns = {}
  for _, conv in ipairs(arrivals(w)) do
    local nextt = conv_turns(w, conv)
    local t, d, _, _, l, runs = nextt()
    while t do
      local turn = { t = t, session = conv.key, duration = d, lead = l ~= 0 and l or nil }
      if not runs then turn.run = false end
      turns[#turns + 1] = turn
      t, d, _, _, l, runs = nextt()
    end
  end
  return sort_turns(turns)
end

-- ------------------------------------------------------------------
-- Built-in policies
-- ------------------------------------------------------------------

local CREATED_KEY = "warmboxCreatedAt"

--- The built-in policies `compare` runs side by side (`warmbox simulate --policies`).
-- * `reference`: E2B's documented flow: a 5 minute lease paused on timeout,
--   resumed on traffic; GC kills a sandbox `max_age` (24 h) after it was
--   created, whatever its activity.
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
  default = { policy = { name = "default" } },
}
_M.POLICY_ORDER = { "reference", "no-reuse", "keep-alive", "default" }

-- ------------------------------------------------------------------
-- CSV traces and rows
-- ------------------------------------------------------------------

-- A CSV trace: a header line naming the columns (t, session, duration,
-- timeout, language; t and session required), then one turn per line;
-- fields are plain (no quotes, no commas inside a field).
local function parse_csv_trace(text)
  local turns, header, n = {}, nil, 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    line = line:gsub("\r$", "")
    if line:find("%S") and not line:match("^%s*#") then
      if line:find('"', 1, true) then
        return nil, string_format("trace line %d: quoted CSV fields are not supported", n), "BAD_REQUEST"
      end
      local fields = {}
      for f in (line .. ","):gmatch("([^,]*),") do fields[#fields + 1] = f:match("^%s*(.-)%s*$") end
      if not header then
        header = fields
        local seen = {}
        for _, h in ipairs(header) do
          if not TURN_KEYS[h] then
            return nil, string_format("trace line %d: unknown column '%s'", n, h), "BAD_REQUEST"
          end
          seen[h] = true
        end
        if not seen.t or not seen.session then
          return nil, string_format("trace line %d: the header needs the columns t and session", n), "BAD_REQUEST"
        end
      else
        if #fields ~= #header then
          return nil, string_format("trace line %d: %d fields, the header has %d", n, #fields, #header), "BAD_REQUEST"
        end
        local e = {}
        for i, h in ipairs(header) do
          local f = fields[i]
          if f ~= "" then
            if h == "session" or h == "language" then
              e[h] = f
            elseif h == "run" then
              if f == "true" or f == "1" then e[h] = true elseif f == "false" or f == "0" then e[h] = false
              else e[h] = f end
            else
              e[h] = tonumber(f) or f
            end
          end
        end
        local turn, err = check_turn(e, "trace line " .. n)
        if not turn then return nil, err, "BAD_REQUEST" end
        turns[#turns + 1] = turn
      end
    end
  end
  return sort_turns(turns)
end
_M.parse_csv_trace = parse_csv_trace

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

--- The nearest-rank percentile of a sorted list (nil when empty).
function _M.percentile(sorted, p)
  local n = #sorted
  if n == 0 then return nil end
  local k = math_ceil(p / 100 * n)
  if k < 1 then k = 1 end
  return sorted[k]
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
  for _, k in ipairs{ "exact", "prewarm" } do
    if o[k] ~= nil and type(o[k]) ~= "boolean" then bad(fname, "'" .. k .. "' must be a boolean", level) end
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

local function trace_turns(o)
  if type(o.trace) == "string" then return _M.load_trace(o.trace) end
  local turns = {}
  for i, e in ipairs(o.trace) do
    local turn, err = check_turn(e, "trace turn " .. i)
    if not turn then return nil, err, "BAD_REQUEST" end
    turns[i] = turn
  end
  return sort_turns(turns)
end

-- The conversations to simulate, in order of arrival: `{ key, start }`; the
-- list's `gen_of(conv)` makes a conversation's generator, whose `turn()`
-- gives its turns one by one (t, duration, timeout, language, lead, run).
local function conversations_of(o)
  if o.workload then
    local w = o.workload
    local convs = arrivals(w)
    -- one generator per conversation, made when it starts
    convs.gen_of = function(c) return conv_gen(w, c) end
    return convs
  end
  local turns, err, code = trace_turns(o)
  if not turns then return nil, err, code end
  local by_key, convs = {}, {}
  for _, e in ipairs(turns) do
    local c = by_key[e.session]
    local begins = math_max(0, e.t - (e.lead or 0))
    if not c then
      c = { key = e.session, start = begins, list = {}, seed = #convs + 1 }
      by_key[e.session] = c
      convs[#convs + 1] = c
    elseif begins < c.start then
      c.start = begins
    end
    c.list[#c.list + 1] = e
  end
  -- in order of their first turn's start (a lead may start a turn before an earlier run)
  table_sort(convs, function(a, b) return a.start < b.start or (a.start == b.start and a.seed < b.seed) end)
  convs.gen_of = function(c) return setmetatable({ list = c.list, i = 0 }, TraceGen) end
  return convs
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

-- Running seconds by size ("CPUxMB" keys) priced at E2B's rates: a list of
-- { cpu_count, memory_mb, seconds, cost } (by size) and the total cost.
local function compute_by_size(by, prices)
  local keys = {}
  for k in pairs(by) do keys[#keys + 1] = k end
  table_sort(keys)
  local out, total = {}, 0
  for i, k in ipairs(keys) do
    local cpu, mb = k:match("^(%d+)x(%d+)$")
    cpu, mb = tonumber(cpu), tonumber(mb)
    local cost = by[k] * (cpu * prices.vcpu_second + mb / 1024 * prices.gib_second)
    out[i] = { cpu_count = cpu, memory_mb = mb, seconds = by[k], cost = cost }
    total = total + cost
  end
  return out, total
end

-- The checkpoints of a finished run: taken, deleted, peak, GiB-hours stored and their cost.
local function model_checkpoints(report, model, prices)
  local st = model.stats
  report.checkpoints_taken, report.checkpoints_deleted = st.snapshots, st.snapshots_deleted
  report.peak_checkpoints, report.checkpoints_alive = st.peak_snapshots, model.nsnaps
  report.checkpoint_gib_hours = st.snapshot_gib_seconds / 3600
  report.checkpoint_cost = report.checkpoint_gib_hours / _M.MONTH_HOURS * prices.snapshot_gib_month
end

-- Fills a finished run's report: latency percentiles, costs, the model's counts, and details when asked.
local function finish_report(report, o, model, prices, latencies, nlat, log, t0)
  local alive = model:close_books()

  table_sort(latencies)
  local sum = 0
  for i = 1, nlat do sum = sum + latencies[i] end
  report.p50_ms = _M.percentile(latencies, 50) or 0
  report.p95_ms = _M.percentile(latencies, 95) or 0
  report.p99_ms = _M.percentile(latencies, 99) or 0
  report.max_ms = latencies[nlat] or 0
  report.mean_ms = nlat > 0 and sum / nlat or 0
  local st = model.stats
  report.compute_seconds = st.running_seconds
  report.compute_by_size, report.compute_cost = compute_by_size(st.running_by_size, prices)
  report.paused_seconds = st.paused_seconds
  report.paused_hours = st.paused_seconds / 3600
  report.storage_cost = st.paused_seconds * prices.paused_second
  model_checkpoints(report, model, prices)
  report.cost = report.compute_cost + report.storage_cost + report.checkpoint_cost
  report.created = st.creates
  report.model_resumes = st.resumes
  report.pauses = st.pauses
  report.kills = st.kills
  report.timeout_kills = st.timeout_kills
  report.requests = st.requests
  report.requests_per_run = report.runs > 0 and st.requests / report.runs or 0
  report.auto_pauses = st.auto_pauses
  report.paused_during_run = st.paused_during_run
  report.rejected_cap, report.rejected_rate, report.retries = st.rejected_cap, st.rejected_rate, st.retries
  report.retry_after_waits = st.retry_after_waits
  report.prewarm = o.prewarm and true or false
  report.prewarms = report.prewarms or 0
  report.prewarms_unused, report.prewarms_failed = report.prewarms_unused or 0, report.prewarms_failed or 0
  report.prewarm_creates, report.prewarm_resumes = report.prewarm_creates or 0, report.prewarm_resumes or 0
  report.peak_running = st.peak_running
  report.alive_running, report.alive_paused = alive.running, alive.paused
  report.alive = alive.running + alive.paused
  report.simulated_seconds = model.now - t0
  if o.details then
    report.sandboxes = model:sandboxes()
    report.latencies_ms = latencies
    report.log = log
  end
  return report
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

-- The exact path's `details` log record of one run (times in seconds from the start, t0).
local function log_record(key, due, start, finish, t0, ok, r, ecode, mark)
  return { session = key, due = due, start = start, finish = finish,
    code_started = mark.code_started and mark.code_started - t0, ok = ok and r and true or false,
    code = not (ok and r) and (ok and tostring(ecode) or "ERROR") or nil,
    created = mark.created or false, resumed = mark.resumed or false }
end

-- A runner (the `warmbox.runner` methods `warmbox.checkpoint` calls) on the
-- simulator's scheduler: an automatic checkpoint is a task of the simulation.
local function sim_runner(sched)
  local rn = {}
  function rn.spawn(_, fn, ...) return sched:spawn(fn, ...) end
  function rn.current() return sched:current() end
  function rn.step() return sched:step(0) end
  function rn.join(_, t)
    if t:done() then return end
    local ev = sched:event()
    t:on_done(function() ev:signal() end)
    ev:wait()
  end
  return rn
end

-- One part of a GC pass, `fn(o)` (warmbox.gc's sandbox pass or the checkpoint
-- pass): a raise or an error counts in `gc_errors`, a report goes to `count`.
local function gc_part(report, fn, o, note_error, count)
  local ok, rep, gerr, gcode = pcall(fn, o)
  if not ok then
    report.gc_errors = report.gc_errors + 1
    note_error("GC", tostring(rep))
  elseif not rep then
    report.gc_errors = report.gc_errors + 1
    note_error(gcode, gerr)
  else
    count(report, rep)
  end
end

local function count_gc(report, rep)
  report.gc_kills = report.gc_kills + rep.killed
  report.gc_demoted = report.gc_demoted + rep.demoted
  report.gc_busy = report.gc_busy + rep.busy
  report.gc_errors = report.gc_errors + #rep.errors
end

local function count_gc_checkpoints(report, rep)
  report.gc_busy = report.gc_busy + rep.busy
  report.gc_errors = report.gc_errors + rep.failed
end

local function run(o)
  local convs, terr, tcode = conversations_of(o)
  if not convs then return nil, terr, tcode end
  local policy, perr, pcode, per_call = resolve_policy(o)
  if not policy then return nil, perr, pcode end
  local prices = run_prices(o)
  local start = (o.model and o.model.start) or model_mod.DEFAULTS.start
  local sched = task_mod.scheduler{ backend = task_mod.virtual(start) }
  local model = model_mod.new(o.model, sched)
  model.size = o.size
  model.keep_history = o.details and true or false
  local clock = model:clock()
  local t0 = model.now
  local new_lock = sim_lock.factory(sched)
  local rn = sim_runner(sched)
  local function get_runner() return rn end
  local exec_timeout, idle_timeout, template, tag, max_age, gc_every, code = run_settings(o)

  local report = {
    turns = 0, runs = 0, ok = 0, failed = 0, failures = {}, errors = {},
    conversations = #convs, conversations_lost_state = 0, turns_lost_state = 0,
    cold_starts = 0, resumes = 0, warm_hits = 0,
    events = { create = 0, connect = 0, kill = 0, retry = 0 },
    gc_passes = 0, gc_kills = 0, gc_demoted = 0, gc_busy = 0, gc_errors = 0,
    policy = tostring(policy.name), exec_timeout = exec_timeout, idle_timeout = idle_timeout,
    max_age = max_age, gc_every = gc_every or 0, prices = prices,
  }
  local events = report.events
  local function on_event(name) events[name] = (events[name] or 0) + 1 end
  local function new_session(key)
    return session_mod.new(key, { client = model, lock = new_lock, clock = clock, policy = policy,
      template = template, exec_timeout = exec_timeout, idle_timeout = idle_timeout, tag = tag,
      origin = "warmbox.sim", on_event = on_event, max_run_length = model.max_length, runner = get_runner })
  end

  local function note_error(c, msg)
    if #report.errors < 10 then report.errors[#report.errors + 1] = { code = c, message = msg } end
  end
  local function fail(c, msg)
    report.failed = report.failed + 1
    report.failures[c] = (report.failures[c] or 0) + 1
    note_error(c, msg)
  end

  local latencies, nlat = {}, 0
  local log = o.details and {} or nil
  local last_end = t0
  local active, arrived_all = 0, false
  local horizon = nil
  local tail = o.tail
  if tail == nil then
    -- The default lease: max(exec_timeout, idle_timeout), at least the run's timeout + LEASE_MARGIN.
    tail = math_max(exec_timeout + session_mod.LEASE_MARGIN, idle_timeout) + max_age + (gc_every or 0)
  end
  -- The GC task, while it sleeps until its next pass (gc_next): the simulation
  -- ends at the horizon, not at the first pass after it.
  local gc_task, gc_next, gc_sleeping = nil, nil, false
  local function finish_if_idle()
    if arrived_all and active == 0 and not horizon then
      horizon = math_max(last_end + tail, clock())
      if gc_task and gc_sleeping and gc_next > horizon then gc_task:cancel() end
    end
  end

  local exact, xerr, xcode = run_path(o, policy)
  if exact == nil then return nil, xerr, xcode end
  report.path = exact and "exact" or "fast"
  if not exact then
    horizon = fast_mod.simulate{ convs = convs, policy = policy, per_call = per_call, model = model,
      report = report, latencies = latencies, log = log, t0 = t0, exec_timeout = exec_timeout,
      idle_timeout = idle_timeout, template = template, tag = tag, env = {}, max_age = max_age,
      gc_every = gc_every, tail = tail, prewarm = o.prewarm and true or false, gc_full = o.gc_full == true, fail = fail,
      note_error = note_error }
    nlat = #latencies
  else
    -- The exact path: real sessions and GC passes, each conversation a task.

    -- One conversation: its turns one after another (never two at once).
    local function conversation(conv)
      local me = task_mod.current()
      local data = me.data
      local gen = convs.gen_of(conv)
      local function next_turn() return gen:turn() end
      local s = (not per_call) and new_session(conv.key) or nil
      local had_box, lost = false, false
      local n = 0
      while true do
        local t, duration, timeout, language, _, runs = next_turn()
        if not t then break end
        n = n + 1
        local due = t0 + t
        if runs == false then
          report.turns = report.turns + 1      -- a turn that runs no code
          goto next
        end
        if due > clock() then sched:sleep_until(due) end
        data.duration, data.mark = duration, {}
        local run_s = s or new_session(conv.key .. "#" .. n)
        local began = clock()
        report.turns = report.turns + 1
        report.runs = report.runs + 1
        local ok, r, err, ecode = pcall(run_s.run, run_s, code, { timeout = timeout, language = language })
        local mark = data.mark
        if log then log[#log + 1] = log_record(conv.key, due - t0, began - t0, clock() - t0, t0, ok, r, ecode, mark) end
        if not ok then
          fail("ERROR", tostring(r))
        elseif not r then
          fail(tostring(ecode), tostring(err))
        else
          report.ok = report.ok + 1
          if mark.created then
            report.cold_starts = report.cold_starts + 1
            if had_box then
              report.turns_lost_state = report.turns_lost_state + 1
              if not lost then
                lost = true
                report.conversations_lost_state = report.conversations_lost_state + 1
              end
            end
          elseif mark.resumed then
            report.resumes = report.resumes + 1
          else
            report.warm_hits = report.warm_hits + 1
          end
          had_box = true
          -- Virtual times are unix seconds: round away the float noise (to the microsecond).
          local ms = ((mark.code_started or clock()) - began) * 1000
          nlat = nlat + 1
          latencies[nlat] = math_floor(ms * 1000 + 0.5) / 1000
        end
        if per_call and mark.sandbox_id then
          model:kill(mark.sandbox_id)            -- a fresh sandbox per call: killed after it
        end
        do
          local now = clock()
          if now > last_end then last_end = now end
        end
        ::next::
      end
      active = active - 1
      finish_if_idle()
    end

    -- Arrivals: each conversation starts as a task when its first turn is due.
    sched:spawn(function()
      for _, conv in ipairs(convs) do
        local due = t0 + conv.start
        if due > clock() then sched:sleep_until(due) end
        active = active + 1
        sched:spawn(conversation, conv)
      end
      arrived_all = true
      finish_if_idle()
    end)

    -- GC passes every gc_every seconds until the horizon.
    if gc_every then
      gc_task = sched:spawn(function()
        gc_next = t0 + gc_every
        while true do
          if horizon and gc_next > horizon then break end
          gc_sleeping = true
          sched:sleep_until(gc_next)
          gc_sleeping = false
          if horizon and gc_next > horizon then break end
          gc_part(report, gc_mod.run, { client = model, tag = tag, policy = policy, lock = new_lock,
            clock = clock, max_age = max_age }, note_error, count_gc)
          report.gc_passes = report.gc_passes + 1
          if policy.checkpoint_gc then
            gc_part(report, gc_cp_mod.run, { client = model, tag = tag, policy = policy, lock = new_lock,
              clock = clock }, note_error, count_gc_checkpoints)
          end
          gc_next = gc_next + gc_every
        end
      end)
    end

    local ok, lerr = sched:loop()
    if not ok then
      sched:cancel_all()
      note_error("DEADLOCK", tostring(lerr))
    end
    horizon = horizon or math_max(last_end + tail, clock())
  end
  model:advance_to(math_max(horizon, clock()))
  return finish_report(report, o, model, prices, latencies, nlat, log, t0)
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

-- ------------------------------------------------------------------
-- output: a text table and a chart
-- ------------------------------------------------------------------

local COLUMNS = {
  { "runs", "runs", "%d" }, { "cold", "cold_starts", "%d" }, { "resumes", "resumes", "%d" },
  { "warm", "warm_hits", "%d" }, { "failed", "failed", "%d" }, { "lost state", "conversations_lost_state", "%d" },
  { "p50 ms", "p50_ms", "%.0f" }, { "p95 ms", "p95_ms", "%.0f" }, { "p99 ms", "p99_ms", "%.0f" },
  { "compute s", "compute_seconds", "%.0f" }, { "compute $", "compute_cost", "%.4f" },
  { "paused h", "paused_hours", "%.1f" }, { "storage $", "storage_cost", "%.4f" },
  { "gc kills", "gc_kills", "%d" }, { "alive", "alive", "%d" },
}
_M.COLUMNS = COLUMNS

-- The fields of a CSV row, in order.
local CSV_FIELDS = { "policy", "param", "value", "conversations", "runs", "ok", "failed", "cold_starts", "resumes",
  "warm_hits", "conversations_lost_state", "turns_lost_state", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms",
  "compute_seconds", "compute_cost", "paused_seconds", "paused_hours", "storage_cost", "cost", "created",
  "model_resumes", "pauses", "auto_pauses", "kills", "timeout_kills", "gc_passes", "gc_kills", "gc_demoted",
  "requests", "requests_per_run", "rejected_cap", "rejected_rate", "retries", "peak_running", "paused_during_run",
  "alive", "exec_timeout", "idle_timeout", "max_age", "gc_every", "paused_price_hour", "simulated_seconds", "path",
  "prewarm", "prewarms", "prewarms_unused", "prewarms_failed", "prewarm_creates", "prewarm_resumes", "turns",
  "retry_after_waits", "checkpoints_taken", "checkpoints_deleted", "peak_checkpoints", "checkpoints_alive",
  "checkpoint_gib_hours", "checkpoint_cost" }
_M.CSV_FIELDS = CSV_FIELDS

--- Rows as CSV text: a header line, then one line per row (fields in
-- `CSV_FIELDS`; text fields never hold a comma or a quote here, so none is quoted).
-- @tparam table rows a report or a list of them
-- @treturn string
function _M.csv(rows)
  if type(rows) ~= "table" then error("bad argument #1 to 'csv' (table expected, got " .. type(rows) .. ")", 2) end
  if rows.runs then rows = { rows } end
  local out = { table_concat(CSV_FIELDS, ",") }
  for _, r in ipairs(rows) do
    local line = {}
    for i, k in ipairs(CSV_FIELDS) do
      local v = r[k]
      if k == "paused_price_hour" then v = (r.prices and r.prices.paused_second or 0) * 3600 end
      if type(v) == "boolean" then
        line[i] = tostring(v)
      elseif type(v) == "number" then
        line[i] = math_type(v) == "integer" and string_format("%d", v) or string_format("%.10g", v)
      elseif v == nil then
        line[i] = ""
      else
        line[i] = (tostring(v):gsub("[,\"\r\n]", " "))
      end
    end
    out[#out + 1] = table_concat(line, ",")
  end
  return table_concat(out, "\n") .. "\n"
end

-- The footer of a table: the sizes compute was priced at, the rates and their source, the storage price.
local function price_note(rows)
  local prices = rows[1] and rows[1].prices or _M.PRICES
  local sizes, seen = {}, {}
  for _, r in ipairs(rows) do
    for _, z in ipairs(r.compute_by_size or {}) do
      local name = string_format("%d vCPU / %d MiB", z.cpu_count, z.memory_mb)
      if not seen[name] then seen[name], sizes[#sizes + 1] = true, name end
    end
  end
  local function usd(v) return (string_format("%.9f", v):gsub("0+$", ""):gsub("%.$", "")) end
  local cp_price, cps = prices.snapshot_gib_month or 0, false
  for _, r in ipairs(rows) do cps = cps or (r.checkpoints_taken or 0) > 0 end
  local cp_line = (cps or cp_price > 0) and string_format("checkpoint storage: $%s per GiB-month%s\n", usd(cp_price),
    cp_price == 0 and " (E2B publishes no snapshot price)" or " (assumed)") or ""
  return string_format("compute by size: %s, at $%s per vCPU-second and $%s per GiB-second (E2B's pricing page)\n"
    .. "paused storage: $%s per sandbox-hour%s\n%s", #sizes > 0 and table_concat(sizes, ", ") or "none",
    usd(prices.vcpu_second), usd(prices.gib_second), usd(prices.paused_second * 3600),
    prices.paused_second == 0 and " (E2B bills paused sandboxes nothing)" or " (assumed)", cp_line)
end

-- The columns `format` shows: COLUMNS, plus the prewarm counts when a row
-- prewarmed, and the checkpoints' when a row took any.
local function format_columns(rows)
  local prewarm, cps = false, false
  for _, r in ipairs(rows) do
    prewarm = prewarm or r.prewarm
    cps = cps or (r.checkpoints_taken or 0) > 0
  end
  if not prewarm and not cps then return COLUMNS end
  local columns = { table.unpack(COLUMNS) }
  if prewarm then
    columns[#columns + 1] = { "prewarms", "prewarms", "%d" }
    columns[#columns + 1] = { "unused", "prewarms_unused", "%d" }
  end
  if cps then
    columns[#columns + 1] = { "checkpoints", "checkpoints_taken", "%d" }
    columns[#columns + 1] = { "cp deleted", "checkpoints_deleted", "%d" }
    columns[#columns + 1] = { "cp peak", "peak_checkpoints", "%d" }
    columns[#columns + 1] = { "cp GiB-h", "checkpoint_gib_hours", "%.1f" }
    columns[#columns + 1] = { "cp $", "checkpoint_cost", "%.4f" }
  end
  return columns
end

-- Lines of cells as text lines: the first column left-aligned, the others right-aligned.
local function align(lines)
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
  return out
end

-- One "failures (...): CODE=n, ..." line per row that had failures.
local function failure_lines(rows)
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
  return failures
end

--- Format reports (or sweep rows) as a text table, one line per row.
-- @tparam table rows a report or a list of them
-- @treturn string
function _M.format(rows)
  if type(rows) ~= "table" then error("bad argument #1 to 'format' (table expected, got " .. type(rows) .. ")", 2) end
  if rows.runs then rows = { rows } end
  local header = { rows[1] and rows[1].param or "policy" }
  local columns = format_columns(rows)
  for _, c in ipairs(columns) do header[#header + 1] = c[1] end
  local lines = { header }
  for _, r in ipairs(rows) do
    local line = { r.param and tostring(r.value) or tostring(r.policy) }
    for _, c in ipairs(columns) do
      local v = r[c[2]] or 0
      line[#line + 1] = string_format(c[3], c[3] == "%d" and math_floor(v) or v)
    end
    lines[#lines + 1] = line
  end
  local out = align(lines)
  local failures = failure_lines(rows)
  local note = price_note(rows)
  return table_concat(out, "\n") .. "\n" .. (#failures > 0 and table_concat(failures, "\n") .. "\n" or "") .. note
end

--- Draw the chart with gnuplot when it is installed (`opts.gnuplot`, default
-- "gnuplot" on the PATH), else write the built-in SVG.
-- @tparam table rows
-- @tparam string path the image to write (gnuplot: PNG when it ends in .png, else SVG)
-- @tparam[opt] table opts `x`, `y`, `title` (as `chart`), `gnuplot` (a command, or false: built-in SVG only)
-- @treturn[1] string "gnuplot" or "svg" (what drew it)
-- @return[2] nil, message, "IO"
function _M.plot(rows, path, opts)
  if type(path) ~= "string" then error("bad argument #2 to 'plot' (string expected, got " .. type(path) .. ")", 2) end
  opts = opts or {}
  local copts = { x = opts.x, y = opts.y, title = opts.title }
  local svg = chart_mod.chart(rows, copts, 2)  -- also checks the rows and options
  local gp = opts.gnuplot
  if gp == nil then gp = "gnuplot" end
  if gp and os.execute("command -v " .. gp .. " >/dev/null 2>&1") then
    local ok = chart_mod.gnuplot(rows, path, copts, gp)
    if ok then return "gnuplot" end
  end
  local f, err = io_open(path, "wb")
  if not f then return nil, "cannot write " .. path .. ": " .. tostring(err), "IO" end
  f:write(svg)
  f:close()
  return "svg"
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
