--- What a session remembers between runs, as named operations: the one
-- place that writes the remembered state `st` (sandbox id, access token,
-- lease end, run start, hooks, creates in flight, turns, replaced sandboxes;
-- the fields are warmbox.state's). Every writer goes through it: the run
-- (session/resolve.lua, session/execute.lua), prewarm, checkpoints, the
-- budget and GC (gc/pass.lua, gc/release.lua). `st` lives in the session
-- lock's per-key state: `load` reads it, `save` writes it back, under the
-- lock. `s` is the session (its `tag_value`, `origin`, `max_run_length`).
-- @module warmbox.session.memo
local json = require "warmbox.json"
local state_codec = require "warmbox.state"
local decide = require "warmbox.session.decide"

local type, ipairs, tonumber = type, ipairs, tonumber
local math_floor, math_max, math_min, table_remove = math.floor, math.max, math.min, table.remove

local _M = {}

--- The state under the lock `lk` as it is (GC, the budget, `s:state`).
-- syntax: st = memo.read(lk)
function _M.read(lk)
  return state_codec.decode(lk:get_state())
end

--- The state under the lock `lk`; one written by a session of another tag
-- value or origin (a key shared by two deployments) is forgotten (its creates,
-- turns and replaced sandboxes kept, see `forget`).
-- syntax: st = memo.load(lk, s) (foreign state forgotten)
function _M.load(lk, s)
  local st = state_codec.decode(lk:get_state())
  if state_codec.foreign(st, s.tag_value, s.origin) then state_codec.forget(st) end
  return st
end

--- The state under the lock `lk` when it is `s`'s own, else an empty one
-- (checkpoints: nothing of another session's is carried over).
-- syntax: st = memo.load_own(lk, s) (foreign: `{}`)
function _M.load_own(lk, s)
  local st = state_codec.decode(lk:get_state())
  if state_codec.foreign(st, s.tag_value, s.origin) then return {} end
  return st
end

--- Writes `st` back under the lock `lk`. → what `lk:set_state` returns
-- syntax: ok, err, code = memo.save(lk, st)
function _M.save(lk, st)
  return lk:set_state(state_codec.encode(st))
end

--- Forgets everything under the lock `lk` (`s:forget`).
-- syntax: memo.clear(lk) (`s:forget`)
function _M.clear(lk)
  return lk:set_state(nil)
end

--- Forgets everything under the lock `lk` and, with warmbox.lock, removes the
-- key's files (`lk:remove` releases it; an unlock after it is a no-op): the
-- session's sandboxes were collected or released (GC).
-- syntax: memo.drop(lk) (GC, release: `lk:remove` when it has it)
function _M.drop(lk)
  if type(lk.remove) == "function" then return lk:remove() end
  return lk:set_state(nil)
end

--- Forgets the remembered sandbox; the creates in flight, the run count and
-- the replaced sandboxes still to kill stay.
-- syntax: memo.forget(st)
_M.forget = state_codec.forget

--- GC demoted sandbox `id` (paused without memory): its kernel is new.
-- syntax: memo.kernel_lost(st, id)
_M.kernel_lost = state_codec.kernel_lost

--- Remembers the secured sandbox `sb` (`sandbox_id`, `envd_access_token`,
-- `domain`). `run_started` is when its current run began (nil: unchanged for
-- the same sandbox, unknown for another); E2B caps every lease at run start +
-- the maximum run length, so the remembered lease end is too.
-- syntax: memo.remember(s, st, sb, lease_end[, run_started])
function _M.remember(s, st, sb, lease_end, run_started)
  st.tag, st.origin = s.tag_value, s.origin
  if st.sandbox_id ~= sb.sandbox_id then
    st.hooked, st.run_started, st.auto_resume = nil, nil, nil
  end
  st.sandbox_id = sb.sandbox_id
  if sb.envd_access_token then st.access_token = sb.envd_access_token end
  if sb.domain and sb.domain ~= json.null then st.domain = sb.domain end
  if run_started then st.run_started = run_started end
  st.lease_end = decide.lease_end(lease_end, st.run_started, s.max_run_length)
end

--- Whether the sandbox pauses at its lease end and traffic resumes it.
-- syntax: memo.set_auto_resume(st, on)
function _M.set_auto_resume(st, on)
  st.auto_resume = on
end

--- A connect leased the remembered sandbox until `lease_end` (as E2B was asked).
-- syntax: memo.leased(st, lease_end)
function _M.leased(st, lease_end)
  st.lease_end = lease_end
end

--- The lease was extended to `lease_end` (capped by the run's maximum length); never shortened.
-- syntax: memo.extend_lease(s, st, lease_end)
function _M.extend_lease(s, st, lease_end)
  st.lease_end = math_max(st.lease_end, decide.lease_end(lease_end, st.run_started, s.max_run_length))
end

--- The lease is over by `at` at the latest (the sandbox was paused): the next run connects.
-- syntax: memo.lease_over(st, at)
function _M.lease_over(st, at)
  st.lease_end = math_min(st.lease_end or at, at)
end

--- The lease is unknown (the sandbox was unreachable a moment ago): the next run connects first.
-- syntax: memo.lease_unknown(st)
function _M.lease_unknown(st)
  st.lease_end = nil
end

--- Traffic resumed the sandbox at `t` (an execute reached it): a new E2B run.
-- syntax: memo.resumed_at(s, st, t)
function _M.resumed_at(s, st, t)
  st.run_started = t
  st.lease_end = math_max(st.lease_end or 0, decide.auto_resume_end(t, s.max_run_length))
end

--- The python kernel of sandbox `id` has warmbox's output hooks (`id` nil: it lost them).
-- syntax: memo.hooked(st, id)
function _M.hooked(st, id)
  st.hooked = id
end

--- A run ran at `wall` (unix seconds): the turns counted, the memory it lost
-- (if any) is behind it. → the session's turn
-- syntax: turn = memo.ran(st, wall)
function _M.ran(st, wall)
  st.last_run = wall
  st.turns = math_floor(tonumber(st.turns) or 0) + 1 -- (JSON gives a float)
  st.memory_lost = nil
  return st.turns
end

--- A branch or rewind restored the conversation to turn `turn` at `wall`.
-- syntax: memo.restored(st, turn, wall)
function _M.restored(st, turn, wall)
  st.turns = turn
  st.last_run = wall
end

--- A rewind replaced sandbox `id` but could not kill it: the next run does.
-- syntax: memo.replaced(st, id)
function _M.replaced(st, id)
  local list = type(st.replaced) == "table" and st.replaced or {}
  list[#list + 1] = id
  st.replaced = list
end

--- The replaced sandboxes still to kill after a try (`left`: those whose kill failed again).
-- syntax: memo.keep_replaced(st, left)
function _M.keep_replaced(st, left)
  st.replaced = #left > 0 and left or nil
end

-- ------------------------------------------------------------------
-- Creates in flight (see warmbox.session.resolve's `create`)
-- ------------------------------------------------------------------

--- The recorded creates younger than decide.CREATE_WINDOW at `now`.
-- syntax: list = memo.recent_creates(st, now)
function _M.recent_creates(st, now)
  local list = {}
  for _, c in ipairs(st.creating or {}) do
    if type(c) == "table" and type(c.at) == "number" and now - c.at < decide.CREATE_WINDOW then
      list[#list + 1] = c
    end
  end
  return list
end

--- Records the create `id` at `now` (before it is sent); the oldest records go
-- beyond decide.CREATES_KEPT.
-- syntax: memo.record_create(s, st, id, now)
function _M.record_create(s, st, id, now)
  local list = _M.recent_creates(st, now)
  list[#list + 1] = { id = id, at = now }
  st.tag, st.origin = s.tag_value, s.origin
  while #list > decide.CREATES_KEPT do table_remove(list, 1) end
  st.creating = list
end

--- The create `id` is settled (refused, or found by a listing): its record goes.
-- syntax: memo.settle_create(st, id)
function _M.settle_create(st, id)
  local list = st.creating
  if not list then return end
  for i = #list, 1, -1 do
    if type(list[i]) ~= "table" or list[i].id == id then table_remove(list, i) end
  end
  if #list == 0 then st.creating = nil end
end

--- The create `id` was answered with `sandbox_id`: its record stays until the
-- listing after the next run (a retry or an intermediary's copy may have made
-- others), that sandbox is not its orphan.
-- syntax: memo.answered_create(st, id, sandbox_id)
function _M.answered_create(st, id, sandbox_id)
  for _, c in ipairs(st.creating or {}) do
    if type(c) == "table" and c.id == id then c.kept = sandbox_id end
  end
end

--- `dst` (a state put back as it was) keeps the creates `src` recorded since.
-- syntax: memo.creates_from(dst, src)
function _M.creates_from(dst, src)
  dst.creating = src.creating
end

--- The creates still recorded after the orphans were collected (`left`).
-- syntax: memo.keep_creates(st, left)
function _M.keep_creates(st, left)
  st.creating = #left > 0 and left or nil
end

return _M
