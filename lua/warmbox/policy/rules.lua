--- GC policy helpers: small pure rules over the item and context that compose
-- into a policy's `gc` hook. Also available as the global `rules` inside a
-- policy file loaded with `warmbox.policy.load`.
--
--   local rules = require "warmbox.policy.rules"
--   policy.gc = rules.gc{ demote_after = "2d", kill_after = "14d", tenant_cap = 50,
--                         global_cap = 20000, orphans = "keep", max_kills = 1000 }
--   -- or compose by hand: the first rule with an opinion wins, else "keep"
--   policy.gc = rules.chain(rules.orphans("keep"), rules.retention{ kill_after = "7d" },
--                           rules.tenant_cap(50))
--
-- A rule is `function(item, ctx) -> action, reason` or nil (no opinion).
-- The item: `sandbox_id, key (nil when hashed or orphan), tenant, state, started_at,
-- end_at, last_activity (unix s), metadata, tag_value, orphan`. The context:
-- `now, max_age (= retention), counts = { kept, kill, demote }` of the item's tenant
-- so far in this pass, `totals = { seen, kept, kill, demote }` so far, `max_kills`.
--
-- Caps count in listing order: E2B lists the newest-started sandboxes first, so
-- the sandboxes kept under a cap are the newest and the oldest go first. A
-- hook built only of rules without caps (retention, orphans, budget, chain)
-- is marked independent of the order (`any_order`), so GC lists it from both
-- ends at once; wrap a hand-written hook in `rules.any_order` to say the same.
-- @module warmbox.policy.rules
local type, tostring, tonumber, error, select, floor, pairs = type, tostring, tonumber, error, select, math.floor, pairs
local fmt = string.format

local _M = {}

local UNITS = { s = 1, m = 60, h = 3600, d = 86400 }

-- Rules whose decision does not depend on what was decided before in the pass
-- (no caps): GC may then list from both ends at once (`warmbox.gc`).
local ANY_ORDER = setmetatable({}, { __mode = "k" })

--- Declares a `gc` hook (or rule) independent of the listing order: its
-- decision for an item does not depend on `ctx.counts`/`ctx.totals` (a kill
-- budget is fine), so GC may list from both ends at once. Returns `fn`.
-- syntax: fn = rules.any_order(fn)
function _M.any_order(fn)
  if type(fn) ~= "function" then error("bad argument #1 to 'any_order' (function expected)", 2) end
  ANY_ORDER[fn] = true
  return fn
end

--- Whether `fn` was declared (or composed only of rules) independent of the
-- listing order.
-- syntax: bool = rules.is_any_order(fn)
function _M.is_any_order(fn)
  return ANY_ORDER[fn] == true
end
local any_order = _M.any_order

--- Seconds of a duration: a number, or a string "90", "30s", "15m", "12h", "7d".
-- @treturn[1] number
-- @return[2] nil, message
-- syntax: s = rules.duration(v)
function _M.duration(v)
  if type(v) == "number" then
    if v ~= v or v < 0 then return nil, "duration must be >= 0, got " .. tostring(v) end
    return v
  end
  if type(v) ~= "string" then return nil, "duration expected, got " .. type(v) end
  local n, u = v:match("^%s*(%d+%.?%d*)%s*([smhd]?)%s*$")
  if not n then return nil, fmt("invalid duration '%s' (a number with a unit s, m, h or d, e.g. 7d)", v) end
  return tonumber(n) * UNITS[u ~= "" and u or "s"]
end

local function dur(v, name, fname)
  if v == nil then return nil end
  local s, err = _M.duration(v)
  if not s then error(fmt("bad option '%s' to '%s' (%s)", name, fname, err), 3) end
  return s
end

local function count(v, name, fname)
  if v == nil then return nil end
  if math.type(v) ~= "integer" or v < 0 then
    error(fmt("bad option '%s' to '%s' (integer >= 0 expected, got %s)", name, fname, tostring(v)), 3)
  end
  return v
end

local function human(s)
  if s >= 86400 and s % 86400 == 0 then return fmt("%dd", s // 86400) end
  if s >= 3600 and s % 3600 == 0 then return fmt("%dh", s // 3600) end
  if s >= 60 and s % 60 == 0 then return fmt("%dm", s // 60) end
  return fmt("%ds", floor(s))
end

--- Retention by last activity, in tiers: "demote" (filesystem-only snapshot)
-- after `demote_after`, "kill" after `kill_after` (default: the pass's
-- `max_age`, i.e. `--retention`). E2B records a demote's pause as the
-- sandbox's last activity, so a demoted sandbox (`item.demoted`: paused
-- within 10 s of its resume) is never demoted again and is killed
-- `kill_after - demote_after` after the demote. Items without a last
-- activity get no opinion.
-- @tparam table o `demote_after`, `kill_after` (durations)
-- syntax: rules.retention{ demote_after, kill_after }
function _M.retention(o)
  o = o or {}
  if type(o) ~= "table" then error("bad argument #1 to 'retention' (table expected)", 2) end
  local demote_after, kill_after = dur(o.demote_after, "demote_after", "retention"),
    dur(o.kill_after, "kill_after", "retention")
  if demote_after and kill_after and demote_after >= kill_after then
    error("bad option 'demote_after' to 'retention' (must be shorter than kill_after)", 2)
  end
  return any_order(function(item, ctx)
    local last = item.last_activity
    if not last then return nil end
    local idle = ctx.now - last
    local kill = kill_after or ctx.max_age
    if item.demoted and demote_after then
      local rest = kill and kill - demote_after
      if rest and idle > rest then
        return "kill", fmt("demoted %s ago (kill after %s)", human(idle), human(kill))
      end
      return nil
    end
    if kill and idle > kill then
      return "kill", fmt("inactive for %s (kill after %s)", human(idle), human(kill))
    end
    if demote_after and idle > demote_after and not item.demoted then
      return "demote", fmt("inactive for %s (demote after %s)", human(idle), human(demote_after))
    end
    return nil
  end)
end

--- Sandboxes whose tag is not a valid warmbox tag value (orphans): `action`
-- ("keep" by default, or "kill"); no opinion on the others.
-- syntax: rules.orphans(action)
function _M.orphans(action)
  action = action or "keep"
  if action ~= "keep" and action ~= "kill" then
    error("bad argument #1 to 'orphans' (\"keep\" or \"kill\" expected, got " .. tostring(action) .. ")", 2)
  end
  return any_order(function(item)
    if item.orphan then return action, "orphan tag (not a warmbox session)" end
    return nil
  end)
end

--- At most `max` kept sandboxes per tenant: the ones over it are killed.
-- syntax: rules.tenant_cap(max)
function _M.tenant_cap(max)
  max = count(max, "max", "tenant_cap")
  return function(item, ctx)
    if not item.tenant then return nil end
    if ctx.counts and ctx.counts.kept >= max then
      return "kill", fmt("tenant '%s' over its cap of %d kept sandboxes", tostring(item.tenant), max)
    end
    return nil
  end
end

--- At most `max` kept sandboxes in all: the ones over it are killed.
-- syntax: rules.global_cap(max)
function _M.global_cap(max)
  max = count(max, "max", "global_cap")
  return function(_, ctx)
    if ctx.totals and ctx.totals.kept >= max then
      return "kill", fmt("over the global cap of %d kept sandboxes", max)
    end
    return nil
  end
end

--- The first rule with an opinion wins; "keep" when none has one.
-- syntax: rules.chain(...)
function _M.chain(...)
  local list = { ... }
  for i = 1, select("#", ...) do
    if type(list[i]) ~= "function" then
      error(fmt("bad argument #%d to 'chain' (function expected, got %s)", i, type(list[i])), 2)
    end
  end
  local fn = function(item, ctx)
    for i = 1, #list do
      local action, reason = list[i](item, ctx)
      if action ~= nil then return action, reason end
    end
    return "keep"
  end
  for i = 1, #list do
    if not ANY_ORDER[list[i]] then return fn end
  end
  return any_order(fn)
end

--- At most `n` kills per pass: once `n` kills were decided, a kill becomes "keep".
local REFRESH = setmetatable({}, { __mode = "k" })

-- rules.budget{...}: a cost budget (a policy's `budget` hook).
local function cost_budget(o)
  o = require("warmbox.errors").check_options(o, { per_conversation_usd = "number",
    per_tenant_per_day_usd = "number", near = "number", on_over = "table", refresh = "number" }, "budget", 1)
  local near = o.near or 0.8
  local on_over = { run = "refuse", after_run = "pause", prewarm = "refuse", gc = "keep" }
  for k, v in pairs(o.on_over or {}) do
    if on_over[k] == nil or type(v) ~= "string" then error("bad argument #1 to 'budget' (on_over." .. tostring(k)
      .. ": run, after_run, prewarm or gc expected)", 3) end
    on_over[k] = v
  end
  local fn = function(ctx)
    local worst, what, limit = 0, nil, nil
    local function consider(spent, cap, name)
      if cap and cap > 0 and spent and spent / cap > worst then worst, what, limit = spent / cap, name, cap end
    end
    consider(ctx.spent.conversation, o.per_conversation_usd, "conversation")
    consider(ctx.spent.tenant_day, o.per_tenant_per_day_usd, "tenant's day")
    if worst >= 1 then
      local a = on_over[ctx.phase]
      return a ~= "keep" and a ~= "allow" and a or nil,
        fmt("over budget: the %s spent $%.6f of $%.6f", what, worst * limit, limit)
    end
    if worst >= near then return "near", fmt("near budget: the %s spent $%.6f of $%.6f", what, worst * limit, limit) end
    return nil
  end
  REFRESH[fn] = o.refresh
  return fn
end

--- Seconds between reads of the events a cost budget asked for (nil: the default).
function _M.budget_refresh(fn) return REFRESH[fn] end

-- syntax: rules.budget(n, rule)
function _M.budget(n, rule)
  if type(n) == "table" then return cost_budget(n) end
  n = count(n, "n", "budget")
  if type(rule) ~= "function" then error("bad argument #2 to 'budget' (function expected)", 2) end
  local fn = function(item, ctx)
    local action, reason = rule(item, ctx)
    if action == "kill" and ctx.totals and ctx.totals.kill >= n then
      return "keep", fmt("max-kills budget (%d) spent", n)
    end
    return action, reason
  end
  -- which sandboxes spend the budget follows the order, not how many
  if ANY_ORDER[rule] then return any_order(fn) end
  return fn
end

--- The usual composition: orphans (keep), retention tiers, tenant cap, global
-- cap, under a kill budget.
-- @tparam table o `demote_after`, `kill_after`, `tenant_cap`, `global_cap`,
--   `orphans` ("keep"), `max_kills`
-- @treturn function a `gc` hook
function _M.gc(o)
  o = require("warmbox.errors").check_options(o, { "demote_after", "kill_after", "tenant_cap", "global_cap",
    "orphans", "max_kills" }, "gc", 1)
  local list = { _M.orphans(o.orphans), _M.retention{ demote_after = o.demote_after, kill_after = o.kill_after } }
  if o.tenant_cap then list[#list + 1] = _M.tenant_cap(o.tenant_cap) end
  if o.global_cap then list[#list + 1] = _M.global_cap(o.global_cap) end
  local rule = _M.chain(table.unpack(list))
  if o.max_kills then rule = _M.budget(o.max_kills, rule) end
  return rule
end

-- ------------------------------------------------------------------
-- Checkpoints (a policy's `checkpoint_gc(cp, ctx) -> "delete" | "keep" | nil, reason`;
-- warmbox.gc.checkpoints). `cp`: `id, name, turn, label, created_at, conv`; `ctx`:
-- `now`, `rank` (1 = the newest of its conversation: E2B lists newest first),
-- `has_sandbox` (its conversation has a sandbox, running or paused).
-- ------------------------------------------------------------------

--- At most `max` checkpoints per conversation: the older ones are deleted.
-- syntax: rules.max_checkpoints(n)
function _M.max_checkpoints(max)
  max = count(max, "max", "max_checkpoints")
  return function(_, ctx)
    if ctx.rank and ctx.rank > max then
      return "delete", fmt("over the cap of %d checkpoints per conversation", max)
    end
    return nil
  end
end

--- Checkpoints older than `after` (a duration) are deleted.
-- syntax: rules.checkpoint_after(d)
function _M.checkpoint_after(after)
  local secs, err = _M.duration(after)
  if not secs then error("bad argument #1 to 'checkpoint_after' (" .. err .. ")", 2) end
  return function(cp, ctx)
    if type(cp.created_at) == "number" and ctx.now - cp.created_at > secs then
      return "delete", fmt("taken %s ago (delete after %s)", human(ctx.now - cp.created_at), human(secs))
    end
    return nil
  end
end

--- Checkpoints whose conversation has no sandbox: `action` ("delete" by default, or "keep").
-- syntax: rules.checkpoint_orphans(action)
function _M.checkpoint_orphans(action)
  action = action or "delete"
  if action ~= "keep" and action ~= "delete" then
    error("bad argument #1 to 'checkpoint_orphans' (\"keep\" or \"delete\" expected, got "
      .. tostring(action) .. ")", 2)
  end
  return function(_, ctx)
    if ctx.has_sandbox == false then return action, "its conversation has no sandbox" end
    return nil
  end
end

--- The usual composition for `checkpoint_gc`: orphans, then age, then the cap;
-- the first with an opinion wins, else "keep".
-- @tparam table o `max_checkpoints`, `checkpoint_after`, `orphans` ("keep" | "delete"; default: no opinion)
-- syntax: rules.checkpoints{ max_checkpoints, checkpoint_after, orphans }
function _M.checkpoints(o)
  o = require("warmbox.errors").check_options(o, { "max_checkpoints", "checkpoint_after", "orphans" },
    "checkpoints", 1)
  local list = {}
  if o.orphans then list[#list + 1] = _M.checkpoint_orphans(o.orphans) end
  if o.checkpoint_after then list[#list + 1] = _M.checkpoint_after(o.checkpoint_after) end
  if o.max_checkpoints then list[#list + 1] = _M.max_checkpoints(o.max_checkpoints) end
  return _M.chain(table.unpack(list))
end

-- The default policy's `gc` hook (retention by last activity, orphans kept).
ANY_ORDER[require("warmbox.policy.default").gc] = true

return _M
