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
-- the lock shares that memory (see `decode_state`).
-- @module warmbox.session

local json = require "warmbox.json"
local policy_mod = require "warmbox.policy"
local util = require "warmbox.util"
local state_codec = require "warmbox.state"
local tag_mod = require "warmbox.tag"
local outputs = require "warmbox.outputs"
local errors = require "warmbox.errors"
local metrics = require "warmbox.metrics"
local mono_now = require("warmbox.core").now

local type, pairs, ipairs, tostring, error, setmetatable, next =
  type, pairs, ipairs, tostring, error, setmetatable, next
local xpcall, traceback, string_format, table_concat, table_sort =
  xpcall, debug.traceback, string.format, table.concat, table.sort
local getmetatable = getmetatable
local os_time = os.time

local _M = {}

local check_options, bad_option = errors.check_options, errors.bad_option

local HOME, OUTPUT_DIR = outputs.HOME, outputs.OUTPUT_DIR
_M.HOME, _M.OUTPUT_DIR = HOME, OUTPUT_DIR
_M.OUTPUTS_MIME, _M.INLINE_LIMIT, _M.INLINE_TOTAL = outputs.OUTPUTS_MIME, outputs.INLINE_LIMIT, outputs.INLINE_TOTAL
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

-- ------------------------------------------------------------------
-- Re-exported from the modules this one was cut from (warmbox.util,
-- warmbox.tag, warmbox.state, warmbox.outputs), so `warmbox.session`'s
-- documented names keep working.
-- ------------------------------------------------------------------

_M.b64_encode, _M.b64_decode = util.b64_encode, util.b64_decode
_M.encode_key, _M.MAX_ENCODED_KEY = tag_mod.encode_key, tag_mod.MAX_ENCODED_KEY
_M.tag_value, _M.parse_tag, _M.tag_matches_key = tag_mod.tag_value, tag_mod.parse_tag, tag_mod.tag_matches_key
_M.decode_state = state_codec.decode
_M.encode_state = state_codec.encode
_M.prelude_for, _M.PRELUDE = outputs.prelude_for, outputs.PRELUDE
_M.mime_of, _M.check_file_name = outputs.mime_of, outputs.check_file_name
_M.outputs_of, _M.LIST_CMD = outputs.outputs_of, outputs.LIST_CMD

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
function _M.check_settings(o, fname, argn, level)
  level = (level or 2) + 2
  local function bad(k, want)
    bad_option(argn, fname, k, want .. " expected, got " .. tostring(o[k]), level)
  end
  local mrl = o.max_run_length
  if mrl ~= nil and not (is_positive_number(mrl) and mrl <= _M.MAX_RUN_LENGTH_LIMIT) then
    bad("max_run_length", "seconds in (0, " .. _M.MAX_RUN_LENGTH_LIMIT .. "]")
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
  parallel = "function", require_memory = "boolean", runner = "function", counters = "table" }

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
local function checkpoints() return require "warmbox.checkpoint" end

--- The lock options a session's lock gets unless given: it waits long enough
-- for a run of the same session to finish; a dead holder's lock expires
-- (Redis) or is released by the kernel (file).
function _M.lock_defaults(exec_timeout)
  return { timeout = exec_timeout + 60, exptime = exec_timeout + 120 }
end

-- Whether `new`'s policy option is a complete policy (a table with a name
-- and every hook), used as it is rather than resolved by warmbox.policy.
local function complete_policy(policy)
  return type(policy) == "table" and policy.name and policy.order and policy.lease
    and policy.should_refresh and policy.create_params and policy.gc and true or false
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
--   new one is secured), `runner` (function returning the runner `s:prewarm` spawns its
--   task on: `spawn`, `current`, `join`, `step`, and optionally `kick`), `counters` (the
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
    new_opts = opts, -- what s:branch makes its session with (warmbox.checkpoint)
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
    -- runner(): the runner prewarms are spawned on (warmbox.new gives wb's);
    -- nil: the running runner, else one of this module's.
    get_runner = opts.runner,
    -- Counted events (prewarms); warmbox.new shares one table across its sessions.
    counters = opts.counters or {},
  }
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
  if lk then lk:set_state(_M.encode_state(st)) end
end

-- The context every hook gets.
function Session:_ctx(st, run_timeout)
  return {
    key = self.key, tag = self.tag, tag_value = self.tag_value, template = self.template,
    env = self.env, actor = self.actor, now = self.clock(),
    exec_timeout = self.exec_timeout, idle_timeout = self.idle_timeout,
    run_timeout = run_timeout or self.exec_timeout, margin = _M.LEASE_MARGIN,
    lease_end = st and st.lease_end, sandbox_id = st and st.sandbox_id,
  }
end

-- The error for a policy hook that returned what it must not (`shown`: the
-- value or its type, as the message gives it). → nil, msg, "POLICY"
local function bad_hook(self, hook, shown, want)
  return nil, string_format("policy '%s' hook '%s' returned %s (%s expected)", tostring(self.policy.name), hook,
    shown, want), "POLICY"
end

function Session:_lease(ctx)
  local lease, err, code = policy_mod.call(self.policy, "lease", ctx)
  if code then return nil, err, code end
  if not is_positive_number(lease) then return bad_hook(self, "lease", tostring(lease), "positive number") end
  return math.ceil(lease)
end

-- Remembers the secured sandbox. `run_started` is when its current run began
-- (nil: unchanged for the same sandbox, unknown for another); E2B caps every
-- lease at run start + the maximum run length, so the remembered lease is too.
function Session:_remember(st, sb, lease_end, run_started)
  st.tag, st.origin = self.tag_value, self.origin
  if st.sandbox_id ~= sb.sandbox_id then
    st.hooked, st.run_started, st.auto_resume = nil, nil, nil
  end
  st.sandbox_id = sb.sandbox_id
  if sb.envd_access_token then st.access_token = sb.envd_access_token end
  if sb.domain and sb.domain ~= json.null then st.domain = sb.domain end
  if run_started then st.run_started = run_started end
  if st.run_started then lease_end = math.min(lease_end, st.run_started + self.max_run_length) end
  st.lease_end = lease_end
end

-- Unix seconds of an RFC 3339 time (the listed `started_at`).
local parse_utc = util.parse_time

-- Forgets the remembered sandbox; the creates in flight stay recorded (their
-- orphans are recognised later, see `create_sandbox`).
local function forget(st)
  local creating, turns = st.creating, st.turns
  for k in pairs(st) do st[k] = nil end
  st.creating, st.turns = creating, turns
end

-- Whether a failed control-plane call says the sandbox is definitively gone
-- (as opposed to a transient fault: 5xx, 429, a timeout or a transport error,
-- which fail the run and leave the sandbox and its kernel alone).
local function is_gone(code)
  return code == "NOT_FOUND"
end
_M.is_gone = is_gone

-- Whether a listed sandbox is known to have lost its memory: the remembered
-- state says so (GC demoted it: `memory_lost`), or it was paused within
-- seconds of its resume, as only a demote (connect + pause without memory) does.
local function memory_lost(it, avoid)
  if avoid[it.sandbox_id] then return true end
  return state_codec.looks_demoted(it)
end

-- The session's listed sandboxes (running or paused) that pass the exact
-- re-check of the tag. → cands, by_id | nil, msg, code
local function list_candidates(self)
  local tv, tag = self.tag_value, self.tag
  local items, err, code = self.client:list_all{ state = { "running", "paused" }, metadata = { [tag] = tv } }
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
local function order_candidates(self, st, cands, by_id)
  local copy = {}
  for i, c in ipairs(cands) do copy[i] = c end
  local o, perr, pcode = policy_mod.call(self.policy, "order", copy, self:_ctx(st))
  if pcode then return nil, perr, pcode end
  if type(o) ~= "table" then return bad_hook(self, "order", type(o), "table") end
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

-- Tries the ordered candidates (connect + set_timeout) until one is secured;
-- the gone ones are marked in `gone`. → kept sandbox, resumed | nil, false
-- (none) | false, msg, code, detail (a failure that fails the run)
local function secure_candidate(self, st, ordered, lease, avoid, gone)
  local client = self.client
  for _, it in ipairs(ordered) do
    if self.require_memory and memory_lost(it, avoid) then
      -- Not usable for a session that needs its kernel's memory; killed below
      -- once another sandbox is secured.
      self:_event("memory_lost", { sandbox_id = it.sandbox_id })
      goto continue
    end
    do
      local t0 = self.clock()
      local sb, res, ccode, cdetail = client:connect(it.sandbox_id, { timeout = lease })
      self:_event("connect", { sandbox_id = it.sandbox_id, ok = sb ~= nil, resumed = sb and res or nil,
        code = not sb and ccode or nil })
      if not sb then
        if not is_gone(ccode) then return false, res, ccode, cdetail end
        gone[it.sandbox_id] = true
      else
        local ok, terr, tcode, tdetail = client:set_timeout(it.sandbox_id, lease)
        if ok then
          if sb.sandbox_id == nil then sb.sandbox_id = it.sandbox_id end
          local resumed = res == true
          self:_remember(st, sb, t0 + lease, resumed and t0 or parse_utc(it.started_at))
          local lc = it.lifecycle
          st.auto_resume = type(lc) == "table" and lc.auto_resume == true and lc.on_timeout == "pause" or nil
          return sb, resumed
        end
        if not is_gone(tcode) then
          -- Its lease could not be set: it is not used for this run (it might
          -- pause underneath it), and it is left alone: the next run tries again.
          self:_event("lease_failed", { sandbox_id = it.sandbox_id, code = tcode })
          return false, terr, tcode, tdetail
        end
        gone[it.sandbox_id] = true
      end
    end
    ::continue::
  end
  return nil, false
end

-- Creates in flight (issue 26): each create carries a fresh id in its
-- metadata (`CREATE_TAG`), recorded in the remembered state before the create
-- is sent and dropped once its answer came. A listed sandbox whose id is still
-- recorded is an orphan (its create was given up: a timeout, a crash, a
-- cancelled task): never preferred to another, collected once a sandbox is secured.
_M.CREATE_TAG = tag_mod.CREATE_TAG
--- How many creates in flight are remembered, and for how long (seconds of the session clock).
_M.CREATES_KEPT, _M.CREATE_WINDOW = 8, 300
local REFUSED_CREATE = { BAD_REQUEST = true, AUTH = true, RATE_LIMITED = true, POLICY = true, FORBIDDEN = true }

local new_id = util.unique_id

-- The recorded creates younger than CREATE_WINDOW (a create given up longer
-- ago has long made its sandbox or failed).
local function recent_creates(st, now)
  local list = {}
  for _, c in ipairs(st.creating or {}) do
    if type(c) == "table" and type(c.at) == "number" and now - c.at < _M.CREATE_WINDOW then list[#list + 1] = c end
  end
  return list
end

local function record_create(self, st)
  local id, now = new_id(), self.clock()
  local list = recent_creates(st, now)
  list[#list + 1] = { id = id, at = now }
  st.tag, st.origin = self.tag_value, self.origin
  while #list > _M.CREATES_KEPT do table.remove(list, 1) end
  st.creating = list
  self:_save(st)
  return id
end

local function settle_create(st, id)
  local list = st.creating
  if not list then return end
  for i = #list, 1, -1 do
    if type(list[i]) ~= "table" or list[i].id == id then table.remove(list, i) end
  end
  if #list == 0 then st.creating = nil end
end

-- The create id of a listed sandbox whose create is still recorded (an orphan), else nil.
local function orphan_of(st, it)
  local id = type(it.metadata) == "table" and it.metadata[_M.CREATE_TAG]
  if type(id) ~= "string" then return nil end
  for _, c in ipairs(st.creating or {}) do
    if type(c) == "table" and c.id == id then return id end
  end
  return nil
end

-- Creates the session's sandbox with the policy's `create_params` (the tag
-- and a lease at least `lease` imposed). → sb | nil, msg, code, detail
local function create_sandbox(self, st, lease, from)
  local ctx = self:_ctx(st)
  ctx.lease = lease
  local p, perr, pcode = policy_mod.call(self.policy, "create_params", ctx)
  if pcode then return nil, perr, pcode end
  if type(p) ~= "table" then return bad_hook(self, "create_params", type(p), "table") end
  local params = {}
  for k, v in pairs(p) do params[k] = v end
  params.template = from or params.template or self.template
  if params.timeout ~= nil and not is_positive_number(params.timeout) then
    return nil, string_format("policy '%s' hook 'create_params' returned timeout %s (positive number expected)",
      tostring(self.policy.name), tostring(params.timeout)), "POLICY"
  end
  -- Never shorter than the lease: the first run must not be paused underneath itself.
  params.timeout = math.max(params.timeout or lease, lease)
  params.lifecycle = params.lifecycle or { on_timeout = "pause", auto_resume = true }
  local md = {}
  for k, v in pairs(params.metadata or {}) do md[k] = v end
  md[self.tag] = self.tag_value -- the tag is not negotiable: it is what keeps tenants apart
  params.metadata = md
  if next(self.env) and params.env_vars == nil then params.env_vars = self.env end
  local nonce = record_create(self, st)
  md[_M.CREATE_TAG] = nonce
  local t0 = self.clock()
  local sb, cerr, ccode, cdetail = self.client:create(params)
  if not sb then
    -- An answer of the API itself that refused the create: nothing was made.
    if REFUSED_CREATE[ccode] or type(cdetail) ~= "table" then settle_create(st, nonce) end
    self:_save(st)
    return nil, cerr, ccode, cdetail
  end
  settle_create(st, nonce)
  self:_event("create", { sandbox_id = sb.sandbox_id })
  self:_remember(st, sb, t0 + params.timeout, t0)
  local lc = params.lifecycle
  st.auto_resume = type(lc) == "table" and lc.auto_resume == true and lc.on_timeout == "pause" or nil
  return sb
end

-- A sandbox created from a snapshot (`from`: its id) for warmbox.checkpoint.
function Session:_create_from(st, lease, from) return create_sandbox(self, st, lease, from) end

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

-- After a run: the orphans of the creates still recorded (listed by tag) are
-- killed, their records dropped. One list, only while a create is recorded.
function Session:_collect_orphans(st)
  local cands = list_candidates(self)
  if not cands then return end
  for _, it in ipairs(cands) do
    local orphan = orphan_of(st, it)
    if orphan then
      if it.sandbox_id ~= st.sandbox_id and self.client:kill(it.sandbox_id) ~= nil then
        self:_event("kill", { sandbox_id = it.sandbox_id, reason = "orphan" })
      end
      settle_create(st, orphan)
    end
  end
  local left = recent_creates(st, self.clock())
  st.creating = #left > 0 and left or nil
end

-- Finds or creates the session's sandbox and secures its lease (the reference
-- flow: list, exact re-check, connect + set_timeout per candidate in policy
-- order, reap the others only after one is secured, else create). Only a
-- candidate that is gone (404) is passed over; any other failure fails the
-- run and touches nothing, so a transient fault never destroys state.
function Session:_resolve(st, lease, avoid)
  avoid = avoid or {}
  local cands, by_id, code = list_candidates(self)
  if not cands then return nil, by_id, code end
  local ordered = cands
  if #cands > 0 then
    local perr, pcode
    ordered, perr, pcode = order_candidates(self, st, cands, by_id)
    if not ordered then return nil, perr, pcode end
    ordered = orphans_last(st, ordered)
  end
  local gone = {}
  local kept, resumed, ccode, cdetail = secure_candidate(self, st, ordered, lease, avoid, gone)
  if kept == false then return nil, resumed, ccode, cdetail end -- resumed: the failure's message
  local created = false
  if not kept then
    local cerr
    kept, cerr, ccode, cdetail = create_sandbox(self, st, lease)
    if not kept then return nil, cerr, ccode, cdetail end
    created = true
  end
  -- Reap duplicates only now that one sandbox is secured (the gone ones need nothing).
  for _, it in ipairs(cands) do
    local orphan = orphan_of(st, it)
    if it.sandbox_id ~= kept.sandbox_id and not gone[it.sandbox_id] then
      self.client:kill(it.sandbox_id)
      self:_event("kill", { sandbox_id = it.sandbox_id, reason = orphan and "orphan" or "duplicate" })
    end
    if orphan then settle_create(st, orphan) end
  end
  return { sandbox_id = kept.sandbox_id, reused = not created, resumed = resumed, how = created and "create"
    or "resolve" }
end

-- Once per session object: idle_timeout cannot take effect, as a run's lease
-- covers the run's timeout and LEASE_MARGIN (the sandbox pauses `lease` s
-- after the run starts, not idle_timeout s). Event "lease_floor".
function Session:_warn_floor(run_timeout, lease)
  if self.floor_warned or self.idle_timeout >= run_timeout then return end
  self.floor_warned = true
  self:_event("lease_floor", { idle_timeout = self.idle_timeout, run_timeout = run_timeout, lease = lease,
    margin = _M.LEASE_MARGIN })
end

-- Secures a sandbox for one run: the remembered one when its lease provably
-- covers the run (no request), the remembered one refreshed by `connect` (one
-- request: resumes a paused one and extends the lease), else resolve.
-- `eager` (a prewarm): the sandbox is made ready now, never left to the
-- execute (no alongside extension, no auto-resume by traffic).
function Session:_acquire(st, run_timeout, eager)
  local ctx = self:_ctx(st, run_timeout)
  local lease, err, code = self:_lease(ctx)
  if not lease then return nil, err, code end
  -- A run allowed to take as long as the lease, or longer, must not be paused
  -- underneath itself: the lease starts a round trip before the cell does, and
  -- the server interrupts the cell at its timeout, so the lease covers the run
  -- and LEASE_MARGIN more.
  if run_timeout + _M.LEASE_MARGIN > lease then
    lease = math.ceil(run_timeout + _M.LEASE_MARGIN)
    self:_warn_floor(run_timeout, lease)
  end
  ctx.lease = lease
  self:_event("lease", { lease = lease, run_timeout = run_timeout })
  local got, gerr, gcode, gdetail = self:_secure(st, ctx, lease, eager)
  if not got then return nil, gerr, gcode, gdetail end
  -- E2B ends a run at its start + the maximum run length, whatever the lease
  -- says: a run that could cross that line would be paused underneath itself.
  -- Pausing (memory kept) and connecting starts a new run of the same kernel.
  if st.run_started and st.run_started + self.max_run_length < self.clock() + run_timeout + _M.LEASE_MARGIN then
    local ok, perr, pcode, pdetail = self.client:pause(got.sandbox_id)
    if ok == nil and pcode ~= "NOT_FOUND" then return nil, perr, pcode, pdetail end
    local t0 = self.clock()
    local sb, res, ccode, cdetail = self.client:connect(got.sandbox_id, { timeout = lease })
    self:_event("recycle", { sandbox_id = got.sandbox_id, ok = sb ~= nil })
    if not sb then
      -- Paused (memory kept): the next run's connect resumes it, unless it is gone.
      if is_gone(ccode) then forget(st) else st.lease_end = nil end
      return nil, res, ccode, cdetail
    end
    if sb.sandbox_id == nil then sb.sandbox_id = got.sandbox_id end
    self:_remember(st, sb, t0 + lease, t0)
    got.how = "recycle" -- resumed and leased by that connect
  end
  return got
end

-- The remembered sandbox (same tag value) for one run: as it is when
-- `should_refresh` says so, extended alongside the execute, or refreshed by
-- `connect`; gone: forgotten and resolved again (see _secure).
local function secure_remembered(self, st, ctx, lease, eager)
  local refresh, perr, pcode = policy_mod.call(self.policy, "should_refresh", ctx)
  if pcode then return nil, perr, pcode end
  if not refresh then
    return { sandbox_id = st.sandbox_id, reused = true, resumed = false, how = "remembered" }
  end
  -- The remembered lease still has a safe margin: extend it alongside the
  -- execute (one round trip). Paused (its lease ended) with autoResume: the
  -- execute resumes it, and when the lease that gives cannot cover the run
  -- the extension follows alongside. See _execute_alongside. Both need
  -- `parallel` (warmbox.new gives it; without it: connect first).
  -- A prewarm (`eager`) connects now instead: the sandbox is made ready before the run.
  local now = self.clock()
  local deferred = self.parallel and not eager
  if deferred and st.lease_end and st.lease_end - now >= _M.ALONGSIDE_MARGIN then
    return { sandbox_id = st.sandbox_id, reused = true, resumed = false, how = "alongside", lease = lease }
  end
  if deferred and st.auto_resume and st.lease_end and st.lease_end + _M.PAUSE_GRACE <= now then
    local how = ctx.run_timeout + _M.LEASE_MARGIN <= _M.AUTO_RESUME_LEASE and "auto_resume"
      or "auto_resume_alongside"
    return { sandbox_id = st.sandbox_id, reused = true, resumed = true, how = how, lease = lease }
  end
  local t0 = self.clock()
  local sb, res, ccode, cdetail = self.client:connect(st.sandbox_id, { timeout = lease })
  self:_event("connect", { sandbox_id = st.sandbox_id, ok = sb ~= nil, resumed = sb and res or nil,
    code = not sb and ccode or nil })
  if sb then
    if sb.sandbox_id == nil then sb.sandbox_id = st.sandbox_id end
    self:_remember(st, sb, t0 + lease, res == true and t0 or nil)
    return { sandbox_id = st.sandbox_id, reused = true, resumed = res == true, how = "refresh" }
  end
  -- A transient fault fails the run and keeps what is remembered (the next
  -- run tries again); only a sandbox that is gone is forgotten.
  if not is_gone(ccode) then return nil, res, ccode, cdetail end
  forget(st)
  return self:_resolve(st, lease)
end

-- The three ways to a sandbox for one run (see _acquire).
function Session:_secure(st, ctx, lease, eager)
  if self.require_memory and st.sandbox_id and st.memory_lost == st.sandbox_id then
    -- GC demoted it (paused without memory): replace it (see _resolve).
    local stale = st.sandbox_id
    forget(st)
    return self:_resolve(st, lease, { [stale] = true })
  end
  if st.sandbox_id and st.tag == self.tag_value then
    return secure_remembered(self, st, ctx, lease, eager)
  elseif st.sandbox_id then
    forget(st)
  end
  return self:_resolve(st, lease)
end

local function concat_chunks(t)
  if type(t) == "string" then return t end
  if type(t) ~= "table" then return "" end
  return table_concat(t)
end

local outputs_of, collect_envd, files_from_report = outputs.outputs_of, outputs.collect_envd, outputs.files_from_report

-- The answers with no stream byte after which the session asks the sandbox
-- whether the cell arrived (the statuses a sandbox, its proxy or E2B's edge
-- give for "not accepted"; an intermediary may give them after forwarding).
local ASK_AFTER = { SANDBOX_GONE = true, NOT_FOUND = true, RATE_LIMITED = true, [503] = true }

-- Whether a failed execute was answered without a stream byte by a status
-- after which the sandbox is asked (see `_never_arrived`).
local function unanswered(code, detail)
  if type(detail) == "table" and detail.started then return false end
  return ASK_AFTER[code] or (type(detail) == "table" and ASK_AFTER[detail.status]) or false
end

-- Whether sandbox `id` exists (running or paused) as the control plane says:
-- false only on its 404 (a transient failure is no proof of anything).
function Session:_exists(id)
  local _, _, code = self.client:info(id)
  return code ~= "NOT_FOUND"
end

-- Whether a failed execute provably never reached a kernel, so the run may be
-- sent again (at most once): "again" (same sandbox) when nothing of it left
-- (a connection refused before anything was sent) or when its kernel never
-- accepted the cell and now never will (the session gave the cell's id up
-- first, see `outputs.cell_marked`); "gone" when its sandbox no longer exists
-- (control plane: 404); false otherwise (the failure is reported).
function Session:_never_arrived(sbx, id, cell_id, code, detail)
  if type(detail) == "table" and detail.started then return false end
  if code == "TRANSPORT" then return type(detail) == "table" and detail.sent == false and "again" end
  if not unanswered(code, detail) then return false end
  -- A cell of a language without a guard may have run: never sent again
  -- (detail.accepted stays nil: unknown).
  if not cell_id then return false end
  local path = outputs.CELLS_DIR .. "/" .. cell_id
  local claimed = sbx:make_dir(path)
  -- Unreachable over envd too: a sandbox paused without its memory does not
  -- resume on a data-plane call (warmboxd after a restart); resumed, it is asked.
  if claimed == nil and self:_resume_if_paused(id) then claimed = sbx:make_dir(path) end
  if claimed then return "again" end
  if claimed == false then
    if type(detail) == "table" then detail.accepted = true end
    return false
  end
  return not self:_exists(id) and "gone" or false
end

-- Resumes sandbox `id` when the control plane says it is paused: true when it
-- runs again (the retry's connect then sets its lease as usual).
function Session:_resume_if_paused(id)
  local it = self.client:info(id)
  if not (it and it.state == "paused") then return false end
  return self.client:connect(id, { timeout = self.exec_timeout + _M.LEASE_MARGIN }) ~= nil
end

-- The data-plane handle of the remembered sandbox `id`.
function Session:_handle(st, id)
  return self.client:sandbox({ sandbox_id = id, envd_access_token = st.access_token,
    domain = st.domain }, { access_token = st.access_token })
end

-- Registers the python output hook in the kernel of sandbox `id` (starting
-- the kernel when it is new): a cell of its own, idempotent (guarded in the
-- kernel). Returns true | nil, msg, code, detail.
function Session._hook(_, sbx, st, id, run_timeout, on_line)
  local hout, herr, hcode, hdetail = sbx:run_code(outputs.PRELUDE, {
    language = "python", timeout = run_timeout, on_line = on_line,
  })
  if not hout then return nil, herr, hcode, hdetail end
  for _, res in ipairs(hout.results or {}) do
    if outputs_of(res) then st.hooked = id end
  end
  return true
end

-- Before the execute nothing of the cell has run: a sandbox found gone here may be replaced.
-- → nil, msg, code, detail, retryable (as _execute)
local function before(err, ecode, detail)
  return nil, err, ecode, detail, (ecode == "SANDBOX_GONE" or ecode == "NOT_FOUND") and "gone" or false
end

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

-- The files the run left in the output directory: from the output hook's
-- report, else (another language, or a kernel that lost its hooks) listed
-- through envd; what the kernel is known to have hooked is noted in st.
-- → files, files_error ({ msg, code } when only part of them came)
local function output_files(sbx, st, id, report, python, cap)
  local out_files, files_error
  if report then
    st.hooked = id
    local ferr, fcode, partial
    out_files, ferr, fcode, partial = files_from_report(sbx, report, cap)
    if not out_files then out_files, files_error = partial or {}, { ferr, fcode } end
  else
    -- No report: another language, or the kernel lost its hooks (restarted).
    if python then st.hooked = nil end
    local ferr, fcode, partial
    out_files, ferr, fcode, partial = collect_envd(sbx, cap)
    if not out_files then out_files, files_error = partial or {}, { ferr, fcode } end
  end
  return out_files, files_error
end

-- The main result's text (the cell's value), as E2B's SDKs' execution.text.
local function main_text(results)
  for _, res in ipairs(results) do
    if res.is_main_result then return res.text end
  end
  return nil
end

-- The result of a run that ran (see _execute).
local function run_result(out, info, results, out_files, files_error, cap, lock_error)
  local e = out.error
  if e == json.null then e = nil end
  return {
    stdout = concat_chunks(out.stdout), stderr = concat_chunks(out.stderr),
    error = e, results = results, files = out_files, files_error = files_error,
    truncated = (out.truncated or #cap.dropped > 0) or false,
    dropped_files = #cap.dropped > 0 and cap.dropped or nil,
    undecoded = out.undecoded and #out.undecoded > 0 and out.undecoded or nil,
    replaced = out.replaced,
    lock_error = lock_error,
    reused = info.reused, resumed = info.resumed, sandbox_id = info.sandbox_id,
    execution_count = out.execution_count, text = main_text(results),
  }
end

-- Whether the kernel refused a marked cell before anything of it ran:
-- "hooks" (no hooks: the mark failed), "fenced" (a run with a higher fencing
-- number had run there), else nil.
local function refusal(out)
  local e = out.error
  if e == nil and type(out.stderr) == "table" and type(out.stderr[1]) == "string"
    and out.stderr[1]:find("^warmbox: fenced: ") then
    -- bash: the guard refused the cell with status 0 (see outputs.cell_guarded)
    out.error = { name = "RuntimeError", value = (out.stderr[1]:gsub("\n.*", "")) }
    return "fenced"
  end
  if type(e) ~= "table" or type(e.value) ~= "string" then return nil end
  if e.name == "NameError" and e.value:find("__warmbox_cell__", 1, true) then return "hooks" end
  if e.name == "RuntimeError" and e.value:find("^warmbox: fenced: ") then return "fenced" end
  return nil
end

local function fenced_msg(id, why)
  return string_format("run in sandbox '%s' refused: its lock was taken over by a later run (%s)", id,
    tostring(why):gsub("^warmbox: fenced: ", ""))
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

-- Before the cell: inputs uploaded, the output directory ready (not python)
-- or the hooks registered (python). → true | as `before`
function Session:_prepare(sbx, info, st, files, python, run_timeout, on_line)
  if #files > 0 then
    local ok, err, ecode, detail = upload_files(sbx, files)
    if not ok then return before(err, ecode, detail) end
  end
  if not python then
    local ok, err, ecode, detail = ready_output_dir(sbx, info.reused)
    if not ok then return before(err, ecode, detail) end
  elseif st.hooked ~= info.sandbox_id then
    -- A kernel that may not have the output hooks gets them in a cell of their
    -- own, so the user's cell is sent as it is (its tracebacks and line numbers
    -- are the user's). Idempotent (guarded in the kernel), and the user's cell
    -- is not sent yet: a failure here is one before the run.
    local ok, herr, hcode, hdetail = self:_hook(sbx, st, info.sandbox_id, run_timeout, on_line)
    if not ok then return before(herr, hcode, hdetail) end
  end
  return true
end

-- The ways to a sandbox whose lease the execute's side task extends (see _execute_alongside).
local ALONGSIDE = { alongside = true, auto_resume = true, auto_resume_alongside = true }

-- The lease covers the whole run: after the uploads, the output directory and
-- the hooks cell (which took time of the lease set before them), a lease that
-- no longer covers the cell's timeout + COVER_MARGIN is extended (to the
-- timeout + LEASE_MARGIN) before the cell is sent (one request, only then).
-- → true | as `before`
function Session:_cover(st, info, run_timeout)
  if ALONGSIDE[info.how] or not st.lease_end then return true end
  local t0 = self.clock()
  if t0 + run_timeout + _M.COVER_MARGIN <= st.lease_end then return true end
  local want = math.ceil(run_timeout + _M.LEASE_MARGIN)
  local t_lease = mono_now()
  local ok, err, code, detail = self.client:set_timeout(info.sandbox_id, want)
  metrics.add(self._tm, "lease", t_lease)
  self:_event("extend", { sandbox_id = info.sandbox_id, ok = ok == true, code = not ok and code or nil })
  if not ok then return before(err, code, detail) end
  local lease_end = t0 + want
  if st.run_started then lease_end = math.min(lease_end, st.run_started + self.max_run_length) end
  st.lease_end = math.max(st.lease_end, lease_end)
  return true
end

-- Everything before the cell (_prepare, then _cover). Unreachable there: the
-- remembered sandbox wins while it exists (the run is sent to it again, after a
-- connect); only one that is gone is forgotten. → true | as `before`
function Session:_ready(sbx, info, st, files, python, run_timeout, on_line)
  local ok, err, code, detail, retry = self:_prepare(sbx, info, st, files, python, run_timeout, on_line)
  if ok then ok, err, code, detail, retry = self:_cover(st, info, run_timeout) end
  if ok then return true end
  if retry == "gone" then retry = self:_exists(info.sandbox_id) and "again" or "gone" end
  return nil, err, code, detail, retry
end

-- A marked cell the kernel refused before anything of it ran (see `refusal`):
-- the failure (as _execute's), else nil.
local function refused_run(out, info, st)
  local refused = refusal(out)
  if refused == "hooks" then
    -- The kernel lost the hooks (restarted): the cell failed on its first line.
    st.hooked = nil
    return nil, "run in sandbox '" .. info.sandbox_id .. "': its kernel lost warmbox's hooks", "HOOKS_LOST",
      { started = false }, "again"
  elseif refused == "fenced" then
    return nil, fenced_msg(info.sandbox_id, out.error.value), "FENCED", { started = false }, false
  end
  return nil
end

-- The cell as sent, with its id and run's fencing number `fence` (python: when
-- its kernel has the hooks; bash, JS, TS: a guard of their own), and its id:
-- code, id | code, nil (a language without a guard).
local function marked_cell(code, language, hooked, fence)
  local id = new_id()
  if language == "python" then
    if hooked then return outputs.cell_marked(code, id, fence), id end
    return code, nil
  end
  local guarded = outputs.cell_guarded(code, language, id, fence)
  if guarded then return guarded, id end
  return code, nil
end

-- One attempt: upload inputs, run, collect outputs. Returns r, or nil, msg,
-- code, detail, retryable ("again" | "gone" only when the cell cannot have run, see
-- _never_arrived).
-- The run's output files (see output_files), timed, and the "outputs" event.
function Session:_outputs(sbx, st, id, report, python, cap)
  local t_out = mono_now()
  local out_files, files_error = output_files(sbx, st, id, report, python, cap)
  metrics.add(self._tm, "outputs", t_out)
  self:_event("outputs", { sandbox_id = id, files = #out_files, code = files_error and files_error[2] or nil })
  return out_files, files_error
end

function Session:_execute(info, st, code, opts, files, run_timeout, lk)
  local sbx = self:_handle(st, info.sandbox_id)
  local language = opts.language or "python"
  local python = language == "python"
  local report
  local user_on_result = opts.on_result
  local lock_error
  local keepalive = lk and lk.keepalive
  local function on_line()
    local ok, kerr, kcode = keepalive(lk)
    if not ok and not lock_error then lock_error = { tostring(kerr), kcode } end
  end
  do
    local ok, perr, pcode, pdetail, pretry = self:_ready(sbx, info, st, files, python, run_timeout,
      keepalive and on_line or nil)
    if not ok then return nil, perr, pcode, pdetail, pretry end
  end
  local cell_id
  local fence = lk and type(lk.fence) == "function" and lk:fence() or nil
  code, cell_id = marked_cell(code, language, st.hooked == info.sandbox_id, fence)
  local t_exec = mono_now()
  local out, err, ecode, detail = sbx:run_code(code, {
    language = language, timeout = run_timeout, max_output = self.max_output,
    on_stdout = opts.on_stdout, on_stderr = opts.on_stderr,
    is_private = function(res) return outputs_of(res) ~= nil end,
    on_result = function(res)
      local rep = outputs_of(res)
      if rep then report = rep return end
      if user_on_result then return user_on_result(res) end
    end,
    -- Every stream event (keepalives included) keeps the session's lock alive.
    on_line = keepalive and on_line or nil,
  })
  metrics.add(self._tm, "execute", t_exec)
  if not out then
    if detail and lock_error then detail.lock_error = lock_error end
    return nil, err, ecode, detail, self:_never_arrived(sbx, info.sandbox_id, cell_id, ecode, detail)
  end
  if cell_id then
    local _, rerr, rcode, rdetail, rretry = refused_run(out, info, st)
    if rcode then return nil, rerr, rcode, rdetail, rretry end
  end
  -- The cell ran: whatever fails from here on is reported in the result, never re-run.
  local results = {}
  for _, res in ipairs(out.results or {}) do
    local rep = outputs_of(res)
    if rep then report = report or rep else results[#results + 1] = res end
  end
  local cap = { left = self.max_files_bytes, dropped = {} }
  local out_files, files_error = self:_outputs(sbx, st, info.sandbox_id, report, python, cap)
  if fence and read_over_envd(report) then
    local ok, ferr, fcode = fence_holds(sbx, info.sandbox_id, fence)
    if not ok then
      if fcode == "FENCED" then return nil, ferr, fcode, { started = true, fenced = true }, false end
      out_files, files_error = {}, { ferr, fcode }
    end
  end
  return run_result(out, info, results, out_files, files_error, cap, lock_error)
end

-- Issue 11: the execute and the lease extension (connect) at once, on the
-- engine. A failed extension is retried while the cell runs; when it cannot
-- be secured before the lease ends (minus LEASE_MARGIN), the execute is
-- interrupted (its connection closed: the server stops the cell) and the run
-- is reported, so the sandbox is never paused underneath it.
-- info.how: "alongside" (the remembered lease still has ALONGSIDE_MARGIN),
-- "auto_resume" (paused; the execute resumes it and the lease that gives
-- covers the run: no extension), "auto_resume_alongside" (paused; the run
-- may outlast that lease: a cell still running ALONGSIDE_MARGIN before its
-- end gets the extension then, under the same rules).
function Session:_execute_alongside(info, st, code, opts, files, run_timeout, lk)
  local id, lease, how = info.sandbox_id, info.lease, info.how
  local t_exec = self.clock()
  local main = function() return self:_execute(info, st, code, opts, files, run_timeout, lk) end
  if how == "auto_resume" then
    local r, err, ecode, detail, retryable = main()
    if r then
      st.run_started = t_exec
      st.lease_end = math.min(t_exec + _M.AUTO_RESUME_LEASE, t_exec + self.max_run_length)
    end
    return r, err, ecode, detail, retryable
  end
  local lease_end = how == "alongside" and st.lease_end or t_exec + _M.AUTO_RESUME_LEASE
  local lease_err
  local side, r, err, ecode, detail, retryable = self.parallel(function()
    return main()
  end, function(ctl)
    if how ~= "alongside" then
      -- The resume's lease covers the run until ALONGSIDE_MARGIN before its
      -- end: extend it only for a cell still running then (no connect races
      -- the execute's resume, and a short run costs one round trip).
      local wait = lease_end - _M.ALONGSIDE_MARGIN - self.clock()
      if wait > 0 then ctl.wait(wait) end
      if ctl.main_done() then return nil end
    end
    local pause = 0.1
    while true do
      local t0 = self.clock()
      local sb, res, ccode = self.client:connect(id, { timeout = lease })
      self:_event("connect", { sandbox_id = id, ok = sb ~= nil, resumed = sb and res or nil,
        code = not sb and ccode or nil, alongside = true })
      if sb then return sb, t0, res == true end
      lease_err = { tostring(res), ccode }
      if ctl.main_done() then return nil end
      if is_gone(ccode) or self.clock() + pause >= lease_end - _M.LEASE_MARGIN then
        ctl.interrupt(string_format("the lease of sandbox '%s' could not be extended: %s", id, tostring(res)))
        return nil
      end
      ctl.sleep(pause)
      pause = math.min(pause * 2, 2)
    end
  end)
  local sb, t0, resumed = side:result()
  if how ~= "alongside" and (r or not retryable) then
    -- The execute reached the sandbox: traffic resumed it (a new E2B run).
    st.run_started = t_exec
    st.lease_end = math.min(t_exec + _M.AUTO_RESUME_LEASE, t_exec + self.max_run_length)
  end
  if type(sb) == "table" then
    if sb.sandbox_id == nil then sb.sandbox_id = id end
    self:_remember(st, sb, t0 + lease, resumed and t0 or nil)
  elseif not r and not retryable and lease_err then
    -- Interrupted (or failed while the lease could not be secured): the cell
    -- may have started, so it is reported, never sent again.
    detail = type(detail) == "table" and detail or {}
    detail.lease_error = lease_err
    detail.interrupted = true
    if is_gone(lease_err[2]) then forget(st) end
    return nil, string_format("run in sandbox '%s' interrupted: its lease could not be extended (%s)", id,
      lease_err[1]), lease_err[2] or ecode, detail, false
  end
  return r, err, ecode, detail, retryable
end

function Session:_run_locked(lk, code, opts, files)
  local st = _M.decode_state(lk:get_state())
  -- State written for another tag value or another E2B endpoint/account is not ours.
  if (st.tag ~= nil and st.tag ~= self.tag_value) or st.origin ~= self.origin then forget(st) end
  local run_timeout = opts.timeout or self.exec_timeout
  local attempt, hooks_resent = 0, false
  while true do
    attempt = attempt + 1
    local t_resolve = mono_now()
    local info, err, ecode, detail = self:_acquire(st, run_timeout)
    metrics.add(self._tm, "resolve", t_resolve)
    lk:set_state(_M.encode_state(st))
    if not info then return nil, err, ecode, detail end
    self:_started(info)
    local r, retryable
    if ALONGSIDE[info.how] then
      r, err, ecode, detail, retryable = self:_execute_alongside(info, st, code, opts, files, run_timeout, lk)
    else
      r, err, ecode, detail, retryable = self:_execute(info, st, code, opts, files, run_timeout, lk)
    end
    if r then
      st.last_run = self.wall()
      st.turns = math.floor(tonumber(st.turns) or 0) + 1 -- (JSON gives a float)
      r.turn = st.turns
      -- It has run since it lost its memory: what its kernel holds now is kept.
      st.memory_lost = nil
      if st.creating then self:_collect_orphans(st) end
      lk:set_state(_M.encode_state(st))
      return r
    end
    -- A kernel that lost its hooks refused the cell at its first line: one
    -- more re-send (after the hooks cell) whatever came before.
    local hooks_again = retryable and ecode == "HOOKS_LOST" and not hooks_resent
    if hooks_again then hooks_resent = true end
    if retryable and (attempt == 1 or hooks_again) then
      -- At most once: the cell provably never reached a kernel (see
      -- _never_arrived): send the run once more, to the same sandbox while it
      -- exists (its kernel and files are the conversation's), else resolve again.
      self:_event("retry", { sandbox_id = info.sandbox_id, code = ecode })
      if retryable == "gone" then
        forget(st)
      elseif unanswered(ecode, detail) then
        st.lease_end = nil -- unreachable a moment ago: connect first (resumes a paused one)
      end
      lk:set_state(_M.encode_state(st))
      local wait = type(detail) == "table" and detail.retry_after
      if wait and wait > 0 then locks().wait(math.min(wait, _M.RETRY_AFTER_MAX)) end
    else
      -- Not retried: the next run refreshes the lease first (a sandbox paused
      -- under its remembered lease is resumed by that connect).
      if unanswered(ecode, detail) then st.lease_end = nil end
      lk:set_state(_M.encode_state(st))
      return nil, err, ecode, detail
    end
  end
end

-- The events of a run's start: "reuse" or "resume" (a sandbox had before;
-- "create" is sent when one is made), then "run_start".
function Session:_started(info)
  if info.resumed then
    self:_event("resume", { sandbox_id = info.sandbox_id, how = info.how })
  elseif info.reused then
    self:_event("reuse", { sandbox_id = info.sandbox_id, how = info.how })
  end
  self:_event("run_start", { sandbox_id = info.sandbox_id, reused = info.reused == true,
    resumed = info.resumed == true, how = info.how })
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
--   decoded as U+FFFD), lock_error = { msg, code } | nil, unlock_error = { msg, code } | nil }`
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
  if self._pending_cp then checkpoints().settle(self) end
  local tm = metrics.timer()
  local r, err, ecode, detail, unlock_error = self:_with_lock(function(lk)
    tm.lock_wait, tm.locked = mono_now() - tm.t0, true
    self:_event("lock_wait", { waited = tm.lock_wait })
    if run_timeout > self.exec_timeout and type(lk.expire) == "function" then
      lk:expire(math.ceil(run_timeout) + 120)
    end
    local prev_tm = self._tm
    self._tm = tm -- (the run's, while it holds the session's lock)
    local _ <close> = setmetatable({}, { __close = function() self._tm = prev_tm end })
    return self:_run_locked(lk, code, opts, files)
  end)
  -- A failed unlock is reported with the run (the lock retries it itself).
  if unlock_error then detail = attach(r, detail, "unlock_error", unlock_error) end
  if r and self.policy.checkpoint then checkpoints().after_run(self, r, r.turn) end
  return self:_ended(tm, r, err, ecode, detail)
end

-- ------------------------------------------------------------------
-- Prewarm (issue 16): get the sandbox ready before the run comes
-- ------------------------------------------------------------------

--- How long (seconds) a prewarm called outside tasks drives the engine at
-- most before it returns. It returns as soon as its first request has left
-- (the engine waits on the network alone): well under a millisecond on a
-- pooled connection; the cap only bounds a slow start (DNS, a busy machine).
_M.PREWARM_KICK = 0.25

-- The prewarms in flight in this process: "<origin>\0<tag value>" -> { task =, runner = }
-- (an entry leaves when its task ends however it ends: returned, cancelled, runner closed).
local inflight = {}

local function inflight_key(self)
  local k = self.inflight_key
  if not k then
    k = (self.origin or "") .. "\0" .. self.tag_value
    self.inflight_key = k
  end
  return k
end

local private_runner
-- The runner a prewarm is spawned on: the one `opts.runner` gives, else the
-- runner whose task is running, else this module's own.
function Session:_runner()
  if self.get_runner then return self.get_runner() end
  local runner = require "warmbox.runner"
  local r = runner.running()
  if r then return r end
  if not private_runner or private_runner.closed then
    local msg, code
    private_runner, msg, code = runner.new()
    if not private_runner then
      error(string_format("cannot start the event engine: %s (%s)", tostring(msg), tostring(code)), 3)
    end
  end
  return private_runner
end

function Session:_count(name)
  local c = self.counters
  c[name] = (c[name] or 0) + 1
end

-- A run (or forget, state) of a session whose prewarm is in flight in this
-- process waits for it, instead of doing the same work: inside a task of the
-- prewarm's runner it joins it; outside tasks it drives that runner until the
-- prewarm ends (its other tasks progress too). Elsewhere (a task of another
-- runner, a coroutine of the host's inside a task) the lock orders them.
function Session:_await_prewarm()
  local key = inflight_key(self)
  local e = inflight[key]
  if not e then return end
  if e.task:done() then
    inflight[key] = nil -- cancelled before it ever ran (its runner closed)
    return
  end
  local t, rn = e.task, e.runner
  local cur = require("warmbox.task").current()
  if cur then
    if cur.sched ~= t.sched or cur == t then return end
    self:_count("prewarm_waits")
    rn:join(t)
    return
  end
  if rn.stepping then return end
  self:_count("prewarm_waits")
  while not t:done() do
    if not rn:step() then break end
  end
end

local PREWARM_OPTS = { within = "number" }

-- What the prewarm found or did, for its result and event.
local function action_of(info)
  if info.how == "create" then return "created" end
  if info.resumed then return "resumed" end
  if info.how == "remembered" then return "warm" end
  return "extended"
end

-- Under the lock: nothing when the remembered lease covers `within`; else
-- the run's own resolve (`_acquire`, eager: connect now), then the output
-- hook in a kernel that may be new (which starts it).
function Session:_prewarm_locked(lk, within)
  local st = _M.decode_state(lk:get_state())
  if (st.tag ~= nil and st.tag ~= self.tag_value) or st.origin ~= self.origin then forget(st) end
  local now = self.clock()
  if st.sandbox_id and st.lease_end and st.lease_end >= now + within
    and not (self.require_memory and st.memory_lost == st.sandbox_id) then
    return { action = "warm", sandbox_id = st.sandbox_id }
  end
  local info, err, ecode, detail = self:_acquire(st, within, true)
  lk:set_state(_M.encode_state(st))
  if not info then return nil, err, ecode, detail end
  local id = info.sandbox_id
  if st.hooked ~= id or st.memory_lost == id then
    local ok, herr, hcode, hdetail = self:_hook(self:_handle(st, id), st, id, self.exec_timeout)
    lk:set_state(_M.encode_state(st))
    if not ok then return nil, herr, hcode, hdetail end
  end
  return { action = action_of(info), sandbox_id = id, resumed = info.resumed, reused = info.reused }
end

-- The prewarm task's body: never raises; a failure is an event and a count.
function Session:_prewarm(within)
  local ok, r, err, ecode = xpcall(self._with_lock, traceback, self, function(lk)
    return self:_prewarm_locked(lk, within)
  end, true)
  if not ok then r, err, ecode = nil, tostring(r), "TASK" end
  if r then
    self:_count(r.action == "warm" and "prewarm_warm" or "prewarm_ready")
    self:_event("prewarm", { ok = true, action = r.action, sandbox_id = r.sandbox_id, resumed = r.resumed })
    return r
  end
  if ecode == "BUSY" then
    -- A run (or another prewarm) holds the session: it is getting the sandbox ready.
    self:_count("prewarm_busy")
    self:_event("prewarm", { ok = true, action = "busy" })
    return { action = "busy" }
  end
  self:_count("prewarm_failed")
  self:_event("prewarm", { ok = false, action = "failed", code = ecode, message = tostring(err) })
  return nil, err, ecode
end

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
-- @tparam[opt] table opts `within` (seconds until the run may come, default `exec_timeout`)
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
  within = within or self.exec_timeout
  local key = inflight_key(self)
  local e = inflight[key]
  if e and not e.task:done() then return e.task end
  local rn = self:_runner()
  local t
  t = rn:spawn(function()
    local _ <close> = setmetatable({}, { __close = function()
      if inflight[key] and inflight[key].task == t then inflight[key] = nil end
      rn.background = (rn.background or 1) - 1
    end })
    return self:_prewarm(within)
  end)
  -- Blocking lock waits drive a runner with background work (warmbox.runner's lock.wait).
  rn.background = (rn.background or 0) + 1
  inflight[key] = { task = t, runner = rn }
  self:_count("prewarms")
  if not rn:current() and rn.kick then rn:kick(_M.PREWARM_KICK) end
  return t
end

_M.PREWARM_COUNTERS = { prewarms = 0, prewarm_ready = 0, prewarm_warm = 0, prewarm_busy = 0, prewarm_failed = 0,
  prewarm_waits = 0 }

--- The counters of `s:prewarm` and of runs (a copy; runs: see warmbox.metrics): `prewarms` (started), `prewarm_ready`
-- (made ready: resumed, extended or created), `prewarm_warm` (nothing to do),
-- `prewarm_busy` (skipped: the session was locked), `prewarm_failed`,
-- `prewarm_waits` (runs that waited for a prewarm in flight). Sessions of one
-- `warmbox` object share them (`wb:stats()`).
function Session:stats()
  return metrics.stats(self.counters, _M.PREWARM_COUNTERS)
end

--- Runs `fn(lk)` holding the session's lock: the one place a session takes,
-- releases and closes its lock (also when `fn` raises) and maps a lock
-- failure to BUSY / LOCK.
-- @treturn what `fn` returns (up to four values), then `{ msg, code }` when
-- the unlock failed | nil, msg, "BUSY" | "LOCK"
-- With `try` (a prewarm): the lock is taken only when it is free and nobody
-- waits for it (`nil, "busy", "BUSY"` otherwise); else a prewarm of the same
-- session in flight in this process is waited for first (see `_await_prewarm`).
function Session:_with_lock(fn, try)
  if not try then self:_await_prewarm() end
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
    lk:set_state(nil)
    return true
  end)
  return ok, err, code
end

--- What the session remembers (a copy without the access token); takes the lock.
function Session:state()
  local st, err, code = self:_with_lock(function(lk) return _M.decode_state(lk:get_state()) end)
  if st then st.access_token = nil end
  return st, err, code
end

-- ------------------------------------------------------------------
-- Checkpoints (issue 24): see warmbox.checkpoint and README, "Checkpoints"
-- ------------------------------------------------------------------

Session._decode, Session._encode, Session._new, Session._margin = _M.decode_state, _M.encode_state, _M.new,
  _M.LEASE_MARGIN

--- Snapshots the conversation's sandbox as its last run left it (under the lock:
-- a run in progress finishes first).
-- @tparam[opt] table opts `label` (1..40 of a-z, 0-9, '-')
-- @treturn[1] table `{ id, turn, label, created_at, sandbox_id, name }`
-- @return[2] nil, msg, code ("NOT_FOUND": no sandbox yet), detail
function Session:checkpoint(opts) return checkpoints().checkpoint(self, opts) end
--- This conversation's checkpoints, oldest first, as E2B lists them.
function Session:checkpoints()
  if self._pending_cp then checkpoints().settle(self) end
  return checkpoints().checkpoints(self)
end
--- A new session for `new_key` whose sandbox starts from `cp` (opts: `env`, `actor`).
function Session:branch(cp, new_key, opts) return checkpoints().branch(self, cp, new_key, opts) end
--- The conversation goes back to `cp`: a sandbox from it replaces its own.
function Session:rewind(cp) return checkpoints().rewind(self, cp) end
--- Waits for the automatic checkpoint of the last run, if one is being taken.
function Session:await_checkpoint() return checkpoints().settle(self) end

return _M
