--- warmbox.gc.decide: how GC decides what to do with a sandbox, as pure
-- functions (no client, no lock), cheap enough for the simulator's loop.
--
-- A listed sandbox that carries the tag becomes the item a policy sees
-- (`item`: its key, tenant, last activity, whether it looks demoted). The
-- policy's `gc(item, ctx)` hook is asked (`ask`, with `context`: the counts
-- of the pass so far) and its answer read (`answer`): "keep", "kill" or
-- "demote", a reason; a kill past `max_kills` is kept (`budget`). A kill or
-- demote is then done only under the session's lock: when the session
-- remembers a later run of that sandbox (`remembered`), the policy is asked
-- again with that last activity; and the sandbox, listed again, must be
-- the one decided on (`unchanged`). The counts the policy sees are kept with
-- `count` (an action decided and not done is counted back as kept).
-- @module warmbox.gc.decide
local util = require "warmbox.util"
local tag_mod = require "warmbox.tag"
local errors = require "warmbox.errors"
local DEMOTE_MARK = require("warmbox.state").DEMOTE_MARK

local type, pairs, pcall, xpcall, tostring, tonumber = type, pairs, pcall, xpcall, tostring, tonumber
local traceback, fmt, floor, huge = debug.traceback, string.format, math.floor, math.huge
local parse_time, parse_tag, reraise_interrupt = util.parse_time, tag_mod.parse_tag, errors.reraise_interrupt

local _M = {}

-- What a policy may answer.
local ACTIONS = { keep = true, kill = true, demote = true }
_M.ACTIONS = ACTIONS

--- Last activity (unix seconds): a paused sandbox's `end_at` (when it was
-- paused), a running one's `started_at` (E2B resets it on resume).
function _M.last_activity(d)
  if d.state == "paused" then
    return parse_time(d.end_at) or parse_time(d.started_at)
  end
  return parse_time(d.started_at)
end

--- The default tenant of a session key: the part before the first `:`
-- (the whole key when it has none).
-- syntax: tenant = gc.default_tenant(key)
function _M.default_tenant(key)
  if type(key) ~= "string" then return nil end
  return key:match("^([^:]*):") or key
end
local default_tenant = _M.default_tenant

--- The tenant of `key` by the policy's `tenant_of(key, item)`; its default when
-- the hook raises or answers something other than a string.
function _M.tenant(tenant_of, key, item)
  local ok, t = pcall(tenant_of, key, item)
  if not ok then reraise_interrupt(t) end
  return ok and type(t) == "string" and t or default_tenant(key)
end
local tenant = _M.tenant

--- Whether a paused sandbox looks demoted: paused within seconds of its
-- (re)start, as GC's demote does (unix seconds; nil when unknown).
function _M.demoted(started, ended)
  return started ~= nil and ended ~= nil and ended >= started and ended - started <= DEMOTE_MARK
end
local demoted = _M.demoted

--- A listed sandbox as the policy sees it, or nil when it does not carry the
-- tag. `orphan`: the tag is there but is not a warmbox tag value (no key, no tenant).
function _M.item(d, tag, tenant_of)
  local md = d.metadata
  local tv = type(md) == "table" and md[tag]
  if type(tv) ~= "string" or tv == "" then return nil end
  local key, enc = parse_tag(tv)
  local item = {
    sandbox_id = d.sandbox_id, state = d.state, started_at = d.started_at, end_at = d.end_at,
    template_id = d.template_id, metadata = md, tag_value = tv, key = key, orphan = enc == nil,
  }
  local started = parse_time(d.started_at)
  if d.state == "paused" then
    local ended = parse_time(d.end_at)
    item.last_activity, item.demoted = ended or started, demoted(started, ended)
  else
    item.last_activity, item.demoted = started, false
  end
  if enc then item.tenant = tenant(tenant_of, key or tv, item) end
  return item
end

--- The group an item's decisions count in: its tenant, else "(orphans)" or
-- "(hashed)" (a key too long to keep, so no tenant).
function _M.group(item)
  return item.tenant or (item.orphan and "(orphans)") or "(hashed)"
end
local group = _M.group

--- Counts an item's action (`d`: +1 decided, -1 not done after all) into the
-- per-group counts and the totals the policy sees.
function _M.count(tenants, totals, item, action, d)
  local g = group(item)
  local c = tenants[g]
  if not c then
    c = { kept = 0, kill = 0, demote = 0 }
    tenants[g] = c
  end
  local k = action == "keep" and "kept" or action
  c[k] = c[k] + d
  totals[k] = totals[k] + d
end

--- The hook's context: copies of the counts (a hook may keep it). `s` holds
-- the pass's `max_age`, `tag`, `max_kills` and `dry_run`.
function _M.context(s, now, item, tenants, totals)
  local c = tenants[group(item)]
  return { now = now, max_age = s.max_age, retention = s.max_age, tag = s.tag, tag_value = item.tag_value,
    tenant = item.tenant,
    counts = c and { kept = c.kept, kill = c.kill, demote = c.demote } or { kept = 0, kill = 0, demote = 0 },
    totals = { seen = totals.seen, kept = totals.kept, kill = totals.kill, demote = totals.demote },
    max_kills = s.max_kills, dry_run = s.dry_run }
end

--- What the hook's answer means (`ok, action, reason` as `xpcall` returns
-- them): the action and its reason (for a kill or demote without one, how
-- long the sandbox was inactive), or nil and a message (the policy failed).
function _M.answer(ok, action, reason, item, now, max_age)
  if not ok then return nil, "gc policy failed: " .. tostring(reraise_interrupt(action)) end
  if not ACTIONS[action] then
    return nil, "gc policy returned " .. tostring(action) .. " (expected \"keep\", \"kill\" or \"demote\")"
  end
  if reason ~= nil and type(reason) ~= "string" then reason = tostring(reason) end
  if reason == nil and action ~= "keep" and item.last_activity then
    reason = fmt("inactive for %ds (max_age %ds)", floor(now - item.last_activity), floor(max_age))
  end
  return action, reason
end
local answer = _M.answer

local function copy(t)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  return o
end

--- Asks `hook(item, ctx)` (on a copy of the item, under a traceback) and reads
-- its answer: action, reason, or nil and a message.
function _M.ask(hook, item, ctx)
  local ok, action, reason = xpcall(hook, traceback, copy(item), ctx)
  return answer(ok, action, reason, item, ctx.now, ctx.max_age)
end

--- The kill budget: a kill once `kills` reached `max_kills` is kept. Returns
-- the action and reason, and true when the budget turned a kill into a keep.
function _M.budget(action, reason, max_kills, kills)
  if action == "kill" and max_kills and kills >= max_kills then
    return "keep", fmt("max-kills budget (%d) spent", max_kills), true
  end
  return action, reason, false
end

--- The later last run the session's remembered state `st` knows of the item's
-- sandbox (its new last activity), or nil.
function _M.remembered(item, st)
  local last_run = tonumber(st.last_run)
  if st.sandbox_id == item.sandbox_id and last_run and last_run > (item.last_activity or -huge) then
    return last_run
  end
  return nil
end

--- Whether `cur`, the sandbox as listed again under its session's lock, is the
-- one decided on: same tag value, state, start, and (paused) pause time.
function _M.unchanged(item, cur, tag)
  if cur.metadata == nil or cur.metadata[tag] ~= item.tag_value then return false end
  if cur.state ~= item.state then return false end
  if cur.end_at ~= item.end_at and item.state == "paused" then return false end
  if cur.started_at ~= item.started_at then return false end
  return true
end

return _M
