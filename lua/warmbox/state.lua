--- The state a session remembers under its lock key (a leaf codec shared by
-- warmbox.session and warmbox.gc).
-- @module warmbox.state
local json = require "warmbox.json"
local util = require "warmbox.util"

local type, pairs = type, pairs

local _M = {}

--- Decode the state string a session keeps under its lock key:
-- `{ v = 1, tag, origin, sandbox_id, access_token, domain, lease_end, run_started, last_run, hooked,
-- auto_resume, creating, turns }`
-- (times in the session clock's unit, unix seconds by default; `run_started` is
-- when the sandbox's current run began, since E2B caps a run's length; `hooked`
-- is the sandbox id whose python kernel has warmbox's output hooks;
-- `auto_resume`: the sandbox pauses at its lease end and traffic resumes it;
-- `creating`: the creates sent whose answer never came, `{ {id, at} }`, see warmbox.session;
-- `replaced`: ids of sandboxes a rewind replaced but could not kill (the next run kills them);
-- `turns`: the session's successful runs, what a checkpoint's `turn` says, see warmbox.session.checkpoint).
-- @tparam string|nil s
-- @treturn table (empty when `s` is nil, empty or not warmbox state)
-- syntax: st = state.decode(s)
function _M.decode(s)
  if type(s) ~= "string" or s == "" then return {} end
  local t = json.decode(s)
  if type(t) ~= "table" or t.v ~= 1 then return {} end
  for k, v in pairs(t) do
    if v == json.null then t[k] = nil end
  end
  return t
end

-- syntax: s = state.encode(st)
function _M.encode(st)
  if not st.sandbox_id and not st.creating then return nil end
  return json.encode({
    creating = st.creating, replaced = st.replaced,
    v = 1, tag = st.tag, origin = st.origin, sandbox_id = st.sandbox_id, access_token = st.access_token,
    domain = st.domain, lease_end = st.lease_end, run_started = st.run_started, last_run = st.last_run,
    hooked = st.hooked, memory_lost = st.memory_lost, auto_resume = st.auto_resume, turns = st.turns,
  })
end

-- The operations on a decoded state `st` (what session/resolve.lua,
-- session/execute.lua, session/prewarm.lua and gc/pass.lua change in it).

--- Forgets the remembered sandbox; the creates in flight (`creating`, their
-- orphans are recognised later), the run count (`turns`) and the replaced
-- sandboxes still to kill (`replaced`) stay.
-- syntax: state.forget(st) (the sandbox; `creating` and `turns` stay)
function _M.forget(st)
  local creating, turns, replaced = st.creating, st.turns, st.replaced
  for k in pairs(st) do st[k] = nil end
  st.creating, st.turns, st.replaced = creating, turns, replaced
end

--- Whether `st` was written by a session of another tag value or origin (a
-- key shared by two deployments): then it is forgotten, never used.
-- syntax: bool = state.foreign(st, tag_value, origin) (written by another deployment: forget it)
function _M.foreign(st, tag_value, origin)
  return (st.tag ~= nil and st.tag ~= tag_value) or st.origin ~= origin
end

--- GC demoted the remembered sandbox `sandbox_id` (its kernel and memory are
-- gone): the session installs its output hooks again, and one with
-- require_memory replaces it.
-- syntax: state.kernel_lost(st, sandbox_id) (GC demoted it: hooks and memory gone)
function _M.kernel_lost(st, sandbox_id)
  st.hooked = nil
  st.memory_lost = sandbox_id
end

--- Seconds within which a pause after a resume marks a GC demote.
_M.DEMOTE_MARK = 10

--- Whether a listed sandbox (`{ state, started_at, end_at }`, E2B's times) looks
-- demoted by GC: paused within `DEMOTE_MARK` seconds of its resume, as only a
-- demote (connect + pause without memory) does. A session never does that: its
-- lease is at least its idle timeout, and a recycled sandbox runs again at once.
-- syntax: bool = state.looks_demoted(item) (paused within `state.DEMOTE_MARK`, 10 s, of its resume)
function _M.looks_demoted(d)
  if d.state ~= "paused" then return false end
  local s, e = util.parse_time(d.started_at), util.parse_time(d.end_at)
  return s ~= nil and e ~= nil and e >= s and e - s <= _M.DEMOTE_MARK
end

return _M
