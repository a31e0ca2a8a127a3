--- Sessions: one warm sandbox per conversation.
--
-- A session finds its conversation's sandbox by a metadata tag, keeps its lease
-- long enough for a run and the idle window, runs code in it one run at a
-- time, and returns only the files that run produced. The parts it works with
-- are given to it (an E2B client, a lock, a clock and a policy), so GC and the
-- simulator drive the very same code against a model in virtual time.
--
--   local session = require "warmbox.session"
--   local s = session.new("workspace-1:thread-9", {
--     client = e2b_client, lock = "file", clock = os.time, policy = nil,
--     template = "code-interpreter-v1", exec_timeout = 300, idle_timeout = 300,
--     tag = "warmboxSessionId", env = { TOKEN = "..." }, actor = "alice" })
--   local r, err, code = s:run("print(1)")
--
-- What a session remembers between runs (sandbox id, access token, lease end,
-- last run) is kept in the lock's per-key state, so every process that shares
-- the lock shares that memory (see warmbox.state).
-- @module warmbox.session

local policy_mod = require "warmbox.policy"
local util = require "warmbox.util"
local tag_mod = require "warmbox.tag"
local outputs = require "warmbox.outputs"
local errors = require "warmbox.errors"
local metrics = require "warmbox.metrics"
local decide = require "warmbox.session.decide"
local execute = require "warmbox.session.execute"
local prewarm = require "warmbox.session.prewarm"
local memo = require "warmbox.session.memo"

local type, pairs, ipairs, tostring, error, setmetatable =
  type, pairs, ipairs, tostring, error, setmetatable
local xpcall, traceback, string_format, table_sort =
  xpcall, debug.traceback, string.format, table.sort
local getmetatable = getmetatable
local os_time = os.time

local _M = {}

local check_options, bad_option = errors.check_options, errors.bad_option

-- The settings' defaults and limits (warmbox.session.decide has the rest of the constants).
_M.MAX_OUTPUT, _M.MAX_FILES_BYTES, _M.LEASE_MARGIN = decide.MAX_OUTPUT, decide.MAX_FILES_BYTES, decide.LEASE_MARGIN
_M.PREWARM_KICK, _M.PREWARM_COUNTERS = prewarm.PREWARM_KICK, prewarm.PREWARM_COUNTERS
local MAX_RUN_LENGTH_LIMIT = decide.MAX_RUN_LENGTH_LIMIT

local check_file_name = outputs.check_file_name

local function normalize_files(files)
  local list = {}
  if files == nil then return list end
  if files[1] ~= nil then
    for i, f in ipairs(files) do
      if type(f) ~= "table" then bad_option(2, "run", "files", "entry " .. i .. " is not a table", 3) end
      local content = f.content or f.data
      if type(content) ~= "string" then
        bad_option(2, "run", "files", "entry " .. i .. " has no string content", 3)
      end
      list[#list + 1] = { name = f.name, content = content }
    end
  else
    for name, content in pairs(files) do
      if type(content) ~= "string" then
        bad_option(2, "run", "files", "content of '" .. tostring(name) .. "' is not a string", 3)
      end
      list[#list + 1] = { name = name, content = content }
    end
    table_sort(list, function(a, b) return tostring(a.name) < tostring(b.name) end)
  end
  for _, f in ipairs(list) do
    local ok, err = check_file_name(f.name)
    if not ok then return nil, err end
  end
  return list
end

local RUN_OPTS = { files = "table", language = "string", timeout = "number", on_stdout = "function",
  on_stderr = "function", on_result = "function" }

local function is_positive_number(v) return type(v) == "number" and v > 0 and v == v and v < math.huge end

--- Checks the settings shared by `new` here and in warmbox (`exec_timeout`,
-- `idle_timeout`, `max_run_length`, `max_output`, `max_files_bytes`) and
-- raises `bad argument #argn to 'fname' (option 'k': ...)`. Missing values are allowed.
-- @tparam table o the settings
-- @tparam string fname the function named in the error
-- @tparam integer argn the position of the options argument
-- @tparam[opt=2] integer level as `error`'s, counted from the caller
-- syntax: session.check_settings(o, fname, argn[, level])
function _M.check_settings(o, fname, argn, level)
  level = (level or 2) + 2
  local function bad(k, want)
    bad_option(argn, fname, k, want .. " expected, got " .. tostring(o[k]), level)
  end
  local mrl = o.max_run_length
  if mrl ~= nil and not (is_positive_number(mrl) and mrl <= MAX_RUN_LENGTH_LIMIT) then
    bad("max_run_length", "seconds in (0, " .. MAX_RUN_LENGTH_LIMIT .. "]")
  end
  local limit = mrl or 24 * 3600
  for _, k in ipairs({ "exec_timeout", "idle_timeout" }) do
    local v = o[k]
    if v ~= nil and not (is_positive_number(v) and v <= limit) then
      bad(k, "seconds in (0, " .. string_format("%g", limit) .. "] (at most max_run_length)")
    end
  end
  for _, k in ipairs({ "max_output", "max_files_bytes" }) do
    local v = o[k]
    if v ~= nil and not (math.type(v) == "integer" and v >= 1 and v <= 1 << 40) then
      bad(k, "an integer number of bytes in [1, 2^40]")
    end
  end
end

-- ------------------------------------------------------------------
-- Session objects
-- ------------------------------------------------------------------

local Session = {}
Session.__index = Session
Session.__name = "warmbox.Session"
_M.Session = Session

local NEW_OPTS = { client = "table", lock = "string|table|function", lock_opts = "table", clock = "function",
  mono = "function",
  policy = "table|string", template = "string", exec_timeout = "number", idle_timeout = "number", tag = "string",
  env = "map", actor = "string", secret = "string", hmac = "function", sha256 = "function", on_event = "function",
  log = "function",
  origin = "string", max_run_length = "number", max_output = "number", max_files_bytes = "number",
  parallel = "function", require_memory = "boolean", runner = "table|function", counters = "table" }

-- Lease bookkeeping on a monotonic clock: unix seconds as the wall clock said
-- when this process first asked, moved on by the monotonic clock since (one
-- anchor per pair of clocks, so every session of a process agrees). A step of
-- the wall clock never moves a lease end.
local anchors = setmetatable({}, { __mode = "k" })
local function lease_clock(wall, mono)
  local by_wall = anchors[mono]
  if not by_wall then
    by_wall = setmetatable({}, { __mode = "k" })
    anchors[mono] = by_wall
  end
  local a = by_wall[wall]
  if not a then
    local w0, m0 = wall(), mono()
    a = function() return w0 + (mono() - m0) end
    by_wall[wall] = a
  end
  return a
end
_M.lease_clock = lease_clock

-- The lock module, required when a session first needs it (a session given
-- its own lock function never loads warmbox.lock).
local function locks() return require "warmbox.lock" end
local function checkpoints() return require "warmbox.session.checkpoint" end

--- The lock options a session's lock gets unless given: it waits long enough
-- for a run of the same session to finish; a dead holder's lock expires
-- (Redis) or is released by the kernel (file).
-- syntax: opts = session.lock_defaults(exec_timeout)
function _M.lock_defaults(exec_timeout)
  return { timeout = exec_timeout + 60, exptime = exec_timeout + 120 }
end

-- Whether `new`'s policy option is a complete policy (a table with a name
-- and every hook), used as it is rather than resolved by warmbox.policy.
local function complete_policy(policy)
  return type(policy) == "table" and policy.name and policy.order and policy.lease
    and policy.should_refresh and policy.create_params and policy.gc and true or false
end

-- The runner prewarms and automatic checkpoints are spawned on (warmbox.new
-- gives wb's), or a function returning it: → runner, get_runner (neither:
-- see warmbox.session.prewarm's `runner`).
local function runner_option(r)
  if type(r) == "function" then return nil, r end
  return r, nil
end

--- Make a session object.
-- @tparam string key the session key (any bytes)
-- @tparam table opts parts and settings: `client` (a `warmbox.e2b` client,
--   required), `lock` ("file" | "redis" | "memory" | lock options | a lock
--   module with `new` | a function returning a lock object; default "file"),
--   `lock_opts` (options for a lock module), `clock` (function returning unix
--   seconds, default `os.time`), `mono` (a monotonic clock: lease durations follow
--   it, immune to wall-clock steps; nil: they follow `clock`), `policy` (nil | table | path), `template`
--   (default "code-interpreter-v1"), `exec_timeout` (300), `idle_timeout`
--   (300), `tag` ("warmboxSessionId"), `env` (env vars baked in at creation),
--   `actor`, `secret` (fingerprint HMAC key), `on_event` (function(name, info)
--   called on "connect", "create", "kill", "retry", "recycle", "prewarm", "lease_floor"), `origin` (a string naming the
--   E2B endpoint and account: remembered state written under another origin is ignored),
--   `max_run_length` (seconds E2B lets one run of a sandbox last from its start:
--   86400 on Pro, 3600 on Hobby; default 86400), `require_memory` (false: a sandbox
--   paused without its memory, e.g. demoted by GC, is resumed and used with a fresh
--   kernel, its files kept; true: it is replaced by a new sandbox, killed once the
--   new one is secured), `runner` (the runner `s:prewarm` and automatic checkpoints spawn
--   their tasks on, or a function returning it: `spawn`, `current`, `join`, `step`, `sleep`,
--   and optionally `kick`; warmbox.new gives its own), `counters` (the
--   table `s:prewarm` counts into, see `s:stats`).
-- @treturn warmbox.Session
function _M.new(key, opts)
  if type(key) ~= "string" or key == "" then
    error("bad argument #1 to 'new' (non-empty string expected, got "
      .. (key == "" and "empty string" or type(key)) .. ")", 2)
  end
  opts = util.copy(check_options(opts, NEW_OPTS, "new", 2))
  if type(opts.client) ~= "table" then bad_option(2, "new", "client", "E2B client expected") end
  local self = {
    key = key,
    new_opts = opts, -- what s:branch makes its session with (warmbox.session.checkpoint)
    client = opts.client,
    -- `clock`: lease bookkeeping (durations); `wall`: unix seconds (last_run, which GC
    -- compares with E2B's times). With `mono` the first follows the monotonic clock.
    wall = opts.clock or os_time,
    clock = opts.mono and lease_clock(opts.clock or os_time, opts.mono) or opts.clock or os_time,
    template = opts.template or "code-interpreter-v1",
    exec_timeout = opts.exec_timeout or 300,
    idle_timeout = opts.idle_timeout or 300,
    tag = opts.tag or "warmboxSessionId",
    actor = opts.actor,
    on_event = opts.on_event,
    log = opts.log,
    origin = opts.origin,
    max_run_length = opts.max_run_length or 24 * 3600,
    max_output = opts.max_output or _M.MAX_OUTPUT,
    max_files_bytes = opts.max_files_bytes or _M.MAX_FILES_BYTES,
    -- parallel(main, side): runs both at once (warmbox.runner); nil: the
    -- lease is always extended before the execute.
    parallel = opts.parallel,
    require_memory = opts.require_memory == true,
    -- Counted events (prewarms); warmbox.new shares one table across its sessions.
    counters = opts.counters or {},
  }
  self.runner, self.get_runner = runner_option(opts.runner)
  _M.check_settings(self, "new", 2)
  if self.tag == "" then bad_option(2, "new", "tag", "non-empty string expected") end
  self.env = opts.env and util.copy(opts.env) or {}
  if complete_policy(opts.policy) then
    self.policy = opts.policy
  else
    local p, perr = policy_mod.resolve(opts.policy)
    if not p then error(perr, 2) end
    self.policy = p
  end
  self.tag_value = tag_mod.tag_value(key, { template = self.template, env = self.env, actor = opts.actor,
    secret = opts.secret, hmac = opts.hmac, sha256 = opts.sha256 })
  if type(opts.lock) == "function" then
    self.new_lock = opts.lock
  else
    self.new_lock = locks().factory(opts.lock, _M.lock_defaults(self.exec_timeout), opts.lock_opts, "new", 2)
  end
  return setmetatable(self, Session)
end

function Session:__tostring()
  return "warmbox.Session: " .. self.key
end

function Session:_event(name, info)
  if self.on_event or self.log then
    metrics.emit(self.on_event, self.log, name, info, "session '" .. self.key .. "'")
  end
end

-- Writes what is remembered to the lock held now (a create is recorded
-- before it is sent).
function Session:_save(st)
  local lk = self._held
  if lk then memo.save(lk, st) end
end

-- The context every hook gets.
function Session:_ctx(st, run_timeout)
  return {
    key = self.key, tag = self.tag, tag_value = self.tag_value, template = self.template,
    env = self.env, actor = self.actor, now = self.clock(),
    exec_timeout = self.exec_timeout, idle_timeout = self.idle_timeout,
    run_timeout = run_timeout or self.exec_timeout, margin = _M.LEASE_MARGIN,
    -- a watchdog keeps the lease while a run goes on (see warmbox.session.execute)
    watched = self.parallel ~= nil,
    lease_end = st and st.lease_end, sandbox_id = st and st.sandbox_id,
  }
end


-- Sets `field` on the result `r`, else on the failure's detail (made when
-- missing); returns the detail.
local function attach(r, detail, field, value)
  if r then
    r[field] = value
    return detail
  end
  detail = type(detail) == "table" and detail or {}
  detail[field] = value
  return detail
end

-- The end of a run: timings on the result (or the failure's detail), the
-- run counted, the "run_end" event.
function Session:_ended(tm, r, err, ecode, detail)
  local timings = metrics.timings(tm)
  detail = attach(r, detail, "timings", timings)
  metrics.count_run(self.counters, r, ecode, timings.total)
  self:_event("run_end", { ok = r ~= nil, code = not r and ecode or nil, message = not r and err or nil,
    sandbox_id = r and r.sandbox_id or nil, raised = r and r.error ~= nil or nil, timings = timings })
  return r, err, ecode, detail
end

--- Run code in the session's sandbox.
--
-- At most once: once the execute may have reached the kernel, the cell is
-- never sent again; a later failure (reading or listing outputs) is reported
-- in the result (`files_error`), and a run is retried (once, on a resolved
-- sandbox) only when its execute was refused before it was accepted.
-- @tparam string code
-- @tparam[opt] table opts `files` (`{ [name] = content }` or `{ {name=, content=}, ... }`,
--   written to /home/user/NAME; names with a directory part are refused), `language`
--   ("python"), `timeout` (seconds, default `exec_timeout`; the cell is interrupted then),
--   `on_stdout(text)`, `on_stderr(text)`, `on_result(result)`
-- @treturn[1] table `{ stdout, stderr, error = {name, value, traceback} | nil, results,
--   text (the main result's text, or nil), files = { {name, content, mime} }, reused, resumed,
--   sandbox_id, execution_count, turn (the session's successful runs, see s:checkpoint),
--   truncated (a cap dropped output or files), dropped_files = { {name, size} } | nil,
--   files_error = { msg, code } | nil, undecoded = { raw lines } | nil, replaced (characters
--   decoded as U+FFFD), lock_error = { msg, code } | nil, lock_lost = true | nil (the lock was lost
--   while the cell ran), sandbox_lost = id | nil (the conversation's sandbox was gone: this run
--   started over), unlock_error = { msg, code } | nil }`
-- @return[2] nil
-- @treturn[2] string message
-- @treturn[2] string code: "BUSY", "LOCK", "POLICY", "BAD_REQUEST", "TIMEOUT", "SANDBOX_GONE",
--   "STREAM_BROKEN", "NOT_FOUND", "AUTH", "RATE_LIMITED", "TRANSPORT", "HTTP", ...
-- @treturn[2] table|nil detail (`status`, `started` for TIMEOUT, `partial`, `unlock_error`)
function Session:run(code, opts)
  if getmetatable(self) ~= Session then error("bad self to 'run' (warmbox.Session expected)", 2) end
  if type(code) ~= "string" then error("bad argument #1 to 'run' (string expected, got " .. type(code) .. ")", 2) end
  opts = util.copy(check_options(opts, RUN_OPTS, "run", 2))
  if opts.timeout ~= nil and not (is_positive_number(opts.timeout) and opts.timeout <= self.max_run_length) then
    bad_option(2, "run", "timeout", "positive number of seconds up to max_run_length expected, got "
      .. tostring(opts.timeout))
  end
  local files, ferr = normalize_files(opts.files)
  if not files then return nil, ferr, "BAD_REQUEST" end
  -- A run allowed to take longer than exec_timeout keeps its lock long enough.
  local run_timeout = opts.timeout or self.exec_timeout
  -- (an automatic checkpoint of the last run, if one is being taken, first)
  if self.policy.checkpoint then checkpoints().settle(self) end
  if self.policy.budget then
    local action, reason = require("warmbox.session.budget").check(self, "run")
    if action == "refuse" then return nil, "budget: " .. tostring(reason), "BUDGET" end
  end
  local tm = metrics.timer()
  local r, err, ecode, detail, unlock_error = self:_with_lock(function(lk)
    metrics.phase(tm, "lock_wait")
    tm.locked = true
    self:_event("lock_wait", { waited = tm.lock_wait })
    if run_timeout > self.exec_timeout and type(lk.expire) == "function" then
      lk:expire(math.ceil(run_timeout) + 120)
    end
    local prev_tm = self._tm
    self._tm = tm -- (the run's, while it holds the session's lock)
    local _ <close> = setmetatable({}, { __close = function() self._tm = prev_tm end })
    return execute.run_locked(self, lk, code, opts, files)
  end)
  -- A failed unlock is reported with the run (the lock retries it itself).
  if unlock_error then detail = attach(r, detail, "unlock_error", unlock_error) end
  if r and self.policy.checkpoint then checkpoints().after_run(self, r, r.turn) end
  if r and self.policy.budget then require("warmbox.session.budget").after_run(self, r) end
  return self:_ended(tm, r, err, ecode, detail)
end

-- ------------------------------------------------------------------
-- Prewarm: get the sandbox ready before the run comes
-- ------------------------------------------------------------------

local PREWARM_OPTS = { within = "number", just_in_time = "boolean" }

--- Get the session's sandbox ready for a run that is coming, in the
-- background: returns at once with the task doing it.
--
-- Under the session's lock (taken only when free: a run or prewarm holding it
-- is already getting the sandbox ready), it does nothing when the remembered
-- lease covers `within` seconds (no request), resumes a paused sandbox
-- (connect with the lease), or resolves and creates as a run does, then
-- starts a new kernel and registers the output hook. A run of the same session
-- in this process waits for a prewarm in flight; a second prewarm returns the
-- first's task. Failures never raise: they are an `on_event("prewarm", {ok =
-- false, ...})` and a count (`s:stats().prewarm_failed`), and the run does the
-- work as it would have. Inside a task the work starts at the next round;
-- outside tasks it is started on the engine now and goes on at the next call
-- into warmbox (a run of the session finishes it first).
-- With `just_in_time` and `within`, the work waits until `decide.JIT_LEAD`
-- (2 s) before `within` ends, so the sandbox does not run through the time
-- the run is not coming yet (the model's thinking); a run that comes first
-- cancels it (`s:stats().prewarm_cancelled`) and does the work itself.
-- @tparam[opt] table opts `within` (seconds until the run may come, default `exec_timeout`),
--   `just_in_time` (false)
-- @treturn warmbox.Task its result: `{ action = "warm"|"busy"|"resumed"|"extended"|"created",
--   sandbox_id, resumed, reused }` | nil, msg, code
function Session:prewarm(opts)
  if getmetatable(self) ~= Session then error("bad self to 'prewarm' (warmbox.Session expected)", 2) end
  opts = check_options(opts, PREWARM_OPTS, "prewarm", 1)
  local within = opts.within
  if within ~= nil and not (is_positive_number(within) and within <= self.max_run_length) then
    bad_option(1, "prewarm", "within", "positive number of seconds up to max_run_length expected, got "
      .. tostring(within))
  end
  if self.policy.budget then
    local action, reason = require("warmbox.session.budget").check(self, "prewarm")
    if action == "refuse" then return nil, "budget: " .. tostring(reason), "BUDGET" end
  end
  return prewarm.start(self, within or self.exec_timeout, opts.just_in_time and within ~= nil)
end

--- The counters of `s:prewarm` and of runs (a copy; runs: see warmbox.metrics): `prewarms` (started), `prewarm_ready`
-- (made ready: resumed, extended or created), `prewarm_warm` (nothing to do),
-- `prewarm_busy` (skipped: the session was locked), `prewarm_failed`,
-- `prewarm_waits` (runs that waited for a prewarm in flight), `prewarm_cancelled` (just-in-time
-- prewarms a run overtook). Sessions of one
-- `warmbox` object share them (`wb:stats()`).
function Session:stats()
  return metrics.stats(self.counters, prewarm.PREWARM_COUNTERS)
end

--- Runs `fn(lk)` holding the session's lock: the one place a session takes,
-- releases and closes its lock (also when `fn` raises) and maps a lock
-- failure to BUSY / LOCK.
-- @treturn what `fn` returns (up to four values), then `{ msg, code }` when
-- the unlock failed | nil, msg, "BUSY" | "LOCK"
-- With `try` (a prewarm): the lock is taken only when it is free and nobody
-- waits for it (`nil, "busy", "BUSY"` otherwise); else a prewarm of the same
-- session in flight in this process is waited for first (see warmbox.session.prewarm).
function Session:_with_lock(fn, try)
  if not try then prewarm.await(self) end
  local lk = self.new_lock()
  local guard <close> = locks().closing(lk) -- luacheck: ignore 211 (closed at scope exit)
  local lerr
  if try and lk.try_lock then
    local got
    got, lerr = lk:try_lock(self.tag_value)
    if not got and lerr == "busy" then return nil, "busy", "BUSY" end
  else
    local _
    _, lerr = lk:lock(self.tag_value)
  end
  if lerr then return locks().failure("session '" .. self.key .. "'", lerr) end
  local held = self._held
  self._held = lk
  local ok, r, err, ecode, detail = xpcall(fn, traceback, lk)
  self._held = held
  local uok, uerr, ucode = lk:unlock()
  if not ok then error(r, 0) end
  return r, err, ecode, detail, uok == nil and { tostring(uerr), ucode } or nil
end

--- Forget what this process and every process sharing the lock remember
-- about the session (the next run resolves again). Takes the lock.
-- @treturn[1] true
-- @return[2] nil, message, "BUSY" | "LOCK"
function Session:forget()
  local ok, err, code = self:_with_lock(function(lk)
    memo.clear(lk)
    return true
  end)
  return ok, err, code
end

--- What the session remembers (a copy without the access token); takes the lock.
function Session:state()
  local copy, err, code = self:_with_lock(function(lk) return memo.read(lk) end)
  if copy then copy.access_token = nil end
  return copy, err, code
end

-- ------------------------------------------------------------------
-- Checkpoints: see warmbox.session.checkpoint and README, "Checkpoints"
-- ------------------------------------------------------------------

--- Snapshots the conversation's sandbox as its last run left it (under the lock:
-- a run in progress finishes first).
-- @tparam[opt] table opts `label` (1..40 of a-z, 0-9, '-')
-- @treturn[1] table `{ id, turn, label, created_at, sandbox_id, name }`
-- @return[2] nil, msg, code ("NOT_FOUND": no sandbox yet), detail
function Session:checkpoint(opts) return checkpoints().checkpoint(self, opts) end
--- This conversation's checkpoints, oldest first, as E2B lists them.
function Session:checkpoints()
  if self.policy.checkpoint then checkpoints().settle(self) end
  return checkpoints().checkpoints(self)
end
--- A new session for `new_key` whose sandbox starts from `cp` (opts: `env`, `actor`;
-- made with this module's `new`, given to warmbox.session.checkpoint).
function Session:branch(cp, new_key, opts) return checkpoints().branch(self, cp, new_key, opts, _M.new) end
--- The conversation goes back to `cp`: a sandbox from it replaces its own.
function Session:rewind(cp) return checkpoints().rewind(self, cp) end
--- What this conversation cost (`warmbox.ledger`'s row: its sandboxes of every fingerprint, rewinds
-- included; `usd_with_branches` adds its branches).
function Session:cost(opts) return require("warmbox.ledger").session_cost(self, opts) end
--- Waits for the automatic checkpoint of the last run, if one is being taken.
function Session:await_checkpoint() return checkpoints().settle(self) end

return _M
