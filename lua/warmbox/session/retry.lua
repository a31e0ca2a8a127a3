--- The session's one rule for "may this request be sent again", pure (no
-- client, no lock). At most once: a cell that may have reached a kernel is
-- never sent again.
--
-- A run's failure is judged in two steps. `reach` says what the failure
-- itself proves about the cell, or which question settles it ("ask": claim
-- the cell's id in the sandbox; "exists": ask the control plane), `answer`
-- reads the answer to that question; both give a reach:
--   "never"  nothing of the cell can have run (nothing of the request left,
--            its kernel refused it before its first line, or it never
--            accepted it and now never will): it may go again, same sandbox;
--   "gone"   its sandbox no longer exists: it may go again, to a sandbox
--            resolved anew;
--   false    it may have reached a kernel, or the fault is not one a re-send
--            mends: reported.
-- `again` then decides from the reach and the attempt count. `lease` is the
-- rule of the lease extension that runs alongside the execute.
--
-- The transport's own rule (warmbox.core, csrc/core/retry.c) sits below:
-- it re-sends an execute only when nothing of it left, and the E2B client's
-- retry tables choose which statuses each call retries there.
-- @module warmbox.session.retry

local decide = require "warmbox.session.decide"

local type, math_min = type, math.min
local unanswered, is_gone, arrival = decide.unanswered, decide.is_gone, decide.arrival

local _M = {}

-- Codes of a sandbox that was unreachable (its proxy or envd: 502, 404).
local function unreachable(code) return code == "SANDBOX_GONE" or code == "NOT_FOUND" end

--- What a failure of request `kind` proves about its cell, or the question
-- that settles it: "never" | "gone" | false | "ask" | "exists" (see above).
-- Kinds: "prepare" (a step before the cell: uploads, the output directory,
-- the hooks cell, the lease: nothing of the cell ran; only an unreachable
-- sandbox is worth a re-send, once the control plane says whether it
-- exists), "cell" (the execute; `guarded`: the cell carries an id its
-- kernel claims when it accepts it), "refused" (the kernel refused a marked
-- cell: "HOOKS_LOST" before its first line, "FENCED" never again).
-- syntax: reach = retry.reach(kind, code, detail[, guarded])
function _M.reach(kind, code, detail, guarded)
  if kind == "prepare" then return unreachable(code) and "exists" or false end
  if kind == "refused" then return code == "HOOKS_LOST" and "never" or false end
  if type(detail) == "table" and detail.output_started then return false end
  if code == "TRANSPORT" then return type(detail) == "table" and detail.sent == false and "never" or false end
  if not unanswered(code, detail) then return false end
  -- A cell of a language without a guard may have run: never sent again.
  return guarded and "ask" or false
end

--- The reach once `question` ("ask" | "exists") of a failure of `kind` is
-- answered: "ask" with the claim of the cell's id (true | false | nil: no
-- answer, then "exists" is the next question); "exists" with whether the
-- control plane still lists the sandbox (false only on its 404).
-- syntax: reach = retry.answer(kind, question, value)
function _M.answer(kind, question, value)
  if question == "ask" then
    local a = arrival(value)
    if a == "never" then return "never" end
    if a == "accepted" then return false end
    return "exists"
  end
  -- Before the cell nothing ran: the sandbox that still exists gets the run
  -- again (its kernel and files are the conversation's). After an execute
  -- nobody could tell: only a sandbox that is gone proves it never ran.
  if kind == "prepare" then return value and "never" or "gone" end
  return not value and "gone" or false
end

--- Whether a run whose attempt `attempt` failed with `code` and `reach` is
-- sent again: "same" (the same sandbox), "resolve" (forget it, resolve
-- again) or nil (reported). Once per run, and once more for a kernel that
-- lost its hooks (it refused the cell at its first line; `hooks_resent`:
-- that re-send was made).
-- @treturn string|nil the verdict
-- @treturn boolean whether this is the hooks re-send
-- syntax: verdict, hooks = retry.again(reach, code, attempt, hooks_resent)
function _M.again(reach, code, attempt, hooks_resent)
  if not reach then return nil, false end
  local hooks = code == "HOOKS_LOST" and not hooks_resent
  if attempt ~= 1 and not hooks then return nil, false end
  return reach == "gone" and "resolve" or "same", hooks
end

--- Whether the next connect must come before anything else (the remembered
-- lease end is dropped): the sandbox did not answer a moment ago, it may be
-- paused under its remembered lease.
-- syntax: again = retry.reconnect(code, detail)
_M.reconnect = unanswered

--- Seconds to wait before a re-send: the failure's Retry-After, capped at
-- RETRY_AFTER_MAX (nil: none).
-- syntax: seconds = retry.wait(detail)
function _M.wait(detail)
  local w = type(detail) == "table" and detail.retry_after
  if type(w) == "number" and w > 0 then return math_min(w, decide.RETRY_AFTER_MAX) end
  return nil
end

--- The lease extension alongside an execute, after its `attempt`th connect
-- failed with `code` at `now`: the pause before the next try, or nil when it
-- must give up (the sandbox is gone, or the next try could not land before
-- `deadline`, the lease end minus LEASE_MARGIN): the execute is interrupted.
-- Tried while the cell runs; the pause doubles from 0.1 s up to 2 s.
-- syntax: pause = retry.lease(code, attempt, now, deadline)
function _M.lease(code, attempt, now, deadline)
  local pause = math_min(0.1 * 2 ^ (attempt - 1), 2)
  if is_gone(code) or now + pause >= deadline then return nil end
  return pause
end

return _M
