--- warmbox.ledger: what each conversation, tenant and day cost, from E2B's
-- lifecycle events.
--
-- E2B bills a sandbox per second while it runs, at its own size: $0.000014 per
-- vCPU-second and $0.0000045 per GiB-second (its pricing page and FAQ "How do
-- I calculate the price of a sandbox?"; the simulator's `warmbox.sim.report.PRICES`);
-- "paused and killed sandboxes are not billed". Every pause and kill event
-- carries the run that ended: `execution { started_at, vcpu_count,
-- memory_mb, execution_time }`; a sandbox still running is priced from its
-- last created/resumed event to now, at the size the listing shows. Events
-- carry the sandbox's metadata, so its warmbox tag names the conversation
-- (every fingerprint, and the sandboxes a rewind replaced); a branch's sandbox
-- also names the conversation it came from (`warmboxBranchOf`). Checkpoints
-- (persistent snapshots) are counted apart, at `prices.snapshot_gib_month`
-- per GiB-month for `snapshot_gb` + the sandbox's RAM, from their
-- checkpointed event to the end of the window (E2B publishes no price and its
-- events do not say when a snapshot is deleted: an upper bound).
--
--   local L = ledger.new{ client = e2b_client }
--   assert(L:sync())                       -- new events, paged, resumable
--   local rows, totals = L:costs{ by = "conversation", since = t0, ["until"] = t1 }
--   local c = L:cost("ws-1:thread-7")      -- { usd, running_seconds, ... }
-- @module warmbox.ledger
local errors = require "warmbox.errors"
local json = require "warmbox.json"
local tag_mod = require "warmbox.tag"
local util = require "warmbox.util"
local fetch = require "warmbox.ledger.fetch"

local type, pairs, ipairs, tostring, tonumber, setmetatable, pcall =
  type, pairs, ipairs, tostring, tonumber, setmetatable, pcall
local math_max, math_min, math_floor, os_date, table_sort = math.max, math.min, math.floor, os.date, table.sort

local _M = {}

_M.BRANCH_TAG = "warmboxBranchOf"
_M.UNTAGGED = "(untagged)"
local PREFIX = "sandbox.lifecycle."

local Ledger = { __name = "warmbox.ledger.Ledger" }
Ledger.__index = Ledger

local function default_prices()
  local p = util.copy(require("warmbox.sim.report").PRICES)
  return p
end

local function default_tenant(key) return require("warmbox.gc.decide").default_tenant(key) end

--- A ledger.
-- @tparam table o `client` (a `warmbox.e2b.Client`; nil for a ledger fed by
--   `add_event` alone), `tag` ("warmboxSessionId"), `prices` (overrides of
--   E2B's rates, plus `snapshot_gib_month`), `snapshot_gb` (10: the disk a
--   checkpoint keeps beside the RAM, as the simulator counts it), `tenant`
--   (function(key) -> tenant; default: the key's part before the first `:`),
--   `now` (function() -> unix seconds; default the wall clock, or the newest event's time when
--   that is later: a server whose clock is ahead), `state_file`
--   (where to keep the events read, so a new ledger resumes)
function _M.new(o)
  o = errors.check_options(o, { client = "table", tag = "string", prices = "table", snapshot_gb = "number",
    tenant = "function", now = "function", state_file = "string" }, "new", 1)
  local prices = default_prices()
  for k, v in pairs(o.prices or {}) do
    if prices[k] == nil or type(v) ~= "number" or v < 0 then
      errors.bad_option(1, "new", "prices", "unknown price or bad value '" .. tostring(k) .. "'")
    end
    prices[k] = v
  end
  local self = setmetatable({
    client = o.client, tag = o.tag or "warmboxSessionId", prices = prices, snapshot_gb = o.snapshot_gb or 10,
    tenant = o.tenant or default_tenant, now = o.now,
    state_file = o.state_file, boxes = {}, state = { offset = 0, seen = {} }, raw = {}, running = {},
  }, Ledger)
  if not self.now then
    -- the wall clock, or the newest event's time when the server's clock is ahead (a moved clock)
    self.now = function() return math_max(os.time(), self.latest or 0) end
  end
  if self.state_file then self:_load() end
  return self
end

-- ------------------------------------------------------------------
-- Events
-- ------------------------------------------------------------------

local function box(self, id)
  local b = self.boxes[id]
  if not b then
    b = { id = id, segs = {}, open = {}, checkpoints = {} }
    self.boxes[id] = b
  end
  return b
end

local function label(self, b, md)
  if b.key or type(md) ~= "table" then return end
  local tv = json.value(md[self.tag])
  if type(tv) ~= "string" then return end
  local key, enc = tag_mod.parse_tag(tv)
  b.key = key or enc or tv
  local ok, t = pcall(self.tenant, b.key)
  b.tenant = ok and t ~= nil and tostring(t) or default_tenant(b.key)
  local parent = json.value(md[_M.BRANCH_TAG])
  if type(parent) == "string" then
    local pk, penc = tag_mod.parse_tag(parent)
    b.branch_of = pk or penc or parent
  end
end

local function num(v) return type(v) == "number" and v or nil end

-- Applies one event (already known new) to the books.
local function apply(self, e)
  local ts = util.parse_time(json.value(e.timestamp))
  local sid, kind = json.value(e.sandboxId), json.value(e.type)
  if not ts or type(sid) ~= "string" or type(kind) ~= "string" then return false end
  kind = kind:gsub("^" .. PREFIX:gsub("%.", "%%."), "")
  local data = json.value(e.eventData)
  data = type(data) == "table" and data or {}
  local b = box(self, sid)
  label(self, b, json.value(data.sandbox_metadata))
  b.template = b.template or json.value(e.sandboxTemplateId)
  local exec_id = json.value(e.sandboxExecutionId) or sid
  if kind == "created" or kind == "resumed" then
    -- (a webhook may bring the pause before the resume of one execution)
    if not (b.closed_exec and b.closed_exec[exec_id]) then b.open[exec_id] = ts end
  elseif kind == "paused" or kind == "killed" then
    local x = json.value(data.execution)
    if type(x) == "table" and num(x.execution_time) then
      local secs = x.execution_time / 1000
      b.segs[#b.segs + 1] = { start = ts - secs, stop = ts, cpu = num(x.vcpu_count) or 2,
        mem = num(x.memory_mb) or 512 }
      b.cpu, b.mem = b.segs[#b.segs].cpu, b.segs[#b.segs].mem
    end
    b.open[exec_id] = nil
    b.closed_exec = b.closed_exec or {}
    b.closed_exec[exec_id] = true
    if kind == "killed" then b.killed = ts end
  elseif kind == "checkpointed" then
    b.checkpoints[#b.checkpoints + 1] = ts
  end
  b.first = math_min(b.first or ts, ts)
  self.latest = math_max(self.latest or ts, ts)
  return true
end

--- Takes one event (from the events API or a webhook), once: an event whose
-- id was taken already is ignored.
-- @tparam table e the event as E2B sends it
-- @treturn boolean true when it was new
function Ledger:add_event(e)
  if type(e) ~= "table" or type(json.value(e.id)) ~= "string" then return false end
  if self.state.seen[e.id] then return false end
  self.state.seen[e.id] = true
  self.raw[#self.raw + 1] = e
  apply(self, e)
  return true
end

--- Reads the events not read yet (paged, resumable, each once by its id) and
-- the running sandboxes' sizes from the listing; saves `state_file`.
-- @treturn[1] number how many new events
-- @return[2] nil, msg, code, detail
function Ledger:sync()
  if not self.client then return 0 end
  local n, msg, code, detail = fetch.sync(self.client, self.state, function(e)
    self.raw[#self.raw + 1] = e
    apply(self, e)
  end)
  if not n then return nil, msg, code, detail end
  local items, lmsg, lcode, ldetail = self.client:list_all{ state = { "running" } }
  if not items then return nil, lmsg, lcode, ldetail end
  self.running = {}
  for _, it in ipairs(items) do
    self.running[it.sandbox_id] = { cpu = it.cpu_count, mem = it.memory_mb }
  end
  if self.state_file then self:_save() end
  return n
end

-- Written whole to a temporary file, then renamed over the old one.
function Ledger:_save()
  local s = json.encode({ offset = self.state.offset, events = self.raw })
  local tmp = self.state_file .. ".tmp"
  local f = s and io.open(tmp, "wb")
  if not f then return end
  local ok = f:write(s)
  f:close()
  if ok then os.rename(tmp, self.state_file) end
end

function Ledger:_load()
  local s = util.read_file(self.state_file)
  local t = s and json.decode(s)
  if type(t) ~= "table" then return end
  for _, e in ipairs(t.events or {}) do self:add_event(e) end
  self.state.offset = tonumber(t.offset) or 0
end

-- ------------------------------------------------------------------
-- Costs
-- ------------------------------------------------------------------

local function size_of(self, b)
  local r = self.running[b.id]
  if r and r.cpu then return r.cpu, r.mem end
  if b.cpu then return b.cpu, b.mem end
  local sizes = require("warmbox.sim.model")
  local s = sizes.TEMPLATE_SIZES[b.template or ""] or sizes.DEFAULT_SIZE
  return s.cpu_count, s.memory_mb
end

-- Every run of a sandbox: { start, stop, cpu, mem } (a run still going ends `now`).
local function runs_of(self, b, now)
  local out = {}
  for _, s in ipairs(b.segs) do out[#out + 1] = s end
  for _, t in pairs(b.open) do
    if not b.killed or b.killed < t then
      local cpu, mem = size_of(self, b)
      out[#out + 1] = { start = t, stop = math_max(t, now), cpu = cpu, mem = mem, open = true }
    end
  end
  return out
end

local function day_of(t) return os_date("!%Y-%m-%d", math_floor(t)) end

-- Calls f(from, to, day) for the part of [a, b) inside [since, until), split at UTC midnights.
local function clip(a, b, since, till, f)
  a, b = math_max(a, since), math_min(b, till)
  while a < b do
    local next_midnight = (math_floor(a / 86400) + 1) * 86400
    local e = math_min(b, next_midnight)
    f(a, e, day_of(a))
    a = e
  end
end

local function row_of(rows, k)
  local r = rows[k]
  if not r then
    r = { key = k, usd = 0, running_seconds = 0, snapshot_usd = 0, snapshot_gib_hours = 0, sandboxes = 0,
      checkpoints = 0, seen = {} }
    rows[k] = r
  end
  return r
end

local function group_of(by, b, day)
  if by == "conversation" then return b.key or _M.UNTAGGED end
  if by == "tenant" then return b.tenant or _M.UNTAGGED end
  if by == "sandbox" then return b.id end
  return day
end

local BY = { conversation = true, tenant = true, day = true, sandbox = true }

local function book_box(self, rows, b, o)
  local p = self.prices
  for _, s in ipairs(runs_of(self, b, o.now)) do
    local rate = s.cpu * p.vcpu_second + s.mem / 1024 * p.gib_second
    clip(s.start, s.stop, o.since, o["until"], function(x, y, day)
      local r = row_of(rows, group_of(o.by, b, day))
      r.running_seconds = r.running_seconds + (y - x)
      r.usd = r.usd + (y - x) * rate
      if not r.seen[b.id] then r.seen[b.id], r.sandboxes = true, r.sandboxes + 1 end
    end)
  end
  local _, mem = size_of(self, b)
  local gib = self.snapshot_gb + mem / 1024
  for _, t in ipairs(b.checkpoints) do
    if t >= o.since and t < o["until"] then
      local r = row_of(rows, group_of(o.by, b, day_of(t)))
      r.checkpoints = r.checkpoints + 1
    end
    clip(t, math_min(o["until"], o.now), o.since, o["until"], function(x, y, day)
      local r = row_of(rows, group_of(o.by, b, day))
      local gh = gib * (y - x) / 3600
      r.snapshot_gib_hours = r.snapshot_gib_hours + gh
      r.snapshot_usd = r.snapshot_usd + gh / require("warmbox.sim.report").MONTH_HOURS * p.snapshot_gib_month
    end)
  end
end

-- A conversation row's branches: their keys and the cost with them (descendants too).
local function add_branches(self, rows)
  local parent = {}
  for _, b in pairs(self.boxes) do
    if b.key and b.branch_of and b.branch_of ~= b.key then parent[b.key] = b.branch_of end
  end
  for _, r in pairs(rows) do
    r.branch_of = parent[r.key]
    r.branches, r.usd_with_branches = {}, r.usd + r.snapshot_usd
  end
  for k, r in pairs(rows) do
    local p, hops = parent[k], 0
    if p and rows[p] then rows[p].branches[#rows[p].branches + 1] = k end
    while p and hops < 100 do
      if rows[p] then rows[p].usd_with_branches = rows[p].usd_with_branches + r.usd + r.snapshot_usd end
      p, hops = parent[p], hops + 1
    end
  end
  for _, r in pairs(rows) do table_sort(r.branches) end
end

--- The costs, grouped.
-- @tparam[opt] table o `by` ("conversation" (default) | "tenant" | "day" | "sandbox"), `since`,
--   `until` (unix seconds; default all time up to now), `now` (default the ledger's clock)
-- @treturn table rows `{ key, usd, running_seconds, sandboxes, checkpoints, snapshot_gib_hours,
--   snapshot_usd, total_usd [, branch_of, branches, usd_with_branches] }` sorted by key
-- @treturn table totals `{ usd, running_seconds, snapshot_usd, total_usd, sandboxes }`
function Ledger:costs(o)
  o = errors.check_options(o, { by = "string", since = "number", ["until"] = "number", now = "number" }, "costs", 1)
  local by = o.by or "conversation"
  if not BY[by] then errors.bad_option(1, "costs", "by", "conversation, tenant, day or sandbox expected") end
  local now = o.now or self.now()
  local w = { by = by, since = o.since or 0, ["until"] = o["until"] or now, now = now }
  local rows = {}
  for _, b in pairs(self.boxes) do book_box(self, rows, b, w) end
  if by == "conversation" then add_branches(self, rows) end
  local out, totals = {}, { usd = 0, running_seconds = 0, snapshot_usd = 0, total_usd = 0, sandboxes = 0 }
  for _, r in pairs(rows) do
    r.seen = nil
    r.total_usd = r.usd + r.snapshot_usd
    out[#out + 1] = r
    totals.usd, totals.snapshot_usd = totals.usd + r.usd, totals.snapshot_usd + r.snapshot_usd
    totals.running_seconds = totals.running_seconds + r.running_seconds
    totals.sandboxes = totals.sandboxes + r.sandboxes
  end
  totals.total_usd = totals.usd + totals.snapshot_usd
  table_sort(out, function(a, b) return a.key < b.key end)
  return out, totals
end

--- One conversation's cost (all time): its row of `costs{ by = "conversation" }`, zeros when none.
function Ledger:cost(key, o)
  local rows = self:costs(o)
  for _, r in ipairs(rows) do
    if r.key == key then return r end
  end
  return { key = key, usd = 0, running_seconds = 0, sandboxes = 0, checkpoints = 0, snapshot_usd = 0,
    snapshot_gib_hours = 0, total_usd = 0, usd_with_branches = 0, branches = {} }
end

--- Running and paused sandboxes over time, for the chart: `{ t, running,
-- paused }` at each change. A sandbox is paused from the end of a run to its
-- next run, or to its kill (none when killed as the run ended).
function Ledger:timeline()
  local now, ch = self.now(), {}
  local function span(a, b, dr, dp)
    if b <= a then return end
    ch[#ch + 1] = { a, dr, dp }
    ch[#ch + 1] = { b, -dr, -dp }
  end
  for _, b in pairs(self.boxes) do
    local runs = runs_of(self, b, now)
    table_sort(runs, function(x, y) return x.start < y.start end)
    for i, s in ipairs(runs) do
      span(s.start, s.stop, 1, 0)
      local nxt = runs[i + 1] and runs[i + 1].start or (b.killed or now)
      if not s.open then span(s.stop, nxt, 0, 1) end
    end
  end
  table_sort(ch, function(x, y) return x[1] < y[1] end)
  local out, r, p = {}, 0, 0
  for _, c in ipairs(ch) do
    r, p = r + c[2], p + c[3]
    out[#out + 1] = { t = c[1], running = r, paused = p }
  end
  return out
end

-- ------------------------------------------------------------------
-- The warmbox object's ledger
-- ------------------------------------------------------------------

local per_client = setmetatable({}, { __mode = "k" })

--- The ledger of an E2B client (one per client, kept while the client lives).
function _M.of(client, o)
  local L = per_client[client]
  if not L then
    o = o or {}
    L = _M.new{ client = client, tag = o.tag, tenant = o.tenant, prices = o.prices, snapshot_gb = o.snapshot_gb }
    per_client[client] = L
  end
  return L
end

--- A webhook receiver feeding this ledger (see `warmbox.ledger.webhook`).
function Ledger:webhook(secret) return require("warmbox.ledger.webhook").handler(self, secret) end

--- `wb:costs(opts)`: the warmbox object's ledger, synced, then `costs(opts)`.
function _M.costs_of(wb, opts)
  local L = _M.of(wb.client, { tag = wb.tag, tenant = wb.policy and wb.policy.tenant })
  local n, msg, code, detail = L:sync()
  if not n then return nil, msg, code, detail end
  return L:costs(opts)
end

--- `s:cost(opts)`: the session's conversation in its client's ledger, synced.
function _M.session_cost(s, opts)
  local L = _M.of(s.client, { tag = s.tag, tenant = s.policy and s.policy.tenant })
  local n, msg, code, detail = L:sync()
  if not n then return nil, msg, code, detail end
  return L:cost(s.key, opts)
end

_M.Ledger = Ledger
return _M
