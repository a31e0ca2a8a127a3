--- warmbox.sim.fast.gc: a GC pass (warmbox.gc's decisions) on the model, in
-- one instant: every live tagged sandbox, newest first, as `warmbox.gc` sees
-- it (item, counts, totals), the policy's `gc` hook, a busy session (a run or
-- prewarm in flight) skipped, the remembered last run of a running sandbox
-- asked again, then kills and demotes. Its listing, kills and demotes take no
-- virtual time. `sim` is the fast path's state (see warmbox.sim.fast).
-- @module warmbox.sim.fast.gc

local model_mod = require "warmbox.sim.model"
local tag_mod = require "warmbox.tag"
local rules = require "warmbox.sim.fast.rules"

local type, pairs, ipairs, pcall = type, pairs, ipairs, pcall
local math_floor, math_ceil, math_max = math.floor, math.ceil, math.max

local ops = model_mod.ops
local stop_running, start_paused, end_paused, remove, touch = ops.stop_running, ops.start_paused, ops.end_paused,
  ops.remove, ops.touch
local rfc3339 = model_mod.rfc3339
local parse_tag = tag_mod.parse_tag
local forget, tenant, group, looks_demoted = rules.forget, rules.tenant, rules.group, rules.looks_demoted
local gc_answer, ran_since, default_kill, count = rules.gc_answer, rules.ran_since, rules.default_kill, rules.count

-- Milliseconds, as E2B's RFC 3339 times carry them (and warmbox.gc parses them back).
local function ms(t) return math_floor(t * 1000 + 0.5) / 1000 end

local function copy(t)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  return o
end

-- The item a hook sees for sandbox b of tag value tv (refilled into `it`,
-- sim.gc_item), and the group it counts in. What GC derives from a tag value (its key, tenant, whether it is an
-- orphan) is made once per tag value; a sandbox's metadata copy, once per
-- sandbox. The item is one table refilled for each sandbox (as its context):
-- a gc hook must neither keep nor change them.
local function item_of(sim, b, tv, it)
  local info = b.gc_info or sim.tv_info[tv]
  if not info then
    local key, enc = parse_tag(tv)
    info = { tv = tv, key = key, orphan = enc == nil }
    if enc then info.tenant = tenant(sim.tenant_of, key or tv) end
    info.group = group(info)
    sim.tv_info[tv] = info
  end
  local md = b.gc_md
  if not md then
    md = {}
    for k, v in pairs(b.metadata) do md[k] = v end
    b.gc_md, b.gc_info = md, info
  end
  -- The listed times (RFC 3339, milliseconds), formatted again only when they
  -- change (the cache warmbox.sim.model's listing keeps too).
  local sa, ea = b.started_at, b.end_at
  if b.fmt_started ~= sa then b.fmt_started, b.s_started = sa, rfc3339(sa) end
  if b.fmt_end ~= ea then b.fmt_end, b.s_end = ea, rfc3339(ea) end
  local s, e = ms(sa), ms(ea)
  it.sandbox_id, it.started_at, it.end_at, it.template_id, it.metadata = b.id, b.s_started, b.s_end, b.template, md
  it.tag_value, it.key, it.orphan, it.tenant = tv, info.key, info.orphan, info.tenant
  if b.state == "paused" then
    it.state, it.last_activity, it.demoted = "paused", e, looks_demoted(s, e)
  else
    it.state, it.last_activity, it.demoted = "running", s, false
  end
  return it, info.group
end

-- The default policy's kills at T, appended to acts newest first. Its hook
-- (warmbox.policy.default.gc) reads nothing but the item's orphan and last
-- activity, and nothing but its kills is booked: only sandboxes whose last
-- activity is older than the cut can be killed, and a listed last activity is
-- never before the start (ms(started_at) for a running one, ms(end_at) >= it
-- for a paused one), so they are all at the list's oldest end. Walk from
-- there up to the cut (with a second of slack), then act on them newest
-- first, the order of the full listing.
local function default_kills(sim, T, acts)
  local mage = sim.max_age or 86400
  local cut = T - mage + 1
  local tag, gc_item = sim.tag, sim.gc_item
  local found = {}
  local b = sim.model.oldest
  while b and b.started_at <= cut do
    local info = b.gc_info
    local tv = info and info.tv or b.metadata[tag]
    if info or (type(tv) == "string" and tv ~= "") then
      local it = item_of(sim, b, tv, gc_item)
      if default_kill(it.orphan, it.last_activity, T, mage) then
        found[#found + 1] = { item = copy(it), action = "kill", b = b }
      end
    end
    b = b.newer
  end
  for i = #found, 1, -1 do acts[#acts + 1] = found[i] end
end

-- The policy's gc hook on every tagged sandbox listed from b (newest) on,
-- counted into tenants and totals, what it does not keep appended to acts.
-- → the number listed, the number of hook errors
local function list(sim, b, tenants, totals, acts)
  local nlisted, errs = 0, 0
  local tag, gctx, gc_hook, gc_item = sim.tag, sim.gctx, sim.gc_hook, sim.gc_item
  while b do
    nlisted = nlisted + 1
    local info = b.gc_info       -- a sandbox's metadata never changes: its tag value is known
    local tv = info and info.tv or b.metadata[tag]
    if info or (type(tv) == "string" and tv ~= "") then
      -- decide(item) and count(item, action, 1), inlined; the context's
      -- counts and totals are the pass's own tables (read-only for the hook)
      local it, grp = item_of(sim, b, tv, gc_item)
      local cc = tenants[grp]
      if not cc then cc = { kept = 0, kill = 0, demote = 0 }; tenants[grp] = cc end
      totals.seen = totals.seen + 1
      gctx.counts, gctx.totals, gctx.tag_value, gctx.tenant = cc, totals, tv, it.tenant
      local ok, action = pcall(gc_hook, it, gctx)
      local msg
      -- what the answer means (the common one, keep, without a call)
      if not (ok and action == "keep") then action, msg = gc_answer(ok, action) end
      if action == "keep" then
        cc.kept = cc.kept + 1
        totals.kept = totals.kept + 1
      elseif action then
        cc[action] = cc[action] + 1
        totals[action] = totals[action] + 1
        acts[#acts + 1] = { item = copy(it), action = action, b = b }
      else
        errs = errs + 1
        sim.note_error("POLICY", msg)
      end
    end
    b = b.older
  end
  return nlisted, errs
end

-- GC's kill of sandbox bx at T (st: its conversation's memory, or nil).
local function kill(sim, bx, st, T)
  remove(sim.model, bx, T)
  local stats = sim.stats
  stats.kills = stats.kills + 1
  sim.nreq = sim.nreq + 1
  -- the session forgets it (its next run resolves at once)
  if st and st.sandbox_id == bx.id then forget(st) end
end

-- GC's demote of sandbox bx at T (paused without its memory; st: its
-- conversation's memory, or nil).
local function demote(sim, bx, st, T)
  local model, stats = sim.model, sim.stats
  if bx.state == "paused" then
    sim.nreq = sim.nreq + 1
    end_paused(model, bx, T)
    bx.started_at = T
    touch(model, bx)
    stats.resumes = stats.resumes + 1
  else
    stop_running(model, bx, T)
  end
  sim.nreq = sim.nreq + 1
  start_paused(bx, T)
  bx.memory, bx.kernel, bx.hooked = false, false, false
  stats.pauses = stats.pauses + 1
  if st and st.sandbox_id == bx.id then
    st.hooked = nil
    st.memory_lost = bx.id
  end
end

-- The hook asked again about item at T (its counts and totals copies of the
-- pass's). → the action, or nil (an error, noted)
local function decide(sim, tenants, totals, item, T)
  local cc = tenants[group(item)]
  local gctx = sim.gctx
  gctx.counts = { kept = cc and cc.kept or 0, kill = cc and cc.kill or 0, demote = cc and cc.demote or 0 }
  gctx.totals = { seen = totals.seen, kept = totals.kept, kill = totals.kill, demote = totals.demote }
  gctx.now, gctx.tag_value, gctx.tenant = T, item.tag_value, item.tenant
  local action, msg = gc_answer(pcall(sim.gc_hook, item, gctx))
  if not action then sim.note_error("POLICY", msg) end
  return action
end

-- The pass's actions at T: a busy session's skipped; a session that ran
-- since the listing asked again. → killed, demoted, busy, errors
local function act(sim, T, acts, tenants, totals)
  local by_tv = sim.by_tv
  local killed, demoted, busy, errs = 0, 0, 0, 0
  for _, e in ipairs(acts) do
    local item, action, bx = e.item, e.action, e.b
    local c = by_tv[item.tag_value]
    if c and c.lock_until > T then
      count(tenants, totals, item, action, -1)
      count(tenants, totals, item, "keep", 1)
      busy = busy + 1
    else
      sim.nreq = sim.nreq + 1          -- its re-check (info)
      local st = c and c.st
      if ran_since(st, item) then
        item.last_activity = st.last_run
        count(tenants, totals, item, action, -1)
        action = decide(sim, tenants, totals, item, T)
        if action then
          count(tenants, totals, item, action, 1)
        else
          errs = errs + 1
          count(tenants, totals, item, "keep", 1)
        end
      end
      if action == "kill" then
        kill(sim, bx, st, T)
        killed = killed + 1
      elseif action == "demote" then
        demote(sim, bx, st, T)
        demoted = demoted + 1
      end
    end
  end
  return killed, demoted, busy, errs
end

-- One GC pass at T, counted in the report.
local function pass(sim, T)
  local tenants, totals = {}, { seen = 0, kept = 0, kill = 0, demote = 0 }
  local acts = {}
  local model = sim.model
  local b = model.newest
  local nlisted = 0
  sim.gctx.now = T
  if sim.default_gc then
    -- the default policy's hook, played without a call per listed sandbox
    nlisted = model.nlive
    default_kills(sim, T, acts)
    b = nil
  end
  local nl, errs = list(sim, b, tenants, totals, acts)
  nlisted = nlisted + nl
  sim.nreq = sim.nreq + math_max(1, math_ceil(nlisted / 100))   -- the listing's pages
  local killed, demoted, busy, aerrs = act(sim, T, acts, tenants, totals)
  local report = sim.report
  report.gc_passes = report.gc_passes + 1
  report.gc_kills = report.gc_kills + killed
  report.gc_demoted = report.gc_demoted + demoted
  report.gc_busy = report.gc_busy + busy
  report.gc_errors = report.gc_errors + errs + aerrs
end

-- A table of the pass (as warmbox.sim.model's `ops`), for the fast path's files only.
return { pass = pass }
