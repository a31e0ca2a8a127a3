--- warmbox.sim.workload: the simulator's inputs (`warmbox.sim` exports the
-- public names): a deterministic PRNG, trace files (JSON lines or CSV),
-- distributions, generated workloads, and the conversations a run plays,
-- each with a generator of its turns.
-- @module warmbox.sim.workload

local json = require "warmbox.json"
local errors = require "warmbox.errors"

local type, pairs, ipairs, tostring, error, setmetatable = type, pairs, ipairs, tostring, error, setmetatable
local string_format, table_sort, math_floor, math_log, math_max, math_huge =
  string.format, table.sort, math.floor, math.log, math.max, math.huge
local io_open, math_type = io.open, math.type
local math_exp, math_sqrt, math_cos = math.exp, math.sqrt, math.cos

local _M = {}

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
-- Distributions (documented in docs/simulator.md: parameters and their meaning)
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

_M.is_num, _M.bad, _M.trace_turns, _M.conversations_of, _M.check_workload =
  is_num, bad, trace_turns, conversations_of, check_workload
return _M
