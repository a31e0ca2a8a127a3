--- warmbox.sim.fast.rules: the session's and GC's rules the fast path plays.
--
-- The fast path does not run `warmbox.session` or `warmbox.gc`: it plays
-- their decisions on the model's records. Every rule and constant it copies
-- from them is here, one small function each, named after the engine code it
-- mirrors, so that a change to a rule (or a shared decisions module both call)
-- is made in one place of the simulator. The agreement specs
-- (spec/unit/sim_spec.lua, spec/integration/sim_agreement_spec.lua) check
-- that the two paths give the same counts.
-- @module warmbox.sim.fast.rules

local gc_mod = require "warmbox.gc"

local type, pcall, tostring = type, pcall, tostring
local math_ceil, math_max, math_min, math_huge = math.ceil, math.max, math.min, math.huge

-- ----------------------------------------------------------------
-- Constants
-- ----------------------------------------------------------------

-- warmbox.session.LEASE_MARGIN: seconds a lease covers beyond the run's timeout.
local LEASE_MARGIN = 5
-- warmbox.session.COVER_MARGIN: the lease left before the cell that needs no extension.
local COVER_MARGIN = 2
-- warmbox.state.DEMOTE_MARK: a sandbox paused within this many seconds of its resume looks demoted.
local DEMOTE_MARK = require("warmbox.state").DEMOTE_MARK

-- ----------------------------------------------------------------
-- The session (warmbox.session)
-- ----------------------------------------------------------------

-- The lease of a run from the `lease` hook's answer: nil when the answer is
-- not a positive finite number (Session:_lease), else rounded up and raised
-- to cover the run's timeout + LEASE_MARGIN (Session:_acquire).
local function lease_of(value, run_timeout)
  if not (type(value) == "number" and value > 0 and value < math_huge) then return nil end
  local lease = math_ceil(value)
  if run_timeout + LEASE_MARGIN > lease then lease = math_ceil(run_timeout + LEASE_MARGIN) end
  return lease
end

-- A remembered lease end capped at the run's start + the maximum run length
-- (Session:_remember, Session:_cover: E2B caps every lease there).
local function capped(lease_end, run_started, max_length)
  if run_started then return math_min(lease_end, run_started + max_length) end
  return lease_end
end

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

-- Whether the run could cross the maximum run length, so the sandbox is
-- recycled first: paused (memory kept) and connected (Session:_acquire).
local function needs_recycle(run_started, max_length, now, run_timeout)
  return run_started and run_started + max_length < now + run_timeout + LEASE_MARGIN
end

-- Whether the remembered lease covers the cell sent at `now`, so no extension
-- is needed (Session:_cover: no lease known, or timeout + COVER_MARGIN left).
local function covers(lease_end, now, run_timeout)
  return not lease_end or now + run_timeout + COVER_MARGIN <= lease_end
end

-- The lease an extension before the cell asks for (Session:_cover).
local function cover_lease(run_timeout)
  return math_ceil(run_timeout + LEASE_MARGIN)
end

-- Whether a failed control-plane call says the sandbox is gone (is_gone in
-- warmbox.session: a 404), as opposed to a fault that fails the run.
local function is_gone(code)
  return code == "NOT_FOUND"
end

-- Whether a failure before the cell says its sandbox may be gone, so the run
-- may be sent again (`before` in warmbox.session; the model answers a gone
-- sandbox 404 on the control plane, SANDBOX_GONE on the data plane).
local function gone_before(code)
  return code == "SANDBOX_GONE" or code == "NOT_FOUND"
end

-- Whether the run's cell carries the mark the session gives up when it never
-- arrived (Session:_never_arrived's cell_id: python once the kernel has the
-- hooks, another language when `outputs.cell_guarded` guards it).
local function cell_marked(python, hooked, guarded)
  if python then return hooked end
  return guarded
end

-- What asking the sandbox after an unanswered execute gave
-- (Session:_never_arrived): "again" when the cell's mark was claimed (it never
-- reached the kernel), "gone" when the sandbox no longer exists, else false.
local function never_arrived(claimed, exists)
  if claimed then return "again" end
  return not exists and "gone" or false
end

-- What asking after a failure before the cell gave (Session:_ready): sent
-- again to the same sandbox while it exists, else resolved again.
local function ready_retry(exists)
  return exists and "again" or "gone"
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

-- The answers after which the session asks the sandbox (ASK_AFTER in
-- warmbox.session: `unanswered`): unreachable a moment ago, so the next
-- attempt connects first.
local function unanswered(code)
  return code == "SANDBOX_GONE" or code == "NOT_FOUND" or code == "RATE_LIMITED"
end

-- ----------------------------------------------------------------
-- GC (warmbox.gc)
-- ----------------------------------------------------------------

-- The tenant of a warmbox tag value's key: the policy's `tenant` hook, else
-- (it raised or gave no string) the default tenant (make_item).
local function tenant(tenant_of, key)
  local ok, tn = pcall(tenant_of, key)
  return ok and type(tn) == "string" and tn or gc_mod.default_tenant(key)
end

-- The policy's `tenant` hook, or the default one (gc.run).
local function tenant_hook(policy)
  return type(policy.tenant) == "function" and policy.tenant or gc_mod.default_tenant
end

-- The group a sandbox's decisions count in (gc.run's count: its tenant, else
-- orphans or hashed keys).
local function group(tn, orphan)
  return tn or (orphan and "(orphans)") or "(hashed)"
end

-- Whether a paused sandbox listed with these times (ms-rounded unix seconds)
-- looks demoted (warmbox.state.looks_demoted: paused within DEMOTE_MARK
-- seconds of its resume). Its last activity is its end (gc.last_activity).
local function looks_demoted(s, e)
  return e >= s and e - s <= DEMOTE_MARK
end

-- The actions a gc hook may answer (ACTIONS in warmbox.gc).
local ACTIONS = { keep = true, kill = true, demote = true }

-- What a gc hook's answer (pcall's ok, action) means (gc.run's decide): the
-- action, or nil and the error the pass notes.
local function gc_answer(ok, action)
  if ok and ACTIONS[action] then return action end
  return nil, ok and ("gc policy returned " .. tostring(action)) or ("gc policy failed: " .. tostring(action))
end

-- Whether the session's remembered last run is later than the listed last
-- activity, so the hook is asked again with it (gc.run's lock_entries).
local function ran_since(st, sandbox_id, last_activity)
  local last_run = st and st.last_run
  return st and st.sandbox_id == sandbox_id and last_run and last_run > (last_activity or -math_huge)
end

-- The default policy's gc decision (warmbox.policy.default.gc): orphans and
-- sandboxes without a last activity kept, killed when inactive for longer than
-- max_age. (The fast path plays it without a hook call per sandbox.)
local function default_kill(orphan, last, now, max_age)
  return not orphan and last and now - last > max_age
end

-- A table of the rules (as warmbox.sim.model's `ops`), for the fast path's files only.
return {
  LEASE_MARGIN = LEASE_MARGIN, COVER_MARGIN = COVER_MARGIN, DEMOTE_MARK = DEMOTE_MARK, ACTIONS = ACTIONS,
  lease_of = lease_of, capped = capped, forget = forget, remember = remember, is_gone = is_gone,
  refresh_next = refresh_next, auto_resume_of = auto_resume_of,
  default_lifecycle = default_lifecycle, create_timeout = create_timeout, needs_recycle = needs_recycle,
  covers = covers, cover_lease = cover_lease, gone_before = gone_before, cell_marked = cell_marked,
  never_arrived = never_arrived, ready_retry = ready_retry, retryable = retryable, unanswered = unanswered,
  tenant = tenant, tenant_hook = tenant_hook, group = group, looks_demoted = looks_demoted, gc_answer = gc_answer,
  ran_since = ran_since, default_kill = default_kill,
}
