--- The policy's `budget` hook around a session's runs and prewarms, and
-- around GC (see `warmbox.policy.rules.budget`): what a conversation and its
-- tenant spent (`warmbox.ledger`, read from E2B's lifecycle events) is put to
-- the hook, which answers what to do when a budget is near or spent.
--
-- The hook: `budget(ctx) -> action, reason` with `ctx = { key, tenant, phase
-- = "run" | "after_run" | "prewarm" | "gc", spent = { conversation, tenant_day },
-- now }`; actions: "refuse" (a run or prewarm: `nil, msg, "BUDGET"`),
-- "pause" (after a run: the sandbox is paused at once), "demote" / "kill"
-- (GC), "near" (only an event), nil (nothing). Each change of a
-- conversation's budget state is an `on_event("budget", { state = "near" |
-- "over", phase, action, reason, spent })`.
-- @module warmbox.session.budget
local memo = require "warmbox.session.memo"
local type, tostring, pcall, ipairs, math_floor = type, tostring, pcall, ipairs, math.floor

local _M = {}

-- The hook's answer: action, reason; or nil, msg, "POLICY" when it raised.
local function ask(policy, ctx)
  local ok, action, reason = pcall(policy.budget, ctx)
  if not ok then
    return nil, string.format("policy '%s' hook 'budget' failed: %s", tostring(policy.name), tostring(action)), "POLICY"
  end
  return action, reason
end

--- Seconds between two reads of the events (per client); a rule may set its own.
_M.REFRESH = 10

-- What key and its tenant spent: conversation (all time, its branches too), tenant today.
local function spent(L, key, tenant, now)
  local c = L:cost(key, { now = now })
  local day0 = math_floor(now / 86400) * 86400
  local tday = 0
  for _, r in ipairs(L:costs{ by = "tenant", since = day0, now = now }) do
    if r.key == tenant then tday = r.total_usd end
  end
  return { conversation = c.usd_with_branches or c.total_usd, tenant_day = tday }
end

local function ledger_for(client, policy, tag, now)
  local ledger = require "warmbox.ledger"
  local L = ledger.of(client, { tag = tag, tenant = policy.tenant })
  local refresh = require("warmbox.policy.rules").budget_refresh(policy.budget) or _M.REFRESH
  if not L.synced_at or now - L.synced_at >= refresh or now < L.synced_at then
    local n, msg, code = L:sync()
    if not n then return nil, msg, code end
    L.synced_at = now
  end
  return L
end

--- Asks the policy's budget hook for a phase of session `s`.
-- @treturn[1] string|nil action, string reason
-- @return[2] nil, msg, code (the ledger could not be read: the phase goes on)
function _M.check(s, phase)
  local hook = s.policy.budget
  if not hook then return nil end
  local now = s.wall()
  local L, msg, code = ledger_for(s.client, s.policy, s.tag, now)
  if not L then
    s:_event("budget", { ok = false, phase = phase, message = msg, code = code })
    return nil
  end
  local ok, tenant = pcall(s.policy.tenant, s.key)
  tenant = ok and tenant and tostring(tenant) or nil
  local sp = spent(L, s.key, tenant, now)
  local action, reason, pcode = ask(s.policy, { key = s.key, tenant = tenant, phase = phase, spent = sp, now = now })
  if pcode then
    s:_event("budget", { ok = false, phase = phase, message = reason, code = pcode })
    return nil
  end
  local state = action == "near" and "near" or action and "over" or nil
  L.budget_state = L.budget_state or {}
  if state and L.budget_state[s.key .. "\0" .. phase] ~= state then
    L.budget_state[s.key .. "\0" .. phase] = state
    s:_event("budget", { state = state, phase = phase, action = action, reason = reason, spent = sp })
  end
  if action == "near" then return nil end
  return action, reason
end

--- After a run: pauses the sandbox at once when the budget says so, under
-- the session's lock (a run of another process never has its sandbox paused
-- underneath it), and forgets its lease so that the next run resumes it.
function _M.after_run(s, r)
  local action = _M.check(s, "after_run")
  if action ~= "pause" or type(r) ~= "table" or not r.sandbox_id then return end
  local ok
  s:_with_lock(function(lk)
    local st = memo.read(lk)
    if st.sandbox_id ~= r.sandbox_id then return true end  -- replaced meanwhile: not ours to pause
    ok = s.client:pause(r.sandbox_id)
    memo.lease_over(st, 0)
    memo.save(lk, st)
    return true
  end)
  s:_event("budget_pause", { sandbox_id = r.sandbox_id, ok = ok ~= nil })
end

--- A GC hook that asks the budget first (phase "gc"), then `inner`.
function _M.wrap_gc(policy, client, tag, now)
  local inner = policy.gc
  if not policy.budget then return inner end
  local L = ledger_for(client, policy, tag, now)
  return function(item, ctx)
    if L and item.key then
      local sp = spent(L, item.key, item.tenant, ctx.now or now)
      local action, reason = ask(policy, { key = item.key, tenant = item.tenant, phase = "gc", spent = sp,
        now = ctx.now or now })
      if action == "demote" or action == "kill" then return action, reason end
    end
    return inner(item, ctx)
  end
end

return _M
