--- One run of a session under its lock: the sandbox secured (see
-- warmbox.session.resolve), the inputs uploaded, the hooks cell, the lease
-- made to cover the cell, the cell (with the lease extended alongside it when
-- the sandbox was secured that way), its output files, the kernel's refusals
-- and fencing; a failure the cell provably never reached is sent again at
-- most once (warmbox.session.retry).
-- @module warmbox.session.execute

local json = require "warmbox.json"
local util = require "warmbox.util"
local memo = require "warmbox.session.memo"
local outputs = require "warmbox.outputs"
local metrics = require "warmbox.metrics"
local decide = require "warmbox.session.decide"
local retry = require "warmbox.session.retry"
local resolve = require "warmbox.session.resolve"
local task = require "warmbox.task"

local type, ipairs, tostring, tonumber = type, ipairs, tostring, tonumber
local string_format, table_concat, math_min = string.format, table.concat, math.min
local math_type = math.type

local HOME, OUTPUT_DIR = outputs.HOME, outputs.OUTPUT_DIR
local outputs_of = outputs.outputs_of
local is_gone, forget = decide.is_gone, memo.forget

local _M = {}

-- ------------------------------------------------------------------
-- The sandbox's answers: did the cell arrive, does the sandbox exist
-- ------------------------------------------------------------------

-- Whether sandbox `id` exists (running or paused) as the control plane says:
-- false only on its 404 (a transient failure is no proof of anything).
local function exists(s, id)
  local _, _, code = s.client:info(id)
  return code ~= "NOT_FOUND"
end

-- Resumes sandbox `id` when the control plane says it is paused: true when it
-- runs again (the retry's connect then sets its lease as usual).
local function resume_if_paused(s, id)
  local it = s.client:info(id)
  if not (it and it.state == "paused") then return false end
  return s.client:connect(id, { timeout = s.exec_timeout + decide.LEASE_MARGIN }) ~= nil
end

-- Asks what settles a failure's reach (see warmbox.session.retry): "ask"
-- gives the cell's id up in the sandbox first (see `outputs.cell_marked`: a
-- kernel that did not claim it never will), "exists" asks the control plane.
-- → the reach: "never" | "gone" | false
local function settle(s, kind, question, sbx, id, cell_id, detail)
  if question == "ask" then
    local path = outputs.CELLS_DIR .. "/" .. cell_id
    local claimed = sbx:make_dir(path)
    -- Unreachable over envd too: a sandbox paused without its memory does not
    -- resume on a data-plane call (warmboxd after a restart); resumed, it is asked.
    if claimed == nil and resume_if_paused(s, id) then claimed = sbx:make_dir(path) end
    question = retry.answer(kind, "ask", claimed)
    if question == false and type(detail) == "table" then detail.accepted = true end
  end
  if question == "exists" then return retry.answer(kind, "exists", exists(s, id)) end
  return question
end

-- The reach of a failure of request `kind`, asked when it must be.
local function reach_of(s, kind, code, detail, sbx, id, cell_id)
  local reach = retry.reach(kind, code, detail, cell_id ~= nil)
  if reach == "ask" or reach == "exists" then return settle(s, kind, reach, sbx, id, cell_id, detail) end
  return reach
end

--- The data-plane handle of the remembered sandbox `id`.
function _M.handle(s, st, id)
  return s.client:sandbox({ sandbox_id = id, envd_access_token = st.access_token,
    domain = st.domain }, { access_token = st.access_token })
end

--- Registers the python output hook in the kernel of sandbox `id` (starting
-- the kernel when it is new): a cell of its own, idempotent (guarded in the
-- kernel; `fence`: the run's fencing number, see Sandbox:run_code). → true | nil, msg, code, detail
function _M.hook(sbx, st, id, run_timeout, on_line, fence)
  local hout, herr, hcode, hdetail = sbx:run_code(outputs.PRELUDE, {
    language = "python", timeout = run_timeout, on_line = on_line, fence = fence,
  })
  if not hout then return nil, herr, hcode, hdetail end
  for _, res in ipairs(hout.results or {}) do
    if outputs_of(res) then memo.hooked(st, id) end
  end
  return true
end

-- ------------------------------------------------------------------
-- Before the cell
-- ------------------------------------------------------------------

-- Uploads the run's input files into the home directory. → true | nil, msg, code, detail
local function upload_files(sbx, files)
  local list = {}
  for i, f in ipairs(files) do list[i] = { path = HOME .. "/" .. f.name, data = f.content } end
  local ok, err, ecode, detail = sbx:write_files(list)
  if not ok then return nil, err, ecode, detail end
  return true
end

-- The output directory for a cell of another language than python: emptied
-- on a reused sandbox; made on a new one, so the cell can write there.
-- → true | nil, msg, code, detail
local function ready_output_dir(sbx, reused)
  if reused then
    local ok, err, ecode, detail = sbx:remove(OUTPUT_DIR)
    if ok == nil and ecode ~= "NOT_FOUND" then return nil, err, ecode, detail end
  end
  local ok, err, ecode, detail = sbx:make_dir(OUTPUT_DIR)
  if ok == nil and ecode ~= "CONFLICT" then return nil, err, ecode, detail end
  return true
end

-- Inputs uploaded, the output directory ready (not python) or the hooks
-- registered (python). → true | nil, msg, code, detail
local function prepare(run)
  local sbx, info, st = run.sbx, run.info, run.st
  if #run.files > 0 then
    local ok, err, ecode, detail = upload_files(sbx, run.files)
    if not ok then return nil, err, ecode, detail end
  end
  if not run.python then return ready_output_dir(sbx, info.reused) end
  if st.hooked ~= info.sandbox_id then
    -- A kernel that may not have the output hooks gets them in a cell of their
    -- own, so the user's cell is sent as it is (its tracebacks and line numbers
    -- are the user's). Idempotent (guarded in the kernel), and the user's cell
    -- is not sent yet: a failure here is one before the run.
    return _M.hook(sbx, st, info.sandbox_id, run.run_timeout, run.on_line, run.fence)
  end
  return true
end

-- Unwatched (no `parallel`), the lease covers the whole run: after the
-- uploads, the output directory and the hooks cell (which took time of the
-- lease set before them), a lease that no longer covers the cell's timeout +
-- COVER_MARGIN is extended before the cell is sent (one request, only then).
-- Watched, the run's watchdog does it (see `watched`). → true | nil, msg, code, detail
local function cover(run)
  local s, st, info = run.s, run.st, run.info
  if s.parallel or not st.lease_end then return true end
  local t0 = s.clock()
  local want = decide.extension(t0, st.lease_end, run.run_timeout)
  if not want then return true end
  local ok, err, code, detail = s.client:set_timeout(info.sandbox_id, want)
  metrics.phase(s._tm, "lease")
  s:_event("extend", { sandbox_id = info.sandbox_id, ok = ok == true, code = not ok and code or nil })
  if not ok then return nil, err, code, detail end
  memo.extend_lease(s, st, t0 + want)
  return true
end

-- Everything before the cell (prepare, then cover). Unreachable there: the
-- remembered sandbox wins while it exists (the run is sent to it again, after a
-- connect); only one that is gone is forgotten. → true | nil, msg, code, detail, reach
local function ready(run)
  local ok, err, code, detail = prepare(run)
  metrics.phase(run.s._tm, "prepare")
  if ok then ok, err, code, detail = cover(run) end
  if ok then return true end
  return nil, err, code, detail, reach_of(run.s, "prepare", code, detail, run.sbx, run.info.sandbox_id)
end

-- ------------------------------------------------------------------
-- The cell and what it left
-- ------------------------------------------------------------------

local function concat_chunks(t)
  if type(t) == "string" then return t end
  if type(t) ~= "table" then return "" end
  return table_concat(t)
end

-- The files the run left in the output directory: from the output hook's
-- report, else (another language, or a kernel that lost its hooks) listed
-- through envd; what the kernel is known to have hooked is noted in st.
-- → files, files_error ({ msg, code } when only part of them came)
local function output_files(sbx, st, id, report, python, cap)
  local out_files, ferr, fcode, partial
  if report then
    memo.hooked(st, id)
    out_files, ferr, fcode, partial = outputs.files_from_report(sbx, report, cap)
  else
    -- No report: another language, or the kernel lost its hooks (restarted).
    if python then memo.hooked(st, nil) end
    out_files, ferr, fcode, partial = outputs.collect_envd(sbx, cap)
  end
  if not out_files then return partial or {}, { ferr, fcode } end
  return out_files, nil
end

-- The main result's text (the cell's value), as E2B's SDKs' execution.text.
local function main_text(results)
  for _, res in ipairs(results) do
    if res.is_main_result then return res.text end
  end
  return nil
end

-- A failed run's output so far (`detail.partial`) shaped as a result's
-- fields: stdout and stderr strings, the results (warmbox's own report left
-- out), the error (its traceback plain), the main result's text.
local function partial_result(exec)
  local results = {}
  for _, res in ipairs(type(exec.results) == "table" and exec.results or {}) do
    if not outputs_of(res) then results[#results + 1] = res end
  end
  local e = exec.error
  if e == json.null then e = nil end
  if type(e) == "table" and type(e.traceback) == "string" then
    e = util.copy(e)
    e.traceback_ansi, e.traceback = e.traceback, util.strip_ansi(e.traceback)
  end
  return { stdout = concat_chunks(exec.stdout), stderr = concat_chunks(exec.stderr), results = results, error = e,
    text = main_text(results), execution_count = exec.execution_count, truncated = exec.truncated or false }
end

-- A failure's detail with its `partial` shaped as a result's fields.
local function with_partial(detail)
  if type(detail) == "table" and type(detail.partial) == "table" then
    detail.partial = partial_result(detail.partial)
  end
  return detail
end

-- The result of a run that ran (see `attempt`).
local function run_result(out, info, results, out_files, files_error, cap, lock_error)
  local e = out.error
  if e == json.null then e = nil end
  if type(e) == "table" and type(e.traceback) == "string" and e.traceback:find("\27", 1, true) then
    -- IPython colours its tracebacks: the traceback is plain text, the coloured one kept beside it
    e = util.copy(e)
    e.traceback_ansi, e.traceback = e.traceback, util.strip_ansi(e.traceback)
  end
  return {
    stdout = concat_chunks(out.stdout), stderr = concat_chunks(out.stderr),
    error = e, results = results, files = out_files, files_error = files_error,
    truncated = (out.truncated or #cap.dropped > 0) or false,
    dropped_files = #cap.dropped > 0 and cap.dropped or nil,
    undecoded = out.undecoded and #out.undecoded > 0 and out.undecoded or nil,
    replaced = out.replaced,
    lock_error = lock_error,
    -- The lock was lost while the cell ran (it ran all the same): a later run
    -- of the conversation may have taken over.
    lock_lost = lock_error ~= nil and lock_error[2] == "LOCK" or nil,
    reused = info.reused, resumed = info.resumed, sandbox_id = info.sandbox_id,
    execution_count = out.execution_count, text = main_text(results),
  }
end

-- Whether the kernel refused a marked cell before anything of it ran:
-- "HOOKS_LOST" (no hooks: the mark failed), "FENCED" (a run with a higher
-- fencing number had run there), else nil.
local function refusal(out)
  local e = out.error
  if e == nil and type(out.stderr) == "table" and type(out.stderr[1]) == "string"
    and out.stderr[1]:find("^warmbox: fenced: ") then
    -- bash: the guard refused the cell with status 0 (see outputs.cell_guarded)
    out.error = { name = "RuntimeError", value = (out.stderr[1]:gsub("\n.*", "")) }
    return "FENCED"
  end
  if type(e) ~= "table" or type(e.value) ~= "string" then return nil end
  if e.name == "NameError" and e.value:find("__warmbox_cell__", 1, true) then return "HOOKS_LOST" end
  if e.name == "RuntimeError" and e.value:find("^warmbox: fenced: ") then return "FENCED" end
  return nil
end

local function fenced_msg(id, why)
  return string_format("run in sandbox '%s' refused: the sandbox accepted a cell with a higher fencing number "
    .. "(its lock was lost or taken over) (%s)", id,
    tostring(why):gsub("^warmbox: fenced: ", ""))
end

-- A marked cell the kernel refused before anything of it ran (see `refusal`):
-- the failure (as `attempt`'s), else nil.
local function refused_run(out, info, st)
  local code = refusal(out)
  if not code then return nil end
  local msg
  if code == "HOOKS_LOST" then
    -- The kernel lost the hooks (restarted): the cell failed on its first line.
    memo.hooked(st, nil)
    msg = "run in sandbox '" .. info.sandbox_id .. "': its kernel lost warmbox's hooks"
  else
    msg = fenced_msg(info.sandbox_id, out.error.value)
  end
  return nil, msg, code, { started = false }, retry.reach("refused", code)
end

-- Whether output files were read over envd (after the cell: another run may
-- have changed the output directory meanwhile), not all inline in the report:
-- always for a listing over envd, even an empty or failed one (a later run may
-- have emptied the directory before this run listed it).
local function read_over_envd(report)
  if not report then return true end
  for _, f in ipairs(type(report.files) == "table" and report.files or {}) do
    if type(f) == "table" and f.b64 == nil then return true end
  end
  return false
end

-- Fencing of an output collection: no run with a higher fencing number than
-- `fence` has had a cell accepted in the sandbox (its output directory is this
-- run's). → true | nil, msg, "FENCED" | nil, msg, code (it could not be read)
local function fence_holds(sbx, id, fence)
  local s, err, code = sbx:read_file(outputs.FENCE_FILE)
  if not s then
    if code == "NOT_FOUND" then return true end
    return nil, err, code
  end
  local high = tonumber((tostring(s):match("^%s*(%d+)")))
  if high and high > fence then
    return nil, fenced_msg(id, string_format("run %d collected its outputs after run %d", fence, high)), "FENCED"
  end
  return true
end

-- The cell as sent, with its id and run's fencing number `fence` (python: when
-- its kernel has the hooks; bash, JS, TS: a guard of their own), and its id:
-- code, id | code, nil (a language without a guard).
local function marked_cell(code, language, hooked, fence)
  local id = util.unique_id()
  if language == "python" then
    if hooked then return outputs.cell_marked(code, id, fence), id end
    return code, nil
  end
  local guarded = outputs.cell_guarded(code, language, id, fence)
  if guarded then return guarded, id end
  return code, nil
end

-- The run's output files (see output_files), timed, and the "outputs" event.
local function collect(run, report, cap)
  local s, id = run.s, run.info.sandbox_id
  local out_files, files_error = output_files(run.sbx, run.st, id, report, run.python, cap)
  metrics.phase(s._tm, "outputs")
  s:_event("outputs", { sandbox_id = id, files = #out_files, code = files_error and files_error[2] or nil })
  return out_files, files_error
end

-- { msg, code } when the lock `lk` is no longer held (asked of its backend
-- now, `lk:held()`), else nil (held, or a lock without `held`).
local function lock_lost(lk)
  if not (lk and type(lk.held) == "function") then return nil end
  local ok, err, code = lk:held()
  if ok then return nil end
  return { tostring(err), code or "LOCK" }
end

-- A failed execute: its reach (see warmbox.session.retry), `detail.started`
-- settled by it (false once the sandbox said the cell never came). warmboxd's
-- 409 for a fenced cell (another run's cell still executes in another of the
-- sandbox's kernels, its lock lost) is a refusal (HELD), reported and never
-- re-sent; the cell's id claimed proves it never started.
-- → nil, msg, code, detail, reach
local function cell_failed(s, err, ecode, detail, sbx, id, cell_id)
  local reach
  if ecode == "CONFLICT" and cell_id and type(detail) == "table" then
    if settle(s, "cell", "ask", sbx, id, cell_id, detail) == "never" then detail.started = false end
    return nil, string_format("run in sandbox '%s' not started: the cell of an older run of the conversation "
      .. "still executes there (its lock was lost): %s", id, tostring(err)), "HELD", detail, false
  end
  reach = reach_of(s, "cell", ecode, detail, sbx, id, cell_id)
  if reach == "never" and type(detail) == "table" then detail.started = false end
  return nil, err, ecode, detail, reach
end

-- The result of a cell that ran: whatever fails from here on is reported in
-- it, never re-run. A later run's fence found at the collection (the lock was
-- lost under this run): no files (the output directory may be the later
-- run's), `lock_lost`, never a refusal (the cell ran to its end).
local function ran(run, out)
  local report, fence, lock_error = run.report, run.fence, run.lock_error
  local results = {}
  for _, res in ipairs(out.results or {}) do
    local rep = outputs_of(res)
    if rep then report = report or rep else results[#results + 1] = res end
  end
  local cap = { left = run.s.max_files_bytes, dropped = {} }
  local out_files, files_error = collect(run, report, cap)
  local fenced
  if fence and (lock_error or read_over_envd(report)) then
    local ok, ferr, fcode = fence_holds(run.sbx, run.info.sandbox_id, fence)
    if not ok then out_files, files_error, fenced = {}, { ferr, fcode }, fcode == "FENCED" end
  end
  local r = run_result(out, run.info, results, out_files, files_error, cap, lock_error)
  if fenced then r.lock_lost = true end
  return r
end

-- The fencing number of the run's lock `lk` (see Sandbox:run_code), or nil.
local function fence_of(lk)
  local fence = lk and type(lk.fence) == "function" and lk:fence() or nil
  if math_type(fence) ~= "integer" or fence < 0 then return nil end
  return fence
end

-- One attempt of `run` on the sandbox `info` just secured: everything before
-- the cell, the cell, its outputs. → r | nil, msg, code, detail, reach
-- ("never" | "gone" only when the cell cannot have run, see warmbox.session.retry)
local function attempt(run, info)
  local s, st, opts = run.s, run.st, run.opts
  run.info, run.sbx, run.report, run.lock_error = info, _M.handle(s, st, info.sandbox_id), nil, nil
  run.fence = fence_of(run.lk)
  info.fence = run.fence
  local sbx, fence = run.sbx, run.fence
  do
    local ok, perr, pcode, pdetail, preach = ready(run)
    if not ok then return nil, perr, pcode, with_partial(pdetail), preach end
  end
  local code, cell_id = marked_cell(run.code, run.language, st.hooked == info.sandbox_id, fence)
  local user_on_result = opts.on_result
  local out, err, ecode, detail = sbx:run_code(code, {
    language = run.language, timeout = run.run_timeout, max_output = s.max_output,
    fence = fence,
    on_stdout = opts.on_stdout, on_stderr = opts.on_stderr,
    is_private = function(res) return outputs_of(res) ~= nil end,
    on_result = function(res)
      local rep = outputs_of(res)
      if rep then run.report = rep return end
      if user_on_result then return user_on_result(res) end
    end,
    -- Every stream event (keepalives included) keeps the session's lock alive.
    on_line = run.on_line,
  })
  metrics.phase(s._tm, "execute")
  local lock_error = run.lock_error
  if not out then
    if detail and lock_error then detail.lock_error, detail.lock_lost = lock_error, lock_error[2] == "LOCK" or nil end
    detail = with_partial(detail)
    return cell_failed(s, err, ecode, detail, sbx, info.sandbox_id, cell_id)
  end
  if cell_id then
    local _, rerr, rcode, rdetail, rreach = refused_run(out, info, st)
    if rcode then return nil, rerr, rcode, rdetail, rreach end
  end
  -- Still the holder? Asked of the lock's backend now (a Redis failover may
  -- have lost the lock while the keeper had not looked yet): a run that lost
  -- it says so, and its outputs are checked against the sandbox's fence.
  run.lock_error = lock_error or lock_lost(run.lk)
  return ran(run, out)
end

-- ------------------------------------------------------------------
-- The watchdog: the lease kept while the run goes on
-- ------------------------------------------------------------------

-- One extension of the lease (connect with the run's lease), tried again on
-- a transient fault under retry.lease's rule until it holds or could no
-- longer land before the lease ends: then the run is interrupted (its
-- connection closed: the server stops the cell) rather than paused
-- underneath. → the new lease end | nil; `w.err`: the last failure
local function extend(s, ctl, info, st, w, lease_end)
  local id, lease = info.sandbox_id, info.lease
  local tries = 0
  while true do
    local t0 = s.clock()
    local sb, res, ccode = s.client:connect(id, { timeout = lease })
    s:_event("connect", { sandbox_id = id, ok = sb ~= nil, resumed = sb and res or nil,
      code = not sb and ccode or nil, alongside = true })
    s:_event("extend", { sandbox_id = id, ok = sb ~= nil, code = not sb and ccode or nil, watchdog = true })
    if sb then
      w.err, w.extended = nil, (w.extended or 0) + 1
      if sb.sandbox_id == nil then sb.sandbox_id = id end
      memo.remember(s, st, sb, t0 + lease, res == true and t0 or nil)
      return st.lease_end
    end
    w.err = { tostring(res), ccode }
    if ctl.main_done() then return nil end
    tries = tries + 1
    -- A 404 is no proof (an intermediary's after forwarding): only one `info`
    -- confirms it; else it is tried again as a passing fault. Confirmed gone:
    -- no cell runs in it (nothing to interrupt); the execute's own answer says
    -- what happened.
    local rule_code = ccode
    if is_gone(ccode) then
      w.gone = resolve.confirmed_gone(s, id)
      if w.gone then return nil end
      rule_code = "HTTP"
    end
    local pause = lease_end and retry.lease(rule_code, tries, s.clock(), decide.watch_deadline(lease_end, lease))
    if not pause then
      w.interrupted = true
      ctl.interrupt(string_format("the lease of sandbox '%s' could not be extended: %s", id, tostring(res)))
      return nil
    end
    ctl.sleep(pause)
  end
end

-- The watchdog of a run (a side task while the run goes on, see `watched`):
-- extends the lease at once when the run came that way ("alongside"), then
-- each time the lease comes within decide.watch_margin of its end, until the
-- run is over; one connect per extension. `lease_end`: the lease end it
-- starts from (a resume by traffic: the lease that gives).
local function watchdog(s, ctl, info, st, w, lease_end)
  local now_first = info.how == "alongside"
  while true do
    if not now_first then
      if not lease_end then return end
      -- (in steps of at most WATCH_POLL: a session clock moved meanwhile is seen)
      local wait = decide.watch_at(lease_end, info.lease) - s.clock()
      while wait > 0 do
        ctl.wait(math_min(wait, decide.WATCH_POLL))
        if ctl.main_done() then return end
        wait = decide.watch_at(lease_end, info.lease) - s.clock()
      end
      if ctl.main_done() then return end
    end
    now_first = false
    lease_end = extend(s, ctl, info, st, w, lease_end)
    if not lease_end then return end
  end
end

--- Runs `main()` (the whole attempt: uploads, the hooks cell, the cell, its
-- outputs) under the lease's watchdog when the session has `parallel`, else
-- as it is. A run that failed because no extension held is reported as
-- interrupted (never sent again: the cell may have started); a run that
-- ended while the last extension was failing says so in `lease_error`.
-- → main's returns
function _M.watched(s, info, st, main)
  if not s.parallel or not info.lease then return main() end
  local id, how = info.sandbox_id, info.how
  local t_exec = s.clock()
  local start_end = st.lease_end
  if how == "auto_resume" then start_end = decide.auto_resume_end(t_exec, s.max_run_length) end
  local w = {}
  local _, r, err, ecode, detail, reach = s.parallel(main, function(ctl)
    return watchdog(s, ctl, info, st, w, start_end)
  end)
  if how == "auto_resume" and (r or not reach) then
    -- The execute reached the sandbox: traffic resumed it (a new E2B run).
    memo.resumed_at(s, st, t_exec)
  end
  local lease_err = w.err
  -- Confirmed gone: forgotten; the execute's own answer says what happened.
  if w.gone then forget(st) end
  if not lease_err then return r, err, ecode, detail, reach end
  s:_event("lease_failed", { sandbox_id = id, code = lease_err[2], watchdog = true })
  if r then
    r.lease_error = lease_err
    return r
  end
  if not reach and not w.gone then
    -- Interrupted (or failed while the lease could not be secured): the cell
    -- may have started, so it is reported, never sent again.
    detail = type(detail) == "table" and detail or {}
    detail.lease_error = lease_err
    detail.interrupted = true
    return nil, string_format("run in sandbox '%s' interrupted: its lease could not be extended (%s)", id,
      lease_err[1]), lease_err[2] or ecode, detail, false
  end
  return r, err, ecode, detail, reach
end

-- ------------------------------------------------------------------
-- The run
-- ------------------------------------------------------------------

-- The events of a run's start: "reuse" or "resume" (a sandbox had before;
-- "create" is sent when one is made), then "run_start".
local function started(s, info)
  if info.resumed then
    s:_event("resume", { sandbox_id = info.sandbox_id, how = info.how })
  elseif info.reused then
    s:_event("reuse", { sandbox_id = info.sandbox_id, how = info.how })
  end
  s:_event("run_start", { sandbox_id = info.sandbox_id, reused = info.reused == true,
    resumed = info.resumed == true, how = info.how })
end

-- After a run that ran: the conversation's count of turns, the orphans collected.
local function succeeded(s, st, r)
  -- (since it lost its memory, if it did: what its kernel holds now is kept)
  r.turn = memo.ran(st, s.wall())
  if st.creating then resolve.collect_orphans(s, st) end
  if st.replaced then resolve.collect_replaced(s, st) end
end

-- The state saved once the cell ran: a compare-and-set on the lock's token,
-- so a lock lost under the run (Redis restarted, the holder cut off past its
-- expiry) shows here: `r.lock_lost`, `r.lock_error` (a transient failure is
-- tried once more: a connection a Redis restart broke reconnects).
local function saved_after(lk, st, r)
  local ok, err, code = memo.save(lk, st)
  if not ok and (code == "TRANSPORT" or code == "IO") then ok, err, code = memo.save(lk, st) end
  if ok then return end
  r.lock_error = r.lock_error or { tostring(err), code }
  if code == "LOCK" then r.lock_lost = true end
end

-- A policy that pauses the sandbox after every run (`pause_after_run`, the
-- pause-after-every-turn flow): the pause (memory kept), and the lease
-- remembered as over, so the next run resumes it with a connect. A failed
-- pause is in the result (`pause_error`); the lease then ends it.
local function pause_after(s, st, r)
  local ok, perr, pcode = s.client:pause(r.sandbox_id)
  s:_event("pause_after_run", { sandbox_id = r.sandbox_id, ok = ok ~= nil, code = ok == nil and pcode or nil })
  if ok == nil and pcode ~= "NOT_FOUND" then
    r.pause_error = { tostring(perr), pcode }
    return
  end
  memo.lease_over(st, s.clock() - decide.PAUSE_GRACE)
end

-- The Retry-After pause on the session's runner (`r:pause`: inside one of its
-- tasks the others go on, outside it blocks); a session given no runner (a
-- bare session.new, the simulator's): the scheduler's `task.pause`.
local function pause(s, seconds)
  local r = s.runner
  if r and r.pause then return r:pause(seconds) end
  return task.pause(seconds)
end

-- A run's inputs, made once by run_locked and passed down (`attempt` fills in
-- the per-attempt fields: `info` the sandbox secured, `sbx` its handle,
-- `fence` the lock's fencing number, `report` the output hook's, `lock_error`
-- a keepalive's failure).
local function new_run(s, lk, st, code, opts, files)
  local language = opts.language or "python"
  local run = { s = s, lk = lk, st = st, code = code, opts = opts, files = files, language = language,
    python = language == "python", run_timeout = opts.timeout or s.exec_timeout }
  local keepalive = lk and lk.keepalive
  if keepalive then
    -- every stream event keeps the session's lock alive; the first failure is kept
    run.on_line = function()
      local ok, kerr, kcode = keepalive(lk)
      if not ok and not run.lock_error then run.lock_error = { tostring(kerr), kcode } end
    end
  end
  return run
end

--- Runs `code` holding the session's lock `lk` (`files`: normalized). At
-- most once: the run is sent again only when warmbox.session.retry says the
-- cell provably never reached a kernel. → r | nil, msg, code, detail
function _M.run_locked(s, lk, code, opts, files)
  -- (state written for another tag value or another E2B endpoint/account is not ours: forgotten)
  local st = memo.load(lk, s)
  local run = new_run(s, lk, st, code, opts, files)
  local run_timeout = run.run_timeout
  local tries, hooks_resent = 0, false
  -- The conversation's sandbox before the run: one that is gone (killed, or
  -- lost by a restart of a server that could not keep its paused copy) is said.
  local had = st.sandbox_id
  while true do
    tries = tries + 1
    local info, err, ecode, detail = resolve.acquire(s, st, run_timeout)
    memo.save(lk, st)
    metrics.phase(s._tm, "resolve")
    if not info then return nil, err, ecode, detail end
    started(s, info)
    local r, reach
    r, err, ecode, detail, reach = _M.watched(s, info, st, function()
      return attempt(run, info)
    end)
    metrics.phase(s._tm, "execute") -- (the attempt's end: its fencing, the lease's bookkeeping)
    if r then
      if had and r.sandbox_id ~= had then
        r.sandbox_lost = had
        s:_event("sandbox_lost", { sandbox_id = had, new_sandbox_id = r.sandbox_id })
      end
      -- The kernel had lost the hooks it was given (it started afresh: a
      -- server restart, a crash): what it held before this run is gone.
      if hooks_resent then r.memory_lost = true end
      succeeded(s, st, r)
      if s.policy.pause_after_run then pause_after(s, st, r) end
      saved_after(lk, st, r)
      return r
    end
    local verdict, hooks = retry.again(reach, ecode, tries, hooks_resent)
    hooks_resent = hooks_resent or hooks
    if hooks then s:_event("memory_lost", { sandbox_id = info.sandbox_id, kernel = true }) end
    -- Sent once more, to the same sandbox while it exists (its kernel and
    -- files are the conversation's), else to one resolved again.
    if verdict then s:_event("retry", { sandbox_id = info.sandbox_id, code = ecode }) end
    if verdict == "resolve" then
      forget(st)
    elseif retry.reconnect(ecode, detail) then
      -- Unreachable a moment ago: the next connect comes first (it resumes a
      -- sandbox paused under its remembered lease).
      memo.lease_unknown(st)
    end
    memo.save(lk, st)
    if not verdict then return nil, err, ecode, detail end
    local wait = retry.wait(detail)
    if wait then pause(s, wait) end
    metrics.phase(s._tm, "retry")
  end
end

return _M
