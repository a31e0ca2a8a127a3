--- warmbox: one warm E2B sandbox per conversation.
--
--   local warmbox = require "warmbox"
--   local wb = warmbox.new{ idle_timeout = 300 }   -- E2B when E2B_API_KEY is set, else an embedded warmboxd
--   local s = wb:session("workspace-1:thread-9", { env = { TOKEN = "..." }, actor = "alice" })
--   local r, err, code = s:run("x = 41\nx + 1")
--   wb:release("workspace-1:thread-9")
--   wb:close()
--
-- @module warmbox

-- Before the C part: under another Lua, core.so fails to load with an
-- undefined symbol (lua_newuserdatauv) that names nothing useful.
if _VERSION ~= "Lua 5.4" then error("warmbox needs Lua 5.4, this is " .. tostring(_VERSION), 2) end

local core = require "warmbox.core"
local session = require "warmbox.session"
local tag_mod = require "warmbox.tag"
local policy_mod = require "warmbox.policy"
local errors = require "warmbox.errors"
local util = require "warmbox.util"

local type, ipairs, tostring, error, setmetatable, pcall =
  type, ipairs, tostring, error, setmetatable, pcall
local os_getenv, string_format, table_sort = os.getenv, string.format, table.sort

--- The version: the one literal in lua/ (CMakeLists.txt compiles the same one into
-- warmbox.core; spec/unit/version_spec.lua checks both and the rockspec agree).
local _M = { _VERSION = "0.1.0" }

--- `new`'s default idle window (seconds): the longest window at least 5x
-- cheaper than the seed's flow on the README's chat workload, at its p95
-- (bench/cost.lua's sweep, docs/cost.md). A running cell keeps its own
-- sandbox alive whatever this is.
_M.IDLE_TIMEOUT = 30

local check_options, bad_option = errors.check_options, errors.bad_option

if core._VERSION ~= _M._VERSION then
  error(string_format("warmbox %s needs warmbox.core %s, got %s (rebuild core.so)", _M._VERSION,
    _M._VERSION, tostring(core._VERSION)), 2)
end

_M.session = session
_M.policy = policy_mod

local OPTS = {
  template = "string", exec_timeout = "number", idle_timeout = "number", tag = "string",
  lock = "string|table|function", policy = "table|string", api_key = "string", api_url = "string",
  sandbox_url = "string", domain = "string", warmboxd = "string", warmboxd_args = "table", server = "string",
  clock = "function", mono = "function", client = "table", secret = "string", request_timeout = "number",
  retry_after_max = "number", retries = "number", connect_timeout = "number", proxy = "string|false",
  ca_file = "string", user_agent = "string", max_connections = "number", on_event = "function", log = "function",
  max_run_length = "number", max_output = "number", max_files_bytes = "number", require_memory = "boolean",
}

-- The low-level client's options `new` passes through (warmbox.e2b.new checks them).
local CLIENT_PASS = { "request_timeout", "retry_after_max", "retries", "connect_timeout", "proxy", "ca_file",
  "user_agent", "max_connections" }

-- After a fork the child shares the parent's connections and event engine:
-- its requests would mix with the parent's. Refused, with the fix named. The
-- transport's methods (request, batch) check the pid first.
local function fork_guard(transport)
  local pid = core.getpid()
  return setmetatable({}, { __index = function(_, name)
    local f = transport[name]
    if type(f) ~= "function" then return f end
    return function(_, ...)
      if core.getpid() ~= pid then
        error(string_format("warmbox: this warmbox.Warmbox was made in process %d, before a fork; this is process "
          .. "%d: call warmbox.new{} in the child (it finds the same shared local server and sandboxes)", pid,
          core.getpid()), 0)
      end
      return f(transport, ...)
    end
  end })
end

-- The transport of the clients warmbox makes, bound to this object's runner:
-- blocking outside its tasks, on its engine inside one (given to the client
-- when it is made).
local function engine_transport(self)
  local r = self.runner
  return function(http) return fork_guard(r:transport(http)) end
end

-- The options of the E2B client `new` makes: `base`, those of CLIENT_PASS
-- given in `o`, and the engine's transport.
local function client_options(self, o, base)
  for _, k in ipairs(CLIENT_PASS) do
    if o[k] ~= nil then base[k] = o[k] end
  end
  base.transport = engine_transport(self)
  return base
end

-- The lock when `new` is given none: $WARMBOX_LOCK ("file" | "redis" | "memory"),
-- the redis one at $WARMBOX_REDIS_URL (redis://, redis-sentinel://,
-- redis-cluster://; see warmbox.lock.redis_client) when set, with
-- $WARMBOX_REDIS_USERNAME / $WARMBOX_REDIS_PASSWORD.
local function env_lock()
  local name = os_getenv("WARMBOX_LOCK")
  if name == "" then name = nil end
  if name and name ~= "file" and name ~= "redis" and name ~= "memory" then
    error('WARMBOX_LOCK: "file", "redis" or "memory" expected, got "' .. name .. '"', 3)
  end
  if name and name ~= "redis" then return name end
  local r = require("warmbox.lock.redis_client").from_env(os_getenv)
  if not r then return name end
  return { backend = "redis", redis = r }
end

local Warmbox = {}
Warmbox.__index = Warmbox
Warmbox.__name = "warmbox.Warmbox"

-- With the engine's transport, a session extends a lease alongside the
-- execute (`parallel`): on this object's runner, inside its tasks as a task
-- beside the caller's, outside them on the runner's lane (the call blocks as ever).
local function parallel_for(self)
  local r = self.runner
  return function(main, side) return r:parallel(main, side) end
end

-- No key, no URL: the user's shared local server (found, else started for
-- every process of the user; never stopped by wb:close), or with
-- `server = "private"` one of this object's own (stopped by wb:close).
local function local_backend(o)
  local server = require "warmbox.server"
  local mode = o.server or "shared"
  if mode == "private" then return server.start{ bin = o.warmboxd, args = o.warmboxd_args } end
  if mode ~= "shared" then bad_option(1, "new", "server", '"shared" or "private" expected, got "' .. mode .. '"', 4) end
  if o.warmboxd_args then
    bad_option(1, "new", "warmboxd_args", 'only with server = "private" (the shared server is started once, '
      .. "for every process of the user)", 4)
  end
  local st, err, code = server.start_local{ bin = o.warmboxd }
  if not st then return nil, err, code end
  return { shared = true, url = st.url, pid = st.pid, api_key = st.api_key, admin_token = st.admin_token,
    dir = st.dir, bin = o.warmboxd }
end

-- Without a client: an E2B client for the key (or the API URL) given, else an
-- embedded warmboxd and a client for it. Sets `client`, `origin` (and `server`).
local function connect_backend(self, o)
  local key = o.api_key or os_getenv("E2B_API_KEY")
  if key == "" then key = nil end
  local e2b = require "warmbox.e2b"
  if key or o.api_url then
    if not key then error("option 'api_url' to 'new' needs 'api_key' (or E2B_API_KEY)", 3) end
    local sandbox_url = o.sandbox_url or os_getenv("E2B_SANDBOX_URL")
    local api_url = o.api_url or os_getenv("E2B_API_URL")
    if (sandbox_url == nil or sandbox_url == "") and api_url and (api_url:match("^https?://127%.")
      or api_url:match("^https?://localhost[:/]") or api_url:match("^https?://localhost$")
      or api_url:match("^https?://%[::1%]")) then
      -- A loopback API URL is a local warmboxd: it serves the data plane on the same port.
      sandbox_url = api_url
    end
    if sandbox_url == "" then sandbox_url = nil end
    self.client = e2b.new(client_options(self, o, { api_key = key, api_url = o.api_url, sandbox_url = sandbox_url,
      domain = o.domain }))
    self.origin = core.sha256((self.client.api_url or "") .. "\0" .. key):sub(1, 16)
  else
    local srv, serr, scode = local_backend(o)
    if not srv then return nil, serr, scode end
    self.server = srv
    local copts = client_options(self, o, { api_key = srv.api_key, api_url = srv.url, sandbox_url = srv.url })
    if srv.shared then
      -- The shared server may end (idle, `warmbox server stop`, a crash) while
      -- this object lives: its requests follow it to the next one.
      local transport = copts.transport
      copts.transport = function(http) return require("warmbox.server").follow(srv, transport(http)) end
    end
    self.client = e2b.new(copts)
    self.client.rate_limit_hint = function(cap)
      local n = cap and tostring(cap) or "N"
      if srv.shared then
        return string_format("the local server runs at most %s sandboxes at once; its setting: `warmbox server start "
          .. "--max-running N` (changes a running server), or WARMBOX_SERVER_MAX_RUNNING=N when it starts; 0: no "
          .. "limit", n)
      end
      return string_format("this private local server runs at most %s sandboxes at once; its setting: "
        .. "warmboxd_args = { \"--max-running\", \"N\" } (0: no limit)", n)
    end
    -- The shared server's sandboxes outlive it (its data directory): the
    -- origin names the directory and key, not the address of one start.
    self.origin = core.sha256((srv.shared and "shared\0" .. tostring(srv.dir) or srv.url) .. "\0"
      .. srv.api_key):sub(1, 16)
  end
  self.owns_client = true
  return true
end

-- The client's settings `new` checks itself (misuse raises at the caller's level).
local function check_client_options(o)
  local rt = o.request_timeout
  if rt ~= nil and not (rt > 0 and rt <= 3600) then
    bad_option(1, "new", "request_timeout", "seconds in (0, 3600] expected, got " .. tostring(rt), 3)
  end
  local ram = o.retry_after_max
  if ram ~= nil and not (ram >= 0 and ram <= 86400) then
    bad_option(1, "new", "retry_after_max", "seconds in [0, 86400] expected, got " .. tostring(ram), 3)
  end
  local lock = o.lock
  if type(lock) == "string" and lock ~= "file" and lock ~= "redis" and lock ~= "memory" then
    bad_option(1, "new", "lock", '"file", "redis" or "memory" expected, got "' .. lock .. '"', 3)
  end
end

--- Make a warmbox object.
-- @tparam[opt] table opts `template` ("code-interpreter-v1"), `exec_timeout` (300),
--   `idle_timeout` (30, `IDLE_TIMEOUT`: chosen with the simulator, see docs/cost.md),
--   `tag` ("warmboxSessionId"), `lock` ("file" | "redis" | "memory" |
--   lock options), `policy` (nil | table | path), `api_key` (default `$E2B_API_KEY`),
--   `api_url`, `sandbox_url`, `domain`, `warmboxd` (path of the binary for the embedded
--   server), `warmboxd_args`, `clock` (function returning unix seconds), `mono` (a monotonic
--   clock, seconds: lease durations; default `warmbox.core.now` unless `clock` is given), `client` (an E2B
--   client to use as is), `secret` (HMAC key of the session fingerprints; default
--   `warmbox.tag.installation_secret()`), `request_timeout` (seconds, (0, 3600]),
--   `retry_after_max` (seconds: the longest `Retry-After` honoured), `retries`, `connect_timeout`,
--   `proxy`, `ca_file`, `user_agent`, `max_connections` (passed to warmbox.e2b.new), `on_event`
--   (function(name, info)) and `log` (function(level, msg, fields)): every session's events
--   (see warmbox.metrics; wb:session may replace them), `lock` default `$WARMBOX_LOCK` /
--   `$WARMBOX_REDIS_URL`, else "file",
--   `max_run_length` (seconds, (0, 30 days]), `max_output` (bytes of stdout, stderr and
--   results kept per run, default 16 MiB), `max_files_bytes` (bytes of output files
--   returned per run, default 64 MiB); timeouts must be finite, positive and at most
--   `max_run_length`
-- @treturn[1] warmbox.Warmbox
-- @return[2] nil, message, code (the embedded warmboxd did not start, the policy did not load)
function _M.new(opts)
  local o = util.copy(check_options(opts, OPTS, "new", 1))
  -- Non-finite or out-of-range settings are misuse, refused here rather than at the first session.
  session.check_settings(o, "new", 1, 2)
  check_client_options(o)
  local lock = o.lock
  if lock == nil then lock = env_lock() end
  local pol = o.policy
  local p, perr, pcode
  if type(pol) == "table" then
    p = policy_mod.merge(pol) -- a bad table is misuse: raises
  else
    p, perr, pcode = policy_mod.resolve(pol)
    if not p then return nil, perr, pcode end
  end
  local self = setmetatable({
    template = o.template or "code-interpreter-v1",
    exec_timeout = o.exec_timeout or 300,
    idle_timeout = o.idle_timeout or _M.IDLE_TIMEOUT,
    max_run_length = o.max_run_length or 24 * 3600,
    max_output = o.max_output or session.MAX_OUTPUT,
    max_files_bytes = o.max_files_bytes or session.MAX_FILES_BYTES,
    require_memory = o.require_memory == true,
    tag = o.tag or "warmboxSessionId",
    lock = lock or "file",
    policy = p,
    clock = o.clock or os.time,
    -- Lease durations: the monotonic clock, unless a clock was given (virtual time).
    mono = o.mono or (o.clock == nil and core.now or nil),
    secret = o.secret,
    on_event = o.on_event, log = o.log,
    counters = {}, -- s:prewarm's, shared by every session of this object (wb:stats())
  }, Warmbox)
  -- The one runner (an event engine and a scheduler) this object owns and
  -- passes to everything that waits: its clients' transports, its sessions
  -- (the lease watchdog, prewarms, automatic checkpoints), its locks' waits,
  -- GC; `wb:spawn`'s tasks are its tasks.
  local r, rmsg, rcode = require("warmbox.runner").new()
  if not r then return nil, "cannot start the event engine: " .. tostring(rmsg), rcode end
  self.runner = r
  if o.client then
    self.client = o.client
    if type(o.client) == "table" and type(o.client.with_transport) == "function" and o.client.transport == nil then
      -- A warmbox.e2b client without a transport of its own: this object's
      -- requests go over its connection through the engine's transport (a
      -- copy made now; the caller's client is left as it is).
      self.client = o.client:with_transport(engine_transport(self))
    end
  else
    local ok, err, code = connect_backend(self, o)
    if not ok then
      r:close()
      return nil, err, code
    end
  end
  if self.client ~= o.client or self.owns_client then self.parallel = parallel_for(self) end
  return self
end

local SESSION_OPTS = { env = "table", actor = "string", template = "string", exec_timeout = "number",
  idle_timeout = "number", max_output = "number", max_files_bytes = "number", require_memory = "boolean",
  on_event = "function", log = "function" }

--- A session: one warm sandbox per conversation key.
-- @tparam string key the session key (any bytes, e.g. "workspace-1:thread-9")
-- @tparam[opt] table opts `env` (env vars baked in at creation; part of the fingerprint),
--   `actor` (who acts; part of the fingerprint), `template`, and overrides of `exec_timeout`,
--   `idle_timeout`, `max_output`, `max_files_bytes`, `require_memory`, `on_event`, `log`
--   (checked as in `new`)
-- @treturn warmbox.Session
function Warmbox:session(key, opts)
  if self.closed then error("attempt to use a closed warmbox.Warmbox", 2) end
  if type(key) ~= "string" or key == "" then
    error("bad argument #1 to 'session' (non-empty string expected, got "
      .. (key == "" and "empty string" or type(key)) .. ")", 2)
  end
  opts = check_options(opts, SESSION_OPTS, "session", 2)
  local settings = { max_run_length = self.max_run_length, exec_timeout = opts.exec_timeout or self.exec_timeout,
    idle_timeout = opts.idle_timeout or self.idle_timeout, max_output = opts.max_output or self.max_output,
    max_files_bytes = opts.max_files_bytes or self.max_files_bytes }
  session.check_settings(settings, "session", 2, 2)
  return session.new(key, {
    client = self.client, lock = self:_lock_factory(settings.exec_timeout), clock = self.clock,
    mono = self.mono, policy = self.policy,
    template = opts.template or self.template, exec_timeout = settings.exec_timeout,
    idle_timeout = settings.idle_timeout, tag = self.tag, env = opts.env, actor = opts.actor,
    secret = self.secret, origin = self.origin, max_run_length = self.max_run_length,
    max_output = settings.max_output, max_files_bytes = settings.max_files_bytes,
    parallel = self.parallel,
    require_memory = (opts.require_memory == nil) and self.require_memory or opts.require_memory,
    -- prewarms and automatic checkpoints are tasks of wb's runner (wb:step/loop drive it)
    runner = self.runner,
    counters = self.counters,
    on_event = opts.on_event or self.on_event, log = opts.log or self.log,
  })
end

--- Counters of this object's sessions (see `s:stats`).
function Warmbox:stats()
  return require("warmbox.metrics").stats(self.counters, session.PREWARM_COUNTERS)
end

-- Every tagged sandbox (running or paused) of this API key whose tag is a warmbox tag value.
function Warmbox:_tagged()
  local items, err, code = self.client:list_all{ state = { "running", "paused" } }
  if not items then return nil, err, code end
  local out = {}
  for _, it in ipairs(items) do
    local v = type(it.metadata) == "table" and it.metadata[self.tag]
    if type(v) == "string" then
      local key, enc = tag_mod.parse_tag(v)
      if enc then out[#out + 1] = { item = it, tag_value = v, key = key } end
    end
  end
  return out
end

--- What the conversations, tenants or days cost, from E2B's lifecycle events
-- (see `warmbox.ledger`): `wb:costs{ since, until, by = "conversation" | "tenant" | "day" }`.
-- @treturn[1] table rows, table totals
-- @return[2] nil, message, code
function Warmbox:costs(opts)
  if self.closed then error("attempt to use a closed warmbox.Warmbox", 2) end
  return require("warmbox.ledger").costs_of(self, opts)
end

--- Kill every sandbox of a conversation (any env/actor fingerprint): the
-- conversation was deleted. Waits for a run in progress on that session
-- (delegates to `warmbox.gc.release`).
-- @tparam string key
-- @treturn[1] number how many sandboxes were killed
-- @return[2] nil, message, code ("BUSY" when a run kept the session locked)
function Warmbox:release(key)
  if self.closed then error("attempt to use a closed warmbox.Warmbox", 2) end
  if type(key) ~= "string" or key == "" then
    error("bad argument #1 to 'release' (non-empty string expected, got " .. type(key) .. ")", 2)
  end
  local gc = require "warmbox.gc"
  return gc.release{ client = self.client, tag = self.tag, key = key, lock = self:_lock_factory(self.exec_timeout) }
end

--- The sessions that have sandboxes: `{ {key, tag_value, sandbox_id, state, started_at, end_at,
-- cpu_count, memory_mb}, ... }` (`key` is nil for keys that were hashed because they were too
-- long; the size is the listing's `cpuCount`/`memoryMB`, nil when it gives none).
-- @treturn[1] table
-- @return[2] nil, message, code
function Warmbox:sessions()
  if self.closed then error("attempt to use a closed warmbox.Warmbox", 2) end
  local tagged, err, code = self:_tagged()
  if not tagged then return nil, err, code end
  local out = {}
  for _, t in ipairs(tagged) do
    out[#out + 1] = { key = t.key, tag_value = t.tag_value, sandbox_id = t.item.sandbox_id,
      state = t.item.state, started_at = t.item.started_at, end_at = t.item.end_at,
      cpu_count = t.item.cpu_count, memory_mb = t.item.memory_mb }
  end
  table_sort(out, function(a, b)
    if (a.key or "") ~= (b.key or "") then return (a.key or "") < (b.key or "") end
    return tostring(a.sandbox_id) < tostring(b.sandbox_id)
  end)
  return out
end

local GC_OPTS = { dry_run = true, max_age = true, concurrency = true, max_kills = true, next_token = true,
  pages = true, on_action = true, on_page = true, actions = true, policy = true, on_checkpoint = true }

-- One GC pass: the sandboxes (warmbox.gc.run), then, when the policy has a
-- `checkpoint_gc` hook, the checkpoints (warmbox.gc.checkpoints.run: `report.checkpoints`).
local function gc_pass(o)
  local on_checkpoint = o.on_checkpoint
  o.on_checkpoint = nil
  local rep, msg, code, partial = require("warmbox.gc").run(o)
  if not rep or not o.policy.checkpoint_gc or rep.next_token then return rep, msg, code, partial end
  local cr, cmsg, ccode, cpartial = require("warmbox.gc.checkpoints").run{ client = o.client, tag = o.tag,
    policy = o.policy, clock = o.clock, lock = o.lock, dry_run = o.dry_run, on_action = on_checkpoint }
  rep.checkpoints = cr or cpartial
  if not cr then return nil, cmsg, ccode, rep end
  return rep
end

local function gc_run_opts(self, opts, fname)
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #" .. (fname == "gc" and 1 or 2) .. " to '" .. fname .. "' (table expected, got "
      .. type(opts) .. ")", 3)
  end
  local o = { client = self.client, tag = self.tag, policy = self.policy, clock = self.clock }
  for k, v in pairs(check_options(opts, GC_OPTS, fname, fname == "gc" and 1 or 2, 3)) do o[k] = v end
  if type(o.policy) ~= "table" or o.policy ~= self.policy then
    -- a policy for this pass only: a table (merged over the default) or a path / source
    if type(o.policy) == "table" then
      o.policy = policy_mod.merge(o.policy)
    else
      local p, perr, pcode = policy_mod.resolve(o.policy)
      if not p then return nil, perr, pcode end
      o.policy = p
    end
  end
  if o.policy.budget then -- a conversation over its budget: what the budget says in GC first
    local p = {}
    for k, v in pairs(o.policy) do p[k] = v end
    p.gc = require("warmbox.session.budget").wrap_gc(p, self.client, self.tag, self.clock())
    o.policy = p
  end
  local user_action = o.on_action
  if self.on_event or self.log then
    -- GC's kills are events of this object too ("gc_kill", the action as info).
    o.on_action = function(a)
      if a.action == "kill" then require("warmbox.metrics").emit(self.on_event, self.log, "gc_kill", a, fname) end
      if user_action then return user_action(a) end
    end
  end
  -- Locks taken inside a task are tracked (closed when it ends); the pass
  -- runs on this object's runner inside its tasks, else on its own tasks.
  o.lock = self.runner:lock_factory(require("warmbox.lock").factory(self.lock, self:_lock_defaults(), nil, "gc"))
  o.runner = self.runner
  return o
end

--- Garbage-collect tagged sandboxes under the GC policy (delegates to `warmbox.gc.run`).
-- @tparam[opt] table opts `dry_run` (false), `max_age` (seconds, 86400), `concurrency` (8),
--   `max_kills`, `next_token`, `pages`, `on_action`, `on_page`, `actions` (true), `policy`
--   (this pass only: a table or a path), `on_checkpoint(a)` (the checkpoint pass's actions,
--   when the policy has `checkpoint_gc`: its report is `report.checkpoints`, see
--   `warmbox.gc.checkpoints`)
-- @treturn[1] table report (see `warmbox.gc.run`)
-- @return[2] nil, message, code, partial report
function Warmbox:gc(opts)
  if self.closed then error("attempt to use a closed warmbox.Warmbox", 2) end
  local o, perr, pcode = gc_run_opts(self, opts, "gc")
  if not o then return nil, perr, pcode end
  return gc_pass(o)
end

--- Scheduled GC for a long-running host: call it from the host's loop or timer
-- (as often as you like); it runs one pass when `seconds` have passed since the
-- last pass **of any process or host sharing the lock backend**, and returns.
-- Passes never overlap: the pass holds a GC lock (key `warmbox-gc:<tag>`) in the
-- same backend as the session locks, and the time of the last pass (and the
-- page to resume from when it stopped early) is kept in that lock's state.
-- @tparam number seconds the interval (> 0)
-- @tparam[opt] table opts as `gc` (`next_token` is managed here)
-- @treturn[1] table report (a pass ran)
-- @treturn[2] false
-- @treturn[2] string "not due" (then the seconds until due) or "busy" (another pass is running)
-- @return[3] nil, message, code (the pass failed; the next call resumes from its page)
function Warmbox:gc_every(seconds, opts)
  if self.closed then error("attempt to use a closed warmbox.Warmbox", 2) end
  if type(seconds) ~= "number" or seconds ~= seconds or seconds <= 0 then
    error("bad argument #1 to 'gc_every' (positive number expected, got " .. tostring(seconds) .. ")", 2)
  end
  local o, perr, pcode = gc_run_opts(self, opts, "gc_every")
  if not o then return nil, perr, pcode end
  if o.next_token ~= nil then bad_option(2, "gc_every", "next_token", "not accepted (gc_every manages it)") end
  local json = require "warmbox.json"
  local lk = require("warmbox.lock").factory(self.lock, self:_lock_defaults(self.exec_timeout))()
  local key = "warmbox-gc:" .. self.tag
  local got, lerr, lcode = lk:try_lock(key)
  if not got then
    if lk.close then pcall(lk.close, lk) end
    if lerr == "busy" then return false, "busy" end
    return nil, "cannot take the gc lock: " .. tostring(lerr), lcode or "LOCK"
  end
  local function done(...)
    lk:unlock()
    if lk.close then pcall(lk.close, lk) end
    return ...
  end
  local st = json.decode(lk:get_state() or "") or {}
  if type(st) ~= "table" then st = {} end
  local now = self.clock()
  local last = tonumber(st.last)
  local resume = type(st.next_token) == "string" and st.next_token or nil
  if last and not resume and now - last < seconds then return done(false, "not due", seconds - (now - last)) end
  o.next_token = resume
  local on_page = o.on_page
  o.on_page = function(p)
    -- keep the GC lock alive through a long pass, and remember where to resume
    -- should this process die: the next call of any process continues there
    if lk.expire then lk:expire() end
    lk:set_state(json.encode({ last = last, next_token = p.resume_token }))
    if on_page then on_page(p) end
  end
  local ok, rep, err, code, partial = pcall(gc_pass, o)
  if not ok then
    done() -- the state keeps the last page's resume token
    error(rep, 0)
  end
  if not rep then
    -- resume from the page that failed; the time of the last full pass stays
    lk:set_state(json.encode({ last = last, next_token = partial and partial.resume_token or resume }))
    return done(nil, err, code)
  end
  -- a pass that stopped early (`pages`) leaves a token: the next call continues at once
  lk:set_state(json.encode({ last = now, next_token = rep.next_token }))
  return done(rep)
end

-- ------------------------------------------------------------------
-- Tasks: many runs at once from one Lua state
-- ------------------------------------------------------------------

-- The defaults of this object's locks (a lock spec's own options win): the
-- session's timeouts when `exec_timeout` is given, and the wait between
-- attempts on this object's runner (`r:pause`: inside its tasks it yields).
function Warmbox:_lock_defaults(exec_timeout)
  local d = exec_timeout and session.lock_defaults(exec_timeout) or {}
  local r = self.runner
  d.wait = function(seconds, waker) return r:pause(seconds, waker) end
  return d
end

-- The lock factory of sessions and release: inside a task, the locks are
-- tracked so that a cancelled task frees its sessions.
function Warmbox:_lock_factory(exec_timeout)
  return self.runner:lock_factory(require("warmbox.lock").factory(self.lock, self:_lock_defaults(exec_timeout)))
end

--- Start `fn(...)` as a task: a coroutine this object owns. Inside it every
-- warmbox call that waits (runs, lock waits, E2B requests, release, gc,
-- sessions) yields to the event engine; outside tasks calls block as ever.
-- The task first runs at the next `step`/`loop`.
-- @treturn warmbox.Task (`result()`, `done()`, `cancel()`)
function Warmbox:spawn(fn, ...)
  if self.closed then error("attempt to use a closed warmbox.Warmbox", 2) end
  if type(fn) ~= "function" then
    error("bad argument #1 to 'spawn' (function expected, got " .. type(fn) .. ")", 2)
  end
  return self.runner:spawn(fn, ...)
end

--- Run until every task finished.
-- @treturn[1] true
-- @return[2] nil, msg, "DEADLOCK"
function Warmbox:loop()
  return self.runner:loop()
end

--- One round for a host that owns its loop: run the ready tasks, wait at
-- most `timeout` seconds (nil: as needed; 0: never blocks) for the engine.
-- @treturn boolean true while tasks remain
function Warmbox:step(timeout)
  if timeout ~= nil and (type(timeout) ~= "number" or timeout ~= timeout or timeout < 0) then
    error("bad argument #1 to 'step' (number >= 0 expected, got " .. tostring(timeout) .. ")", 2)
  end
  return self.runner:step(timeout)
end

--- The engine's fd: watch it for readability and call `step(0)`.
function Warmbox:pollfd()
  if self.closed then error("attempt to use a closed warmbox.Warmbox", 2) end
  return self.runner:pollfd()
end

--- "r": the events to watch on `pollfd()` (cqueues' polling protocol:
-- `cqueues.poll(wb)` waits on pollfd/events/timeout).
function Warmbox.events()
  return "r"
end

--- Tasks not finished.
function Warmbox:pending()
  return self.runner:count()
end

--- Seconds until `step(0)` is due without fd activity (0: now), nil when
-- nothing is timed.
function Warmbox:timeout()
  return self.runner:timeout()
end

-- close{ drain = seconds }: runs the tasks in flight (and prewarms) until
-- they finish or `seconds` pass. → how many are still unfinished.
local function drain(self, opts)
  opts = check_options(opts, { drain = "number" }, "close", 1, 3)
  local seconds = opts.drain
  if seconds == nil then return 0 end
  if not (seconds >= 0 and seconds < math.huge) then
    bad_option(1, "close", "drain", "seconds >= 0 expected, got " .. tostring(seconds), 3)
  end
  local r = self.runner
  if r:current() then
    error("bad argument #1 to 'close' (option 'drain': called inside one of its tasks, which cannot wait "
      .. "for themselves)", 3)
  end
  local deadline = core.now() + seconds
  while r:count() > 0 do
    local left = deadline - core.now()
    if left <= 0 then break end
    r:step(left)
  end
  return r:count()
end

--- Close: stop the embedded warmboxd (if any) and the client's connections. Idempotent.
-- With `{ drain = seconds }`, the tasks in flight first get up to `seconds` to
-- finish; the rest are cancelled, as without it. → true, how many were cancelled.
function Warmbox:close(opts)
  if self.closed then return true, 0 end
  local left = drain(self, opts)
  self.closed = true
  pcall(self.runner.close, self.runner)
  if self.owns_client and self.client and type(self.client.close) == "function" then
    pcall(self.client.close, self.client)
  end
  if self.server and not self.server.shared then self.server:stop() end
  return true, left
end

function Warmbox:__gc() pcall(self.close, self) end
function Warmbox:__close() pcall(self.close, self) end
-- What the object talks to, in words.
local function backend_name(self)
  local srv = self.server
  if srv then
    return string_format("%s local warmboxd at %s (pid %s)", srv.shared and "the shared" or "a private",
      tostring(srv.url), tostring(srv.pid))
  end
  local url = type(self.client) == "table" and self.client.api_url
  if type(url) ~= "string" then return "a client of the caller's" end
  if url:match("^https?://api%.e2b%.") then return "E2B (" .. url .. ")" end
  return "an E2B-compatible server at " .. url
end

function Warmbox:__tostring()
  return self.closed and "warmbox.Warmbox (closed)" or "warmbox.Warmbox: " .. backend_name(self)
end

return _M
