--- warmbox.sim.fast.rules: the session's and GC's rules the fast path plays.
--
-- The fast path does not run `warmbox.session` or `warmbox.gc`: it plays
-- their decisions on the model's records. Every rule and constant it copies
-- from them is here, one small function each, named after the engine code it
-- mirrors. Where the engine keeps the rule in a pure module
-- (`warmbox.session.decide`, `warmbox.session.retry`, `warmbox.gc.decide`),
-- the fast path calls that module: the rule is written once. What is left
-- here is the bookkeeping on the fast path's own records and the two rules
-- the engine states inline (the create's lifecycle and timeout). The agreement specs
-- (spec/unit/sim_spec.lua, spec/integration/sim_agreement_spec.lua) check
-- that the two paths give the same counts.
-- @module warmbox.sim.fast.rules

local sdecide = require "warmbox.session.decide"
local retry = require "warmbox.session.retry"
local gdecide = require "warmbox.gc.decide"

local type = type
local math_max, math_min, math_huge = math.max, math.min, math.huge

-- ----------------------------------------------------------------
-- Constants
-- ----------------------------------------------------------------

local LEASE_MARGIN, COVER_MARGIN, PAUSE_GRACE = sdecide.LEASE_MARGIN, sdecide.COVER_MARGIN, sdecide.PAUSE_GRACE
-- warmbox.state.DEMOTE_MARK: a sandbox paused within this many seconds of its resume looks demoted.
local DEMOTE_MARK = require("warmbox.state").DEMOTE_MARK

-- ----------------------------------------------------------------
-- The session (warmbox.session)
-- ----------------------------------------------------------------

-- The lease of a run from the `lease` hook's answer (warmbox.session.decide.lease):
-- nil when the answer is not a positive finite number.
-- The fast path plays sessions with a watchdog (warmbox.new's, `parallel`):
-- the lease is the policy's from MIN_LEASE up.
local s_lease = sdecide.lease
local function lease_of(value, run_timeout) return (s_lease(value, run_timeout, true)) end

-- A remembered lease end capped at the run's start + the maximum run length.
local capped = sdecide.lease_end

-- What a session remembers (warmbox.state's fields) lives in the
-- conversation's own table (one table less to reach per turn). Forgetting
-- (`forget` in warmbox.session) clears those fields only.
local function forget(st)
  st.sandbox_id, st.lease_end, st.run_started, st.last_run, st.hooked, st.auto_resume, st.memory_lost =
    nil, nil, nil, nil, nil, nil, nil
  st.box = nil
end

-- Remembers the secured sandbox b (Session:_remember): one secured for
-- another id forgets what the session knew of the old one's kernel (hooked,
-- run_started, auto_resume); the lease end is capped (see `capped`).
local function remember(st, b, lease_end, run_started, max_length)
  if st.sandbox_id ~= b.id then st.hooked, st.run_started, st.auto_resume = nil, nil, nil end
  st.sandbox_id, st.box = b.id, b
  if run_started then st.run_started = run_started end
  run_started = st.run_started
  if run_started then lease_end = math_min(lease_end, run_started + max_length) end   -- see `capped`
  st.lease_end = lease_end
end

-- Whether a secured sandbox resumes by traffic after its lease ends: its
-- lifecycle pauses and auto-resumes (secure_candidate, create_sandbox).
local function auto_resume_of(lc)
  return type(lc) == "table" and lc.auto_resume == true and lc.on_timeout == "pause" or nil
end

-- The lifecycle a `create_params` answer without one gets (create_sandbox).
local function default_lifecycle()
  return { on_timeout = "pause", auto_resume = true }
end

-- The timeout of a create from the `create_params` answer's `timeout`: nil
-- when given and not a positive finite number, else never shorter than the
-- lease (create_sandbox: the first run must not be paused underneath itself).
local function create_timeout(timeout, lease)
  if timeout ~= nil and not (type(timeout) == "number" and timeout > 0 and timeout < math_huge) then return nil end
  return math_max(timeout or lease, lease)
end

-- Whether the run could cross the maximum run length, so the sandbox is recycled first.
local needs_recycle = sdecide.recycle_due
-- The extension to ask before the cell, or nil when the lease covers it.
local extension = sdecide.extension
-- Whether a failed control-plane call says the sandbox is gone.
local is_gone = sdecide.is_gone
-- How a run reaches the remembered sandbox it refreshes: "alongside",
-- "auto_resume" or nil (connect first); when its watchdog extends the lease;
-- the lease a resume by traffic gives; whether a prewarm has nothing to do.
local remembered_way, watch_at, auto_resume_end, prewarm_warm = sdecide.remembered_way, sdecide.watch_at,
  sdecide.auto_resume_end, sdecide.prewarm_warm

-- Whether a failure before the cell says its sandbox may be gone, so the
-- control plane is asked (retry.reach of a step before the cell).
local function gone_before(code)
  return retry.reach("prepare", code) == "exists"
end

-- Whether the run's cell carries the mark the session gives up when it never
-- arrived (Session:_never_arrived's cell_id: python once the kernel has the
-- hooks, another language when `outputs.cell_guarded` guards it).
local function cell_marked(python, hooked, guarded)
  if python then return hooked end
  return guarded
end

-- What asking the sandbox after an unanswered execute gave (retry.answer):
-- "again" when the cell's mark was claimed (it never reached the kernel),
-- "gone" when the sandbox no longer exists, else false.
local function never_arrived(claimed, exists)
  local r = retry.answer("cell", "ask", claimed)
  if r == "never" then return "again" end
  if r == false then return false end
  return retry.answer("cell", "exists", exists)
end

-- What asking after a failure before the cell gave (retry.answer): sent again
-- to the same sandbox while it exists, else resolved again.
local function ready_retry(exists)
  return retry.answer("prepare", "exists", exists) == "never" and "again" or "gone"
end

-- Whether a failed run may be sent again, and how (Session:_run_locked's
-- `retryable`): what asking the sandbox gave, or "gone" for a failure before
-- the cell that says its sandbox is gone; nil or false: not again.
local function retryable(asked, code)
  if asked == nil then return gone_before(code) and "gone" end
  return asked
end

-- Whether a run that is not sent again leaves its lease unknown, so the next
-- run refreshes it first (Session:_run_locked: "Not retried"). The engine
-- tests `unanswered(code)`; the fast path resets it when asking the sandbox
-- gave false (an unanswered execute that may have reached the kernel).
local function refresh_next(asked)
  return asked == false
end

-- The answers after which the session asks the sandbox (unreachable a moment
-- ago, so the next attempt connects first).
local unanswered = sdecide.unanswered

-- ----------------------------------------------------------------
-- GC (warmbox.gc)
-- ----------------------------------------------------------------

-- The tenant of a tag value's key: the policy's `tenant` hook, else its default.
local tenant = gdecide.tenant

-- The policy's `tenant` hook, or the default one.
local function tenant_hook(policy)
  return type(policy.tenant) == "function" and policy.tenant or gdecide.default_tenant
end

-- The group a decision counts in (an item, or anything with its `tenant` and `orphan`).
local group = gdecide.group
-- Whether a paused sandbox listed with these times looks demoted.
local looks_demoted = gdecide.demoted
-- The actions a gc hook may answer.
local ACTIONS = gdecide.ACTIONS
-- A decision counted (d = 1) or taken back (d = -1) in its group and the totals.
local count = gdecide.count

-- What a gc hook's answer (pcall's ok, action) means: the action, or nil and
-- the error the pass notes (the fast path gives no reason: no item passed).
local NO_ITEM = {}
local g_answer = gdecide.answer
local function gc_answer(ok, action)
  if ok and action == "keep" then return "keep" end
  local a, msg = g_answer(ok, action, nil, NO_ITEM, 0, 0)
  if not a then return nil, msg end
  return a
end

-- Whether the session's remembered last run is later than the item's listed
-- last activity, so the hook is asked again with it (its time, or nil).
local g_remembered = gdecide.remembered
local function ran_since(st, item)
  return st and g_remembered(item, st)
end

-- The default policy's gc decision (warmbox.policy.default.gc): orphans and
-- sandboxes without a last activity kept, killed when inactive for longer than
-- max_age. (The fast path plays it without a hook call per sandbox.)
local function default_kill(orphan, last, now, max_age)
  return not orphan and last and now - last > max_age
end

-- A table of the rules (as warmbox.sim.model's `ops`), for the fast path's files only.
return {
  LEASE_MARGIN = LEASE_MARGIN, COVER_MARGIN = COVER_MARGIN, PAUSE_GRACE = PAUSE_GRACE,
  DEMOTE_MARK = DEMOTE_MARK, ACTIONS = ACTIONS,
  lease_of = lease_of, capped = capped, forget = forget, remember = remember, is_gone = is_gone,
  refresh_next = refresh_next, auto_resume_of = auto_resume_of,
  default_lifecycle = default_lifecycle, create_timeout = create_timeout, needs_recycle = needs_recycle,
  extension = extension, remembered_way = remembered_way, watch_at = watch_at, auto_resume_end = auto_resume_end,
  prewarm_warm = prewarm_warm, gone_before = gone_before, cell_marked = cell_marked,
  never_arrived = never_arrived, ready_retry = ready_retry, retryable = retryable, unanswered = unanswered,
  tenant = tenant, tenant_hook = tenant_hook, group = group, looks_demoted = looks_demoted, gc_answer = gc_answer,
  ran_since = ran_since, default_kill = default_kill, count = count,
}
