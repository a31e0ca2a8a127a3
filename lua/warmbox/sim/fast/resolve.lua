--- warmbox.sim.fast.resolve: the session's resolve (session/resolve.lua's resolve) on the
-- model: a list by tag, the policy's `order`, `connect` + `set_timeout` per
-- candidate, else a `create` with `create_params`; the duplicates reaped.
-- Also the policy hooks' shared context (`fill`). `sim` is the fast path's
-- state (see warmbox.sim.fast); `c` a conversation, `st` what its session
-- remembers (see rules.forget).
-- @module warmbox.sim.fast.resolve

local model_mod = require "warmbox.sim.model"
local rules = require "warmbox.sim.fast.rules"
local requests = require "warmbox.sim.fast.requests"
local parse_time = require("warmbox.util").parse_time

local type, pairs, ipairs, tostring, pcall, next = type, pairs, ipairs, tostring, pcall, next
local string_format = string.format
local table_sort = table.sort

local running_delta, add_box, listed = model_mod.ops.running_delta, model_mod.ops.add_box, model_mod.ops.detail_of
local at, connect, set_timeout, kill = requests.at, requests.connect, requests.set_timeout, requests.kill
local info = requests.info
local remember, auto_resume_of, is_gone = rules.remember, rules.auto_resume_of, rules.is_gone
local create_timeout, default_lifecycle = rules.create_timeout, rules.default_lifecycle

-- The one context table, refilled for each hook call (a hook must not keep it).
local function fill(sim, c, st, t, run_timeout)
  local x = sim.ctx
  x.key, x.tag_value, x.now, x.run_timeout = c.skey, c.stv, t, run_timeout or sim.exec_timeout
  x.lease_end, x.sandbox_id, x.lease = st.lease_end, st.sandbox_id, nil
  return x
end

local function hook_failed(sim, name, err)
  return string_format("policy '%s' hook '%s' failed: %s", sim.pname, name, tostring(err))
end

local function hook_returned(sim, name, shown, want)
  return string_format("policy '%s' hook '%s' returned %s (%s expected)", sim.pname, name, shown, want)
end

local function newest_first(x, y)
  return x.started_at > y.started_at or (x.started_at == y.started_at and x.n > y.n)
end

-- The listed candidates of tag value tv at a (running or paused), newest
-- first; nil when the pool is empty.
local function candidates(sim, tv, a)
  local by_md_tag = sim.by_md_tag
  local pool = by_md_tag and by_md_tag[tv]
  local cands
  if pool and next(pool) then
    local model = sim.model
    cands = {}
    for b in pairs(pool) do
      at(model, b, a)
      if b.state == "running" or b.state == "paused" then cands[#cands + 1] = b end
    end
    table_sort(cands, newest_first)
  end
  return cands
end

-- The candidates in `order`'s order (a copy of the list goes to the hook;
-- only listed ones, each once). → ordered ids, by_id, rec | nil, msg, code
local function ordered(sim, c, st, t, cands)
  local items, by_id, rec = {}, {}, {}
  for i, b in ipairs(cands) do
    local d = listed(b)
    items[i], by_id[b.id], rec[b.id] = d, d, b
  end
  local copy = {}
  for i, d in ipairs(items) do copy[i] = d end
  local ok, o = pcall(sim.order_hook, copy, fill(sim, c, st, t))
  if not ok then return nil, hook_failed(sim, "order", o), "POLICY" end
  if type(o) ~= "table" then return nil, hook_returned(sim, "order", type(o), "table"), "POLICY" end
  local ids, seen = {}, {}
  for _, it in ipairs(o) do
    local id = type(it) == "table" and it.sandbox_id or it
    if type(id) == "string" and by_id[id] and not seen[id] then
      seen[id] = true
      ids[#ids + 1] = id
    end
  end
  return ids, by_id, rec
end

-- The candidates in `order`'s order, each tried with connect + set_timeout
-- until one is secured (secure_candidate). → t_after, kept id (or nil), gone
-- | t_after, false, msg, code
local function secure_candidate(sim, c, st, lease, t, cands)
  local ids, by_id, rec = ordered(sim, c, st, t, cands)
  if not ids then return t, false, by_id, rec end
  local gone = {}
  for _, id in ipairs(ids) do
    local d = by_id[id]
    local t1 = t
    local t2, resumed, cerr, ccode = connect(sim, id, lease, t, rec[id])
    t = t2
    sim.nconnect = sim.nconnect + 1
    if resumed == nil then
      if not is_gone(ccode) then return t, false, cerr, ccode end
      t = info(sim, id, t, rec[id]) -- the 404 confirmed (the model's are real)
      gone[id] = true
    else
      local t3, ok2, terr, tcode = set_timeout(sim, id, lease, t, rec[id])
      t = t3
      if ok2 then
        remember(st, rec[id], t1 + lease, resumed and t1 or parse_time(d.started_at), sim.max_length)
        st.auto_resume = auto_resume_of(d.lifecycle)
        return t, id, gone
      end
      if not is_gone(tcode) then return t, false, terr, tcode end
      t = info(sim, id, t, rec[id])
      gone[id] = true
    end
  end
  return t, nil, gone
end

-- A new sandbox with `create_params` at t (resolve.create). → t_after, id | t_after, nil, msg, code
local function create(sim, c, st, lease, t)
  local ctx = fill(sim, c, st, t)
  ctx.lease = lease
  local ok, p = pcall(sim.create_hook, ctx)
  if not ok then return t, nil, hook_failed(sim, "create_params", p), "POLICY" end
  if type(p) ~= "table" then return t, nil, hook_returned(sim, "create_params", type(p), "table"), "POLICY" end
  local timeout = create_timeout(p.timeout, lease)
  if not timeout then
    return t, nil, hook_returned(sim, "create_params", "timeout " .. tostring(p.timeout), "positive number"),
      "POLICY"
  end
  local tag, stv = sim.tag, c.stv
  local md = {}
  for k, v in pairs(p.metadata or {}) do md[k] = v end
  md[tag] = stv
  local lc = p.lifecycle or default_lifecycle()
  local t1 = t
  sim.nreq = sim.nreq + 1
  local rtt2 = sim.rtt2
  local a = t + rtt2
  if timeout > sim.max_length then
    return a + rtt2, nil, string_format("timeout cannot be greater than %g hours", sim.cfg.max_length_hours),
      "BAD_REQUEST"
  end
  local model = sim.model
  local r = a + sim.create_s
  running_delta(model, a, 1.5)           -- booting counts as running, not towards the peak
  running_delta(model, r, -1.5)
  local b = add_box(model, { template = p.template or sim.template, metadata = md, lifecycle = lc }, timeout, r)
  if not sim.by_md_tag then sim.by_md_tag = model.by_md[tag] end
  local by_tv = sim.by_tv
  by_tv[stv] = by_tv[stv] or c
  t = r + rtt2
  local events = sim.events
  events.create = events.create + 1
  sim.m_created = true
  remember(st, b, t1 + timeout, t1, sim.max_length)
  st.auto_resume = auto_resume_of(lc)
  st.creating = true -- its record: the next successful run lists once (session/resolve.lua's collect_orphans)
  return t, b.id
end

-- The resolve (list, order, connect + set_timeout, else create, reap) at t.
-- → t_after, id, reused | t_after, nil, msg, code
local function resolve(sim, c, st, lease, t)
  sim.nreq = sim.nreq + 1
  local rtt2 = sim.rtt2
  local a = t + rtt2
  local cands = candidates(sim, c.stv, a)
  if not sim.by_md_tag then sim.by_md_tag = sim.model.by_md[sim.tag] end
  t = a + rtt2
  local kept, gone = nil, nil
  if cands and #cands > 0 then
    local t2, k, g, code = secure_candidate(sim, c, st, lease, t, cands)
    t = t2
    if k == false then return t, nil, g, code end
    kept, gone = k, g
  end
  local created = false
  if not kept then
    local t2, id, err, code = create(sim, c, st, lease, t)
    t = t2
    if not id then return t, nil, err, code end
    kept, created = id, true
  end
  if cands then
    local events = sim.events
    for _, b in ipairs(cands) do
      if b.id ~= kept and not (gone and gone[b.id]) then
        t = kill(sim, b.id, t, b)
        events.kill = events.kill + 1
      end
    end
  end
  return t, kept, not created
end

-- A table of the resolve's parts (as warmbox.sim.model's `ops`), for the fast path's files only.
return { fill = fill, hook_failed = hook_failed, hook_returned = hook_returned, resolve = resolve }
