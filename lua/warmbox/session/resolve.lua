--- How a run gets its sandbox: the remembered one (as it is, extended
-- alongside the execute, or refreshed by a connect), else resolved by tag
-- (list, exact re-check, connect + set_timeout per candidate in policy order,
-- duplicates reaped once one is secured), else created; the creates in
-- flight and their orphans. Functions of a session object `s` and its
-- remembered state `st` (warmbox.state's fields), called under its lock.
-- @module warmbox.session.resolve

local policy_mod = require "warmbox.policy"
local util = require "warmbox.util"
local memo = require "warmbox.session.memo"
local tag_mod = require "warmbox.tag"
local decide = require "warmbox.session.decide"

local type, pairs, ipairs, tostring, next = type, pairs, ipairs, tostring, next
local string_format, math_max = string.format, math.max

local is_gone = decide.is_gone
local CREATE_TAG = tag_mod.CREATE_TAG
local new_id = util.unique_id

local _M = {}

-- The error for a policy hook that returned what it must not (`shown`: the
-- value or its type, as the message gives it). → nil, msg, "POLICY"
local function bad_hook(s, hook, shown, want)
  return nil, string_format("policy '%s' hook '%s' returned %s (%s expected)", tostring(s.policy.name), hook,
    shown, want), "POLICY"
end

local forget = memo.forget

--- The lease the policy's `lease` hook asks for (ceiled). → lease | nil, msg, code
-- syntax: lease, err, code = resolve.lease(s, ctx)
function _M.lease(s, ctx)
  local v, err, code = policy_mod.call(s.policy, "lease", ctx)
  if code then return nil, err, code end
  local lease = decide.lease(v)
  if not lease then return bad_hook(s, "lease", tostring(v), "positive number") end
  return lease
end

local remember = memo.remember

--- Whether sandbox `id` is gone as the control plane's `info` confirms (its
-- 404): a 404 on another call may be an intermediary's after it forwarded
-- the call, no proof the sandbox (its kernel, its files) is gone.
-- syntax: gone = resolve.confirmed_gone(s, id) (`info` says 404)
function _M.confirmed_gone(s, id)
  local _, _, code = s.client:info(id)
  return code == "NOT_FOUND"
end
local confirmed_gone = _M.confirmed_gone

-- connect (as client:connect), then whether the sandbox is gone: a 404
-- `info` confirms (see confirmed_gone); an unconfirmed one is followed by one
-- more connect (its failure is then no proof either).
-- → sb, res, code, detail, gone
local function connect_confirmed(s, id, lease)
  local sb, res, ccode, cdetail = s.client:connect(id, { timeout = lease })
  if sb or not is_gone(ccode) then return sb, res, ccode, cdetail, false end
  if confirmed_gone(s, id) then return nil, res, ccode, cdetail, true end
  s:_event("connect", { sandbox_id = id, ok = false, code = ccode, confirmed = false })
  sb, res, ccode, cdetail = s.client:connect(id, { timeout = lease })
  return sb, res, ccode, cdetail, false
end

-- Whether a listed sandbox is known to have lost its memory: the remembered
-- state says so (GC demoted it: `memory_lost`), or it was paused within
-- seconds of its resume, as only a demote (connect + pause without memory) does.
local function memory_lost(it, avoid)
  if avoid[it.sandbox_id] then return true end
  return require("warmbox.state").looks_demoted(it)
end

-- The session's listed sandboxes (running or paused) that pass the exact
-- re-check of the tag. → cands, by_id | nil, msg, code
local function list_candidates(s)
  local tv, tag = s.tag_value, s.tag
  local items, err, code = s.client:list_all{ state = { "running", "paused" }, metadata = { [tag] = tv } }
  if not items then return nil, err, code end
  local cands, by_id = {}, {}
  for _, it in ipairs(items) do
    -- Exact re-check: a loose server-side match never hands over another key's sandbox.
    if type(it) == "table" and type(it.metadata) == "table" and it.metadata[tag] == tv
      and type(it.sandbox_id) == "string" and not by_id[it.sandbox_id] then
      cands[#cands + 1] = it
      by_id[it.sandbox_id] = it
    end
  end
  return cands, by_id
end

-- The candidates in the policy's `order` (a copy of the list goes to the
-- hook; only re-checked candidates, each once). → ordered | nil, msg, code
local function order_candidates(s, st, cands, by_id)
  local copy = {}
  for i, c in ipairs(cands) do copy[i] = c end
  local o, perr, pcode = policy_mod.call(s.policy, "order", copy, s:_ctx(st))
  if pcode then return nil, perr, pcode end
  if type(o) ~= "table" then return bad_hook(s, "order", type(o), "table") end
  local ordered = {}
  local seen = {}
  for _, c in ipairs(o) do
    local id = type(c) == "table" and c.sandbox_id or c
    -- Only candidates that passed the exact re-check can be tried.
    if type(id) == "string" and by_id[id] and not seen[id] then
      seen[id] = true
      ordered[#ordered + 1] = by_id[id]
    end
  end
  return ordered
end

-- Whether a lifecycle resumes its sandbox on traffic (autoResume with pause on timeout).
local function auto_resumes(lc)
  return type(lc) == "table" and lc.auto_resume == true and lc.on_timeout == "pause" or nil
end

-- Tries the ordered candidates (connect + set_timeout) until one is secured;
-- the gone ones are marked in `gone`. → kept sandbox, resumed | nil, false
-- (none) | false, msg, code, detail (a failure that fails the run)
local function secure_candidate(s, st, ordered, lease, avoid, gone)
  local client = s.client
  for _, it in ipairs(ordered) do
    if s.require_memory and memory_lost(it, avoid) then
      -- Not usable for a session that needs its kernel's memory; killed
      -- once another sandbox is secured.
      s:_event("memory_lost", { sandbox_id = it.sandbox_id })
      goto continue
    end
    do
      local t0 = s.clock()
      local sb, res, ccode, cdetail, cgone = connect_confirmed(s, it.sandbox_id, lease)
      s:_event("connect", { sandbox_id = it.sandbox_id, ok = sb ~= nil, resumed = sb and res or nil,
        code = not sb and ccode or nil })
      if not sb then
        -- Only a sandbox `info` says is gone is passed over (its kernel and files are the conversation's).
        if not cgone then return false, res, ccode, cdetail end
        gone[it.sandbox_id] = true
      else
        local ok, terr, tcode, tdetail = client:set_timeout(it.sandbox_id, lease)
        if ok then
          if sb.sandbox_id == nil then sb.sandbox_id = it.sandbox_id end
          local resumed = res == true
          remember(s, st, sb, t0 + lease, resumed and t0 or util.parse_time(it.started_at))
          memo.set_auto_resume(st, auto_resumes(it.lifecycle))
          return sb, resumed
        end
        if not is_gone(tcode) or not confirmed_gone(s, it.sandbox_id) then
          -- Its lease could not be set: it is not used for this run (it might
          -- pause underneath it), and it is left alone: the next run tries again.
          s:_event("lease_failed", { sandbox_id = it.sandbox_id, code = tcode })
          return false, terr, tcode, tdetail
        end
        gone[it.sandbox_id] = true
      end
    end
    ::continue::
  end
  return nil, false
end

-- Creates in flight: each create carries a fresh id in its metadata
-- (`warmbox.tag.CREATE_TAG`), recorded in the remembered state before the
-- create is sent. A listed sandbox whose id is still recorded is an orphan
-- (its create was given up: a timeout, a crash, a cancelled task; or it was
-- made more than once: answered 503/429 after an intermediary forwarded it,
-- then sent again with the same id): never preferred to another, collected
-- once a sandbox is secured. An answered create keeps its record, with the
-- sandbox it answered (`kept`: never an orphan), until the first listing
-- after a run (`collect_orphans`) has seen what else it made: sent more than
-- once by the client (503/429 after forwarding), or by an intermediary that
-- forwarded it twice and gave one answer (nothing tells the client). One list
-- per create, none on a warm run.
local REFUSED_CREATE = { BAD_REQUEST = true, AUTH = true, RATE_LIMITED = true, POLICY = true, FORBIDDEN = true }

local function record_create(s, st)
  local id = new_id()
  memo.record_create(s, st, id, s.clock())
  s:_save(st)
  return id
end

-- The create id of a listed sandbox whose create is still recorded (an
-- orphan: not the sandbox the create answered), else nil.
local function orphan_of(st, it)
  local id = type(it.metadata) == "table" and it.metadata[CREATE_TAG]
  if type(id) ~= "string" then return nil end
  for _, c in ipairs(st.creating or {}) do
    if type(c) == "table" and c.id == id and c.kept ~= it.sandbox_id then return id end
  end
  return nil
end

-- The create's parameters from the policy's `create_params` (the tag and a
-- lease at least `lease` imposed; `from`: a snapshot id). → params | nil, msg, code
local function create_params(s, st, lease, from)
  local ctx = s:_ctx(st)
  ctx.lease = lease
  local p, perr, pcode = policy_mod.call(s.policy, "create_params", ctx)
  if pcode then return nil, perr, pcode end
  if type(p) ~= "table" then return bad_hook(s, "create_params", type(p), "table") end
  local params = {}
  for k, v in pairs(p) do params[k] = v end
  params.template = from or params.template or s.template
  if params.timeout ~= nil and not decide.lease(params.timeout) then
    return nil, string_format("policy '%s' hook 'create_params' returned timeout %s (positive number expected)",
      tostring(s.policy.name), tostring(params.timeout)), "POLICY"
  end
  -- Never shorter than the lease: the first run must not be paused underneath itself.
  params.timeout = math_max(params.timeout or lease, lease)
  params.lifecycle = params.lifecycle or { on_timeout = "pause", auto_resume = true }
  local md = {}
  for k, v in pairs(params.metadata or {}) do md[k] = v end
  md[s.tag] = s.tag_value -- the tag is not negotiable: it is what keeps tenants apart
  if s._branch_of then md.warmboxBranchOf = s._branch_of end  -- the ledger's lineage of a branch
  params.metadata = md
  if next(s.env) and params.env_vars == nil then params.env_vars = s.env end
  return params
end

--- Creates the session's sandbox with the policy's `create_params` (`from`:
-- the id of a snapshot to start from, for warmbox.session.checkpoint).
-- → sb | nil, msg, code, detail
-- syntax: sb, err, code, detail = resolve.create(s, st, lease[, from])
function _M.create(s, st, lease, from)
  local params, perr, pcode = create_params(s, st, lease, from)
  if not params then return nil, perr, pcode end
  local nonce = record_create(s, st)
  params.metadata[CREATE_TAG] = nonce
  local t0 = s.clock()
  local sb, cerr, ccode, cdetail = s.client:create(params)
  if not sb then
    -- An answer of the API itself that refused the create: nothing was made.
    if REFUSED_CREATE[ccode] or type(cdetail) ~= "table" then memo.settle_create(st, nonce) end
    s:_save(st)
    return nil, cerr, ccode, cdetail
  end
  -- Another attempt (or an intermediary's copy) may have made a sandbox too,
  -- found by the listing after the run (collect_orphans).
  memo.answered_create(st, nonce, sb.sandbox_id)
  s:_event("create", { sandbox_id = sb.sandbox_id })
  remember(s, st, sb, t0 + params.timeout, t0)
  memo.set_auto_resume(st, auto_resumes(params.lifecycle))
  return sb
end
local create = _M.create

-- Whether a listed candidate was made by the create `id` (its record then goes).
local function orphan_seen(cands, id)
  for _, it in ipairs(cands) do
    if type(it.metadata) == "table" and it.metadata[CREATE_TAG] == id then return true end
  end
  return false
end

-- The candidates in `ordered`, the orphans (see `orphan_of`) moved last: an
-- empty sandbox whose create was given up never wins over one in use.
local function orphans_last(st, ordered)
  if not st.creating then return ordered end
  local out, tail = {}, {}
  for _, it in ipairs(ordered) do
    local t = orphan_of(st, it) and tail or out
    t[#t + 1] = it
  end
  for _, it in ipairs(tail) do out[#out + 1] = it end
  return out
end

--- After a run: the orphans of the creates still recorded (listed by tag) are
-- killed, their records dropped (an answered create's too: the listing saw
-- what else it made; a record whose orphan could not be killed stays). One
-- list, only while a create is recorded.
-- syntax: resolve.collect_orphans(s, st)
function _M.collect_orphans(s, st)
  local cands = list_candidates(s)
  if not cands then return end
  local failed = {}
  for _, it in ipairs(cands) do
    local orphan = orphan_of(st, it)
    if orphan and it.sandbox_id ~= st.sandbox_id then
      local ok = s.client:kill(it.sandbox_id)
      if ok then s:_event("kill", { sandbox_id = it.sandbox_id, reason = "orphan" }) end
      if ok == nil then failed[orphan] = true end
    end
  end
  local left = {}
  for _, c in ipairs(memo.recent_creates(st, s.clock())) do
    if failed[c.id] or (c.kept == nil and not orphan_seen(cands, c.id)) then left[#left + 1] = c end
  end
  memo.keep_creates(st, left)
end

--- After a run: the sandboxes a rewind replaced but could not kill are killed
-- (those whose kill fails again stay recorded).
-- syntax: resolve.collect_replaced(s, st) (kills the sandboxes a rewind could not)
function _M.collect_replaced(s, st)
  local left = {}
  for _, id in ipairs(type(st.replaced) == "table" and st.replaced or {}) do
    if type(id) == "string" and id ~= st.sandbox_id then
      local ok = s.client:kill(id)
      if ok then s:_event("kill", { sandbox_id = id, reason = "rewind" }) end
      if ok == nil then left[#left + 1] = id end
    end
  end
  memo.keep_replaced(st, left)
end

-- Finds or creates the session's sandbox and secures its lease (the reference
-- flow: list, exact re-check, connect + set_timeout per candidate in policy
-- order, reap the others only after one is secured, else create). Only a
-- candidate that is gone (404) is passed over; any other failure fails the
-- run and touches nothing, so a transient fault never destroys state.
local function resolve(s, st, lease, avoid)
  avoid = avoid or {}
  local cands, by_id, code = list_candidates(s)
  if not cands then return nil, by_id, code end
  local ordered = cands
  if #cands > 0 then
    local perr, pcode
    ordered, perr, pcode = order_candidates(s, st, cands, by_id)
    if not ordered then return nil, perr, pcode end
    ordered = orphans_last(st, ordered)
  end
  local gone = {}
  local kept, resumed, ccode, cdetail = secure_candidate(s, st, ordered, lease, avoid, gone)
  if kept == false then return nil, resumed, ccode, cdetail end -- resumed: the failure's message
  local created = false
  if not kept then
    local cerr
    kept, cerr, ccode, cdetail = create(s, st, lease)
    if not kept then return nil, cerr, ccode, cdetail end
    created = true
  end
  -- Reap duplicates only now that one sandbox is secured (the gone ones need nothing).
  for _, it in ipairs(cands) do
    local orphan = orphan_of(st, it)
    if it.sandbox_id ~= kept.sandbox_id and not gone[it.sandbox_id] then
      s.client:kill(it.sandbox_id)
      s:_event("kill", { sandbox_id = it.sandbox_id, reason = orphan and "orphan" or "duplicate" })
    end
    if orphan then memo.settle_create(st, orphan) end
  end
  return { sandbox_id = kept.sandbox_id, reused = not created, resumed = resumed, how = created and "create"
    or "resolve", lease = lease }
end

-- The remembered sandbox (same tag value) for one run: as it is when
-- `should_refresh` says so, extended alongside the execute, or refreshed by
-- `connect`; gone: forgotten and resolved again (see `secure`).
local function secure_remembered(s, st, ctx, lease, eager)
  local refresh, perr, pcode = policy_mod.call(s.policy, "should_refresh", ctx)
  if pcode then return nil, perr, pcode end
  if not refresh then
    return { sandbox_id = st.sandbox_id, reused = true, resumed = false, how = "remembered", lease = lease }
  end
  -- Alongside the execute (one round trip) when the remembered lease still
  -- has a safe margin, or the execute resumes a paused sandbox (see
  -- warmbox.session.execute). Both need `parallel` (warmbox.new gives it;
  -- without it: connect first). A prewarm (`eager`) connects now instead:
  -- the sandbox is made ready before the run.
  local how = decide.remembered_way(st.lease_end, st.auto_resume, s.clock(), lease, s.parallel and not eager)
  if how then
    return { sandbox_id = st.sandbox_id, reused = true, resumed = how ~= "alongside", how = how, lease = lease }
  end
  local t0 = s.clock()
  local sb, res, ccode, cdetail, cgone = connect_confirmed(s, st.sandbox_id, lease)
  s:_event("connect", { sandbox_id = st.sandbox_id, ok = sb ~= nil, resumed = sb and res or nil,
    code = not sb and ccode or nil })
  if sb then
    if sb.sandbox_id == nil then sb.sandbox_id = st.sandbox_id end
    remember(s, st, sb, t0 + lease, res == true and t0 or nil)
    return { sandbox_id = st.sandbox_id, reused = true, resumed = res == true, how = "refresh", lease = lease }
  end
  -- A transient fault fails the run and keeps what is remembered (the next
  -- run tries again); only a sandbox that is gone (`info` says so) is forgotten.
  if not cgone then return nil, res, ccode, cdetail end
  forget(st)
  return resolve(s, st, lease)
end

-- The three ways to a sandbox for one run (see `acquire`).
local function secure(s, st, ctx, lease, eager)
  if s.require_memory and st.sandbox_id and st.memory_lost == st.sandbox_id then
    -- GC demoted it (paused without memory): replace it (see resolve).
    local stale = st.sandbox_id
    forget(st)
    return resolve(s, st, lease, { [stale] = true })
  end
  if st.sandbox_id and st.tag == s.tag_value then
    return secure_remembered(s, st, ctx, lease, eager)
  elseif st.sandbox_id then
    forget(st)
  end
  return resolve(s, st, lease)
end

-- Once per session object without a watchdog (no `parallel`): idle_timeout
-- cannot take effect, as a run's lease covers the run's timeout and
-- LEASE_MARGIN (the sandbox pauses `lease` s after the run starts, not
-- idle_timeout s). Event "lease_floor".
local function warn_floor(s, run_timeout, lease)
  if s.floor_warned or s.idle_timeout >= run_timeout then return end
  s.floor_warned = true
  s:_event("lease_floor", { idle_timeout = s.idle_timeout, run_timeout = run_timeout, lease = lease,
    margin = decide.LEASE_MARGIN })
end

-- E2B ends a run at its start + the maximum run length, whatever the lease
-- says: pausing (memory kept) and connecting starts a new run of the same
-- kernel. → got | nil, msg, code, detail
local function recycle(s, st, got, lease)
  local ok, perr, pcode, pdetail = s.client:pause(got.sandbox_id)
  if ok == nil and pcode ~= "NOT_FOUND" then return nil, perr, pcode, pdetail end
  local t0 = s.clock()
  local sb, res, ccode, cdetail = s.client:connect(got.sandbox_id, { timeout = lease })
  s:_event("recycle", { sandbox_id = got.sandbox_id, ok = sb ~= nil })
  if not sb then
    -- Paused (memory kept): the next run's connect resumes it, unless it is gone.
    if is_gone(ccode) then forget(st) else memo.lease_unknown(st) end
    return nil, res, ccode, cdetail
  end
  if sb.sandbox_id == nil then sb.sandbox_id = got.sandbox_id end
  remember(s, st, sb, t0 + lease, t0)
  got.how = "recycle" -- resumed and leased by that connect
  return got
end

--- Secures a sandbox for one run: the remembered one when the policy says
-- its lease needs no refresh (no request), the remembered one refreshed by `connect` (one
-- request: resumes a paused one and extends the lease), else resolve.
-- `eager` (a prewarm): the sandbox is made ready now, never left to the
-- execute (no alongside extension, no auto-resume by traffic).
-- → info `{ sandbox_id, reused, resumed, how, lease }` | nil, msg, code, detail
-- syntax: info, err, code, detail = resolve.acquire(s, st, run_timeout[, eager])
function _M.acquire(s, st, run_timeout, eager)
  local ctx = s:_ctx(st, run_timeout)
  local v, err, code = policy_mod.call(s.policy, "lease", ctx)
  if code then return nil, err, code end
  -- Watched (`parallel`): the run's watchdog keeps the lease while it goes
  -- on, so the lease is the policy's (the idle window), not the run's timeout.
  local lease, floored = decide.lease(v, run_timeout, ctx.watched)
  if not lease then return bad_hook(s, "lease", tostring(v), "positive number") end
  if floored then warn_floor(s, run_timeout, lease) end
  ctx.lease = lease
  s:_event("lease", { lease = lease, run_timeout = run_timeout })
  local got, gerr, gcode, gdetail = secure(s, st, ctx, lease, eager)
  if not got then return nil, gerr, gcode, gdetail end
  -- A run that could cross the maximum run length would be paused underneath itself.
  if decide.recycle_due(st.run_started, s.max_run_length, s.clock(), run_timeout) then
    return recycle(s, st, got, lease)
  end
  return got
end

return _M
