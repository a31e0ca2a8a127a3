--- The session's pure decisions and their constants: numbers in, an answer
-- out, no client, no lock, no allocation. The session calls them, and so can
-- the simulator's fast path, so a rule lives in one place.
-- @module warmbox.session.decide

local type, math_ceil, math_min, math_max, math_huge = type, math.ceil, math.min, math.max, math.huge

local _M = {}

--- Defaults of the per-run caps (bytes): stdout + stderr + results, and returned output files.
_M.MAX_OUTPUT = 16 * 1048576
_M.MAX_FILES_BYTES = 64 * 1048576
--- The largest `max_run_length` accepted (seconds).
_M.MAX_RUN_LENGTH_LIMIT = 30 * 86400
--- Seconds of slack between a lease end and the end of a run's timeout.
_M.LEASE_MARGIN = 5
--- Seconds a remembered lease must still have for its extension to go out
-- alongside the execute (with `parallel`) rather than before it.
_M.ALONGSIDE_MARGIN = 20
--- The lease E2B gives a sandbox resumed by traffic (autoResume): at least
-- 5 minutes from the resume. And how long after its remembered lease end a
-- sandbox counts as paused (E2B's pause takes a moment).
_M.AUTO_RESUME_LEASE = 300
_M.PAUSE_GRACE = 10
--- Seconds the lease must still have beyond the cell's timeout when the cell
-- is sent (after uploads and the hooks cell), or it is extended first (the
-- server interrupts the cell at its timeout; this covers the request's way there).
_M.COVER_MARGIN = 2
--- The longest Retry-After (seconds) a run waits before it sends a cell again
-- (only a cell its sandbox said it never accepted).
_M.RETRY_AFTER_MAX = 30
--- How many creates in flight are remembered, and for how long (seconds of the session clock).
_M.CREATES_KEPT, _M.CREATE_WINDOW = 8, 300

local LEASE_MARGIN, COVER_MARGIN, ALONGSIDE_MARGIN = _M.LEASE_MARGIN, _M.COVER_MARGIN, _M.ALONGSIDE_MARGIN
local AUTO_RESUME_LEASE, PAUSE_GRACE = _M.AUTO_RESUME_LEASE, _M.PAUSE_GRACE

--- The shortest lease a watched run asks for (seconds): `idle_timeout` takes
-- effect from here up (a round trip and the watchdog's margin fit in it).
_M.MIN_LEASE = 5
--- How long (seconds, at most) before its lease ends a running cell's
-- watchdog extends it (half the lease when that is shorter).
_M.WATCH_MARGIN = 10
--- Seconds before the run a just-in-time prewarm starts its work (a resume
-- takes about a second on E2B; the rest is margin).
_M.JIT_LEAD = 2
--- The longest the watchdog sleeps (seconds) before it reads the session's clock again.
_M.WATCH_POLL = 0.5

--- The lease a run asks for, from the `lease` hook's value, ceiled. Watched
-- (`watched`: a watchdog extends the lease while the run goes on, see
-- warmbox.session.execute): never shorter than MIN_LEASE, whatever the run's
-- timeout. Unwatched: never shorter than the run's timeout + LEASE_MARGIN
-- (the lease starts a round trip before the cell does, and the server
-- interrupts the cell at its timeout: the sandbox is never paused underneath
-- the run). Without `run_timeout`: the value ceiled.
-- @treturn[1] integer the lease (seconds)
-- @treturn[1] boolean whether the run's timeout raised it
-- @return[2] nil when the value is not a positive finite number
-- syntax: lease, floored = decide.lease(value[, run_timeout[, watched]])
function _M.lease(value, run_timeout, watched)
  if not (type(value) == "number" and value > 0 and value < math_huge) then return nil end
  local lease = math_ceil(value)
  if watched then return math_max(lease, _M.MIN_LEASE), false end
  if run_timeout and run_timeout + LEASE_MARGIN > lease then return math_ceil(run_timeout + LEASE_MARGIN), true end
  return lease, false
end

--- How long before the lease end the watchdog of a run extends a lease of `lease` seconds.
-- syntax: m = decide.watch_margin(lease)
function _M.watch_margin(lease)
  return math_min(_M.WATCH_MARGIN, lease / 2)
end

--- When the watchdog extends a lease ending at `lease_end` (of `lease` seconds).
-- syntax: t = decide.watch_at(lease_end, lease)
function _M.watch_at(lease_end, lease)
  return lease_end - _M.watch_margin(lease)
end

--- The last moment the watchdog tries an extension of a lease ending at
-- `lease_end` (its round trip must land before the end).
-- syntax: t = decide.watch_deadline(lease_end, lease)
function _M.watch_deadline(lease_end, lease)
  return lease_end - math_min(LEASE_MARGIN, _M.watch_margin(lease) / 2)
end

--- Whether a prewarm for a run coming within `within` seconds has nothing to
-- do: the remembered lease (of `lease` seconds) still has the margin a run
-- needs to start without a request (half the lease, or `within` when sooner).
-- syntax: warm = decide.prewarm_warm(now, lease_end, within, lease)
function _M.prewarm_warm(now, lease_end, within, lease)
  return lease_end ~= nil and lease_end >= now + math_min(within, lease / 2)
end

--- A lease end as E2B keeps it: every lease is capped at the sandbox's run
-- start + the maximum run length (`run_started` nil: unknown, not capped).
-- syntax: e = decide.lease_end(lease_end, run_started, max_run_length)
function _M.lease_end(lease_end, run_started, max_run_length)
  if run_started then return math_min(lease_end, run_started + max_run_length) end
  return lease_end
end

--- The extension to ask before a cell is sent at `now`: nil when the
-- remembered lease (nil: unknown, nothing to compare) still covers the
-- cell's timeout + COVER_MARGIN, else the lease to ask (timeout + LEASE_MARGIN).
-- syntax: want = decide.extension(now, lease_end, run_timeout)
function _M.extension(now, lease_end, run_timeout)
  if not lease_end or now + run_timeout + COVER_MARGIN <= lease_end then return nil end
  return math_ceil(run_timeout + LEASE_MARGIN)
end

--- Whether a run of `run_timeout` starting at `now` could cross the maximum
-- run length (E2B ends a run at its start + that, whatever the lease says):
-- then the sandbox is recycled first (paused with its memory and connected:
-- a new run of the same kernel).
-- syntax: due = decide.recycle_due(run_started, max_run_length, now, run_timeout)
function _M.recycle_due(run_started, max_run_length, now, run_timeout)
  return run_started ~= nil and run_started + max_run_length < now + run_timeout + LEASE_MARGIN
end

--- How a run reaches the remembered sandbox when the policy says to refresh
-- it, with `parallel` (`alongside_ok`; never for a prewarm): "alongside"
-- (the remembered lease still has ALONGSIDE_MARGIN: the extension goes
-- alongside the execute), "auto_resume" (paused with autoResume, and the
-- lease asked, `lease`, is no shorter than the one a resume by traffic gives:
-- the execute resumes it, the run's watchdog extends it if the run outlasts
-- it), else nil (connect before the execute: a paused sandbox resumed with
-- the idle window's lease, never the longer auto-resume one).
-- syntax: how = decide.remembered_way(lease_end, auto_resume, now, lease, alongside_ok)
function _M.remembered_way(lease_end, auto_resume, now, lease, alongside_ok)
  if not alongside_ok or not lease_end then return nil end
  if lease_end - now >= ALONGSIDE_MARGIN then return "alongside" end
  if auto_resume and lease_end + PAUSE_GRACE <= now and lease >= AUTO_RESUME_LEASE then
    return "auto_resume"
  end
  return nil
end

--- The lease end after traffic resumed a paused sandbox at `t` (a new E2B run).
-- syntax: e = decide.auto_resume_end(t, max_run_length)
function _M.auto_resume_end(t, max_run_length)
  return math_min(t + AUTO_RESUME_LEASE, t + max_run_length)
end

--- What the answer to "did the cell arrive" means (the session claims the
-- cell's id in the sandbox; the kernel claims it when it accepts the cell):
-- claimed (true) "never" (the kernel never accepted it, and now never will),
-- refused (false) "accepted" (it reached the kernel), no answer (nil) "unknown".
-- syntax: a = decide.arrival(claimed)
function _M.arrival(claimed)
  if claimed then return "never" end
  if claimed == false then return "accepted" end
  return "unknown"
end

--- Whether a failed control-plane call says the sandbox is definitively gone
-- (as opposed to a transient fault: 5xx, 429, a timeout or a transport error,
-- which fail the run and leave the sandbox and its kernel alone).
-- syntax: gone = decide.is_gone(code)
function _M.is_gone(code)
  return code == "NOT_FOUND"
end

-- The answers with no stream byte after which the session asks the sandbox
-- whether the cell arrived (the statuses a sandbox, its proxy or E2B's edge
-- give for "not accepted"; an intermediary may give them after forwarding).
local ASK_AFTER = { SANDBOX_GONE = true, NOT_FOUND = true, RATE_LIMITED = true, [503] = true }

--- Whether a failed request was answered without a stream byte by a status
-- after which the sandbox is asked whether the cell arrived (the sandbox was
-- unreachable a moment ago: the next run connects first).
-- syntax: ask = decide.unanswered(code, detail)
function _M.unanswered(code, detail)
  if type(detail) == "table" then
    if detail.output_started then return false end
    return ASK_AFTER[code] or ASK_AFTER[detail.status] or false
  end
  return ASK_AFTER[code] or false
end

return _M
