--- warmbox.sim.model: a virtual-time model of E2B for the simulator.
--
-- An object with the methods of a `warmbox.e2b` client that `warmbox.session`
-- and `warmbox.gc` call (`create`, `list`, `list_pages`, `list_all`, `info`,
-- `connect`, `set_timeout`, `pause`, `kill`, `kill_many`, `sandbox` and, on a
-- sandbox handle, `run_code`, `read_file`, `write_file(s)`, `remove`,
-- `make_dir`, `list_dir`, `stat`), whose state machine follows E2B's
-- lifecycle (E2B's API, sandbox lifecycle):
--
-- * a running sandbox has a lease (`end_at`); when it passes, the sandbox is
--   paused (`onTimeout = pause`, memory kept) or killed;
-- * `connect` extends a running sandbox's lease (never shortens it) or
--   resumes a paused one (new `started_at`, `end_at = now + timeout`);
--   `set_timeout` replaces the lease of a running one (404 when paused);
-- * the lease is capped by the maximum session length, counted from the
--   current run's `started_at`;
-- * data-plane traffic to a paused sandbox auto-resumes it when
--   `autoResume` is on (lease: the create timeout, at least 300 s), else gets
--   a 502; a filesystem-only snapshot is resumed by a cold boot and never
--   auto-resumed;
-- * paused sandboxes are kept until killed.
--
-- * with `max_running` > 0, a create, or a connect or data-plane request
--   that would resume a paused sandbox, beyond that many running sandboxes
--   answers 429 (E2B's concurrency cap) with `Retry-After: retry_after`;
--   with `rate_per_s` > 0 the control plane is a token bucket (`rate_burst`
--   tokens) and a request beyond it answers 429 naming the wait for a token.
--   Like `warmbox.core`'s retry rules, idempotent calls (`connect`, `info`,
--   `list`, `kill`, data-plane calls but `run_code`) and `create` retry a 429
--   up to `retries` times, after the Retry-After, else with capped
--   exponential backoff (0.1 s doubling, at most 2 s, jittered by the seeded
--   PRNG), within a 30 s budget; `pause`, `set_timeout` and `run_code` do
--   not retry.
--
-- Nothing sleeps and nothing touches the network: every call waits on the
-- model's `warmbox.task` scheduler (virtual backend) for its cost (half a
-- round trip each way, plus create, resume, kernel start or run time). Inside
-- one of the scheduler's tasks the call yields, so calls of different tasks
-- overlap in virtual time; outside, the virtual clock simply jumps. Leases
-- sit in a timer heap and expire lazily, at each step, at the exact time
-- they ran out. Sandboxes are indexed by metadata (key, value), so a
-- filtered list costs the size of its answer; every other call is O(log n).
-- The model also keeps the books: running and paused sandbox-seconds,
-- creates, resumes, requests.
--
--   local model = require("warmbox.sim.model").new{ rtt_ms = 20, create_ms = 500 }
--   local clock = model:clock()        -- function() return virtual seconds end
--   model:advance_to(t)                -- idle time passes (leases expire lazily)
-- @module warmbox.sim.model

local outputs = require "warmbox.outputs"
local errors = require "warmbox.errors"

local type, pairs, ipairs, tostring, error, setmetatable =
  type, pairs, ipairs, tostring, error, setmetatable
local string_format, table_sort, math_floor, math_max, math_min =
  string.format, table.sort, math.floor, math.max, math.min
local task_mod = require "warmbox.task"
local books = require "warmbox.sim.books"
local rq = require "warmbox.sim.requests"
local sandbox_mod = require "warmbox.sim.sandbox"

local new_heap, heap_push, heap_pop, rfc3339 = books.new_heap, books.heap_push, books.heap_pop, books.rfc3339
local settle, expire, stop_running, start_running, drain_running, running_delta, add_running =
  books.settle, books.expire, books.stop_running, books.start_running, books.drain_running, books.running_delta,
  books.add_running
local arm, start_paused, end_paused, remove, touch, newer_than, sync =
  books.arm, books.start_paused, books.end_paused, books.remove, books.touch, books.newer_than, books.sync
local ctx, pass, REJECT, request, capped, cap, resume, retry_after, settled_state, listed_state =
  rq.ctx, rq.pass, rq.REJECT, rq.request, rq.capped, rq.cap, rq.resume, rq.retry_after, rq.settled_state,
  rq.listed_state
local sandbox_of, detail_of, not_found, check_id = rq.sandbox_of, rq.detail_of, rq.not_found, rq.check_id

local _M = {}
_M.heap_push, _M.heap_pop, _M.new_heap = heap_push, heap_pop, new_heap
_M.ctx, _M.rfc3339, _M.sync, _M.REJECT = ctx, rfc3339, sync, REJECT

--- The private MIME type of the output report (`warmbox.outputs` defines it).
_M.OUTPUTS_MIME = outputs.OUTPUTS_MIME

--- Default model parameters (milliseconds unless said).
_M.DEFAULTS = {
  rtt_ms = 20,             -- one request's round trip
  create_ms = 500,         -- create (VM boot) server-side
  kernel_ms = 1000,        -- first run on a fresh kernel (code interpreter start-up)
  resume_ms = 1000,        -- resume of a memory snapshot
  pause_ms = 2000,         -- an explicit pause (about 4 s per GiB of RAM)
  max_length_hours = 24,   -- maximum session length (Pro: 24, Hobby: 1)
  auto_resume_min = 300,   -- seconds: lease after a traffic-triggered resume, at least
  start = 1767225600,      -- unix seconds of virtual time 0 (2026-01-01T00:00:00Z)
  max_running = 0,         -- E2B's concurrency cap: running sandboxes (0: none)
  rate_per_s = 0,          -- control-plane requests per second (0: no limit)
  rate_burst = 20,         -- token bucket size of the rate limit
  retries = 3,             -- retries of an idempotent call or a create after a 429 (the client's default)
  retry_after = 1,         -- seconds a 429 of the concurrency cap says in Retry-After (0: no header)
  seed = 1,                -- seeds the backoff jitter
  snapshot_ms = 2000,      -- taking a checkpoint (a persistent snapshot): the sandbox is paused meanwhile,
                           -- billed as running (assumed: as long as the default pause_ms; E2B publishes none)
  snapshot_gb = 10,        -- GiB of disk a checkpoint stores, plus the sandbox's RAM (10: the disk E2B
                           -- includes on Hobby, its FAQ "How do I calculate the price of a sandbox?")
}

--- Sandbox sizes by template, as E2B builds them (`code-interpreter-v1`:
-- cpu_count=2, memory_mb=2048 in e2b-dev/code-interpreter's template/build_prod.py);
-- any other template gets `DEFAULT_SIZE`, E2B's default of 2 vCPU and 512 MiB.
_M.TEMPLATE_SIZES = {
  ["code-interpreter-v1"] = { cpu_count = 2, memory_mb = 2048 },
  ["code-interpreter"] = { cpu_count = 2, memory_mb = 2048 },
}
_M.DEFAULT_SIZE = { cpu_count = 2, memory_mb = 512 }

local Model = {}
Model.__index = Model
Model.__name = "warmbox.sim.Model"

--- Make a model.
-- @tparam[opt] table opts overrides of `DEFAULTS` (unknown keys raise)
-- @tparam[opt] warmbox.task.Scheduler sched the scheduler whose tasks call the
--   model (default: a new one on a virtual clock at `start`); its backend
--   must be a `warmbox.task.virtual` one (the model moves its clock).
-- @treturn warmbox.sim.Model
function _M.new(opts, sched)
  opts = errors.check_options(opts, _M.DEFAULTS, "new", 1)
  local cfg = {}
  for k, v in pairs(_M.DEFAULTS) do cfg[k] = v end
  for k, v in pairs(opts) do
    if type(v) ~= "number" or v ~= v or v < 0 then errors.bad_option(1, "new", k, "a non-negative number expected") end
    cfg[k] = v
  end
  sched = sched or task_mod.scheduler{ backend = task_mod.virtual(cfg.start) }
  local backend = sched.backend
  if backend:now() < cfg.start then backend.t = cfg.start end
  local rs = math_floor(cfg.seed) ~ 0x2545F4914F6CDD1D
  local self = setmetatable({
    cfg = cfg,
    sched = sched, backend = backend,
    now = backend:now(),       -- virtual unix seconds (the scheduler's clock, synced at each step)
    rtt = cfg.rtt_ms / 1000,
    max_length = cfg.max_length_hours * 3600,
    boxes = {},                -- id -> record (killed ones too while keep_history)
    keep_history = true,       -- false: forget killed sandboxes (large simulations)
    live = {},                 -- id -> record (running or paused)
    nlive = 0,                 -- how many live records (the list's length)
    by_md = {},                -- metadata key -> value -> { [record] = true } (live ones)
    leases = new_heap(),       -- timer heap of running sandboxes' lease ends
    tseq = 0,
    running = 0,               -- running sandboxes now
    tokens = cfg.rate_burst, tokens_at = backend:now(),
    rand = function()          -- xorshift64*, for the backoff jitter
      rs = rs ~ (rs >> 12); rs = rs ~ (rs << 25); rs = rs ~ (rs >> 27)
      return ((rs * 0x2545F4914F6CDD1D) >> 11) * (1.0 / 9007199254740992)
    end,
    seq = 0,
    -- the books
    stats = { requests = 0, creates = 0, resumes = 0, auto_resumes = 0, cold_boot_resumes = 0, auto_pauses = 0,
              timeout_kills = 0, pauses = 0, kills = 0, paused_during_run = 0, running_seconds = 0,
              running_by_size = {},
              paused_seconds = 0, runs = 0, rejected_cap = 0, rejected_rate = 0, retries = 0, retry_after_waits = 0,
              peak_running = 0,
              snapshots = 0, snapshots_deleted = 0, peak_snapshots = 0, snapshot_gib_seconds = 0 },
    snaps = {},                -- snapshot id -> { id, name, gib, created_at } (checkpoints alive)
    nsnaps = 0, snap_gib = 0,  -- how many are alive, and their GiB
    snap_books_at = backend:now(), -- the storage books are closed up to this time
    -- per-run marks outside tasks (inside a task: the task's `data`)
    mark = {},
  }, Model)
  return self
end

--- The virtual clock: a function returning the current virtual time (unix seconds).
function Model:clock()
  local backend = self.backend
  return function() return backend.t end
end
--- Let virtual time pass to `t` (never backwards); leases expire on the way.
-- Outside tasks only (a task waits with its scheduler instead).
function Model:advance_to(t)
  if t > self.backend.t then self.backend.t = t end
  sync(self)
end

-- ------------------------------------------------------------------
-- Control plane
-- ------------------------------------------------------------------

-- A new running sandbox started at `t` (after its boot), indexed by its metadata.
local function add_box(self, params, timeout, t)
  self.seq = self.seq + 1
  local lc = params.lifecycle or {}
  local md = {}
  for k, v in pairs(params.metadata or {}) do md[k] = v end
  local b = {
    n = self.seq, id = string_format("sim%06d", self.seq), token = string_format("tok%06d", self.seq),
    template = params.template or "base", metadata = md, state = "running",
    started_at = t, created_at = t, running_since = t,
    on_timeout = lc.on_timeout == "pause" and "pause" or "kill",
    auto_resume = lc.on_timeout == "pause" and lc.auto_resume == true,
    keep_memory = lc.keep_memory ~= false, memory = true,
    timeout = timeout, kernel = false, hooked = false, executions = 0, epoch = 0,
  }
  local size = self.size or _M.TEMPLATE_SIZES[b.template] or _M.DEFAULT_SIZE
  b.cpu_count, b.memory_mb = size.cpu_count, size.memory_mb
  b.size_key = string_format("%dx%d", size.cpu_count, size.memory_mb)
  b.end_at = cap(self, b, t + timeout)
  self.boxes[b.id], self.live[b.id] = b, b
  self.nlive = self.nlive + 1
  local by_md = self.by_md
  for k, v in pairs(md) do
    local vals = by_md[k]
    if not vals then vals = {}; by_md[k] = vals end
    local set = vals[v]
    if not set then set = {}; vals[v] = set end
    set[b] = true
  end
  start_running(self, t)
  arm(self, b)
  touch(self, b)
  self.stats.creates = self.stats.creates + 1
  return b
end

--- `c:create(params)` (see `warmbox.e2b`).
function Model:create(params)
  if type(params) ~= "table" then error("bad argument #1 to 'create' (table expected)", 2) end
  return request(self, function()
    local timeout = params.timeout or 15
    if type(timeout) ~= "number" or timeout <= 0 then
      return nil, "timeout must be greater than 0", "BAD_REQUEST"
    end
    if timeout > self.max_length then
      return nil, string_format("timeout cannot be greater than %g hours", self.cfg.max_length_hours), "BAD_REQUEST"
    end
    if capped(self) then return REJECT, retry_after(self) end
    self.running = self.running + 1          -- booting counts against the cap
    pass(self, self.cfg.create_ms / 1000)
    self.running = self.running - 1
    add_box(self, params, timeout, self.now)
    ctx(self).mark.created = true
    return sandbox_of(self.boxes[string_format("sim%06d", self.seq)]), nil
  end, false, true, true)
end

local function state_set(opts)
  local st = opts.state
  if st == nil then return { running = true, paused = true } end
  if type(st) == "string" then return { [st] = true } end
  local set = {}
  for _, s in ipairs(st) do set[s] = true end
  return set
end

local function matching(self, opts)
  local states, md = state_set(opts), opts.metadata
  local out = {}
  -- The smallest indexed (key, value) set, else every live sandbox.
  local pool
  local k1, v1 = next(md or {})
  if k1 ~= nil then
    pool = self.by_md[k1] and self.by_md[k1][v1]
    if not pool then return out end
  end
  local function consider(b)
    if states[listed_state(b)] then
      for k, v in pairs(md or {}) do
        if b.metadata[k] ~= v then return end
      end
      out[#out + 1] = b
    end
  end
  if pool then
    for b in pairs(pool) do consider(b) end
    -- E2B lists newest first.
    table_sort(out, newer_than)
  else
    -- Every live sandbox: the list kept newest first needs no sort.
    local b = self.newest
    while b do
      consider(b)
      b = b.older
    end
  end
  return out
end

--- `c:list_pages(opts)`: one request per page of `limit` (100) items.
function Model:list_pages(opts)
  opts = opts or {}
  local limit = opts.limit or 100
  local snapshot, pos, done = nil, 0, false
  return function()
    if done then return nil end
    return request(self, function()
      if not snapshot then snapshot = matching(self, opts) end
      local page = {}
      for i = pos + 1, math_min(pos + limit, #snapshot) do page[#page + 1] = detail_of(snapshot[i]) end
      pos = pos + #page
      if pos >= #snapshot then done = true end
      return page, false, (not done) and tostring(pos) or nil
    end, true, true)
  end
end

--- `c:list(opts)`: an iterator over items, following every page.
function Model:list(opts)
  local pages = self:list_pages(opts)
  local items, i = nil, 0
  return function()
    while true do
      if items and i < #items then
        i = i + 1
        return items[i]
      end
      items, i = pages(), 0
      if items == nil then return nil end
    end
  end
end

--- `c:list_all(opts)` → items.
function Model:list_all(opts)
  local out = {}
  for item in self:list(opts) do out[#out + 1] = item end
  return out
end

--- `c:info(id)` → detail | nil, msg, "NOT_FOUND".
function Model:info(id)
  id = check_id(id, "info")
  return request(self, function()
    local b = self.live[id]
    if not b then return not_found(id) end
    return detail_of(b)
  end, true, true)
end

--- `c:connect(id, { timeout })` → sb, resumed | nil, msg, code.
function Model:connect(id, opts)
  id = check_id(id, "connect")
  local timeout = (opts and opts.timeout) or 300
  return request(self, function()
    local b = self.live[id]
    if not b then return nil, string_format("paused sandbox '%s' not found", id), "NOT_FOUND" end
    if timeout > self.max_length then
      return nil, string_format("timeout cannot be greater than %g hours", self.cfg.max_length_hours), "BAD_REQUEST"
    end
    local st = settled_state(self, b)
    if st == "running" then
      -- Only extended, never shortened; capped by the maximum session length.
      b.end_at = math_max(b.end_at, cap(self, b, self.now + timeout))
      if b.end_at <= self.now then settle(self, self.now) end
      if b.state == "running" then
        arm(self, b)
        return sandbox_of(b), false
      end
    end
    if b.state ~= "paused" then return nil, string_format("paused sandbox '%s' not found", id), "NOT_FOUND" end
    if capped(self) then return REJECT, retry_after(self) end
    resume(self, b, timeout)
    if b.state ~= "running" then return nil, string_format("paused sandbox '%s' not found", id), "NOT_FOUND" end
    return sandbox_of(b), true
  end, true, true)
end

--- `c:set_timeout(id, seconds)` → true | nil, msg, code.
function Model:set_timeout(id, seconds)
  id = check_id(id, "set_timeout")
  return request(self, function()
    local b = self.live[id]
    if not b or settled_state(self, b) ~= "running" then
      return nil, string_format("sandbox '%s' not found or not running", id), "NOT_FOUND"
    end
    if self.now - b.started_at >= self.max_length then
      return nil, "max instance length exceeded", "BAD_REQUEST"
    end
    b.end_at = cap(self, b, self.now + seconds)
    if b.timer_at and b.timer_at > b.end_at then b.timer_at = nil end   -- shortened: a new, earlier entry
    arm(self, b)
    if b.end_at <= self.now then settle(self, self.now) end
    return true
  end, false, true)
end

--- `c:pause(id, { memory })` → true | false (already paused) | nil, msg, code.
function Model:pause(id, opts)
  id = check_id(id, "pause")
  local memory = not (opts and opts.memory == false)
  return request(self, function()
    local b = self.live[id]
    if not b then return not_found(id) end
    local st = settled_state(self, b)
    if st == "paused" then return false end
    if st ~= "running" then return not_found(id) end
    pass(self, self.cfg.pause_ms / 1000)
    if b.state ~= "running" then return false end
    stop_running(self, b, self.now)
    start_paused(b, self.now)
    b.memory = memory
    if not memory then b.kernel, b.hooked = false, false end
    self.stats.pauses = self.stats.pauses + 1
    return true
  end, false, true)
end

local function kill_now(self, id)
  local b = self.live[id]
  if not b then return false end
  remove(self, b, self.now)
  self.stats.kills = self.stats.kills + 1
  return true
end

--- `c:kill(id)` → true | false (already gone).
function Model:kill(id)
  id = check_id(id, "kill")
  return request(self, function() return kill_now(self, id) end, true, true)
end

--- `c:kill_many(ids, { concurrency })`: parallel kills (one round trip per
-- `concurrency` of them) → `{ { true } | { false }, ... }`.
function Model:kill_many(ids, opts)
  if type(ids) ~= "table" then error("bad argument #1 to 'kill_many' (table expected)", 2) end
  local conc = (opts and opts.concurrency) or 8
  local out = {}
  for start = 1, #ids, conc do
    self.stats.requests = self.stats.requests + math_min(conc, #ids - start + 1) - 1
    request(self, function()
      for i = start, math_min(start + conc - 1, #ids) do
        out[i] = { kill_now(self, check_id(ids[i], "kill_many")) }
      end
    end, true, false)
  end
  return out
end

-- ------------------------------------------------------------------
-- Checkpoints: persistent snapshots (`warmbox.session.checkpoint`)
-- ------------------------------------------------------------------

--- Books the GiB-seconds the live snapshots stored since the last time.
function Model:_book_snapshots()
  local now = self.backend.t
  local st = self.stats
  st.snapshot_gib_seconds = st.snapshot_gib_seconds + self.snap_gib * math_max(0, now - self.snap_books_at)
  self.snap_books_at = now
end

--- `c:snapshot(id, { name })` → `{ snapshot_id, names }` | nil, msg, "NOT_FOUND" (not running):
-- the sandbox is paused `snapshot_ms` while it is taken (billed as running), then runs on;
-- the snapshot stores `snapshot_gb` plus the sandbox's RAM until it is deleted.
function Model:snapshot(id, opts)
  id = check_id(id, "snapshot")
  local name = opts and opts.name
  return request(self, function()
    local b = self.live[id]
    if not b or settled_state(self, b) ~= "running" then return not_found(id) end
    pass(self, self.cfg.snapshot_ms / 1000)
    self:_book_snapshots()
    self.snap_seq = (self.snap_seq or 0) + 1
    local sid = string_format("snap%06d", self.snap_seq)
    local gib = self.cfg.snapshot_gb + b.memory_mb / 1024
    self.snaps[sid] = { id = sid, name = name or sid, gib = gib, seq = self.snap_seq }
    self.nsnaps, self.snap_gib = self.nsnaps + 1, self.snap_gib + gib
    local st = self.stats
    st.snapshots = st.snapshots + 1
    if self.nsnaps > st.peak_snapshots then st.peak_snapshots = self.nsnaps end
    return { snapshot_id = sid, names = { name or sid } }
  end, false, true)
end

-- The live snapshots, newest first, as E2B lists them.
local function snapshot_items(self)
  local list = {}
  for _, sn in pairs(self.snaps) do list[#list + 1] = sn end
  table_sort(list, function(a, b) return a.seq > b.seq end)
  for i, sn in ipairs(list) do list[i] = { snapshot_id = sn.id, names = { sn.name } } end
  return list
end

--- `c:list_snapshot_pages()`: pages of 100, newest first (`items, token_used, next_token`).
function Model:list_snapshot_pages()
  local items, pos, done = nil, 0, false
  return function()
    if done then return nil end
    return request(self, function()
      if not items then items = snapshot_items(self) end
      local page = {}
      for i = pos + 1, math_min(pos + 100, #items) do page[#page + 1] = items[i] end
      local used = pos > 0 and tostring(pos) or false
      pos = pos + #page
      done = pos >= #items
      return page, used, (not done) and tostring(pos) or nil
    end, true, true)
  end
end

--- `c:list_snapshots()` → every snapshot, newest first.
function Model:list_snapshots()
  local out = {}
  for items in self:list_snapshot_pages() do
    for _, it in ipairs(items) do out[#out + 1] = it end
  end
  return out
end

--- `c:delete_snapshot(id)` → true | false (none).
function Model:delete_snapshot(id)
  if type(id) == "table" then id = id.snapshot_id end
  if type(id) ~= "string" then error("bad argument #1 to 'delete_snapshot' (snapshot id expected)", 2) end
  return request(self, function()
    local sn = self.snaps[id]
    if not sn then return false end
    self:_book_snapshots()
    self.snaps[id] = nil
    self.nsnaps, self.snap_gib = self.nsnaps - 1, self.snap_gib - sn.gib
    self.stats.snapshots_deleted = self.stats.snapshots_deleted + 1
    return true
  end, true, true)
end
--- `c:sandbox(sb_or_id, opts)`: a data-plane handle (`warmbox.sim.sandbox`).
function Model:sandbox(sb, opts) -- luacheck: ignore 212
  return sandbox_mod.new(self, check_id(sb, "sandbox"))
end

-- ------------------------------------------------------------------
-- The books
-- ------------------------------------------------------------------

--- Close the books at the current time: running and paused seconds so far
-- (idempotent: the sandboxes keep their state).
-- @treturn table `{ running, paused }` counts of live sandboxes
function Model:close_books()
  self:_book_snapshots()
  local running, paused = 0, 0
  for _, b in pairs(self.live) do
    if b.state == "running" or b.state == "resuming" then
      if b.running_since then
        add_running(self, b, math_max(0, self.now - b.running_since))
        b.running_since = self.now
      end
      running = running + 1
    else
      end_paused(self, b, self.now)
      b.paused_since = self.now
      paused = paused + 1
    end
  end
  return { running = running, paused = paused }
end

--- Records of every sandbox the model made (a copy: id, state, metadata, ...).
-- The session's random create id (`warmbox.tag.CREATE_TAG`) is left out:
-- one seed gives one report.
function Model:sandboxes()
  local out = {}
  local create_tag = require("warmbox.tag").CREATE_TAG
  for _, b in pairs(self.boxes) do
    local md = {}
    for k, v in pairs(b.metadata) do
      if k ~= create_tag then md[k] = v end
    end
    out[#out + 1] = { sandbox_id = b.id, state = b.state, metadata = md, created_at = b.created_at,
                      killed_at = b.killed_at, executions = b.executions, cpu_count = b.cpu_count,
                      memory_mb = b.memory_mb }
  end
  table_sort(out, function(a, b) return a.sandbox_id < b.sandbox_id end)
  return out
end

_M.Model = Model
_M.Sandbox = sandbox_mod.Sandbox
-- The model's rules, for the fast path (`warmbox.sim.fast`), which applies
-- them at explicit times instead of waiting in tasks.
_M.ops = { settle = settle, expire = expire, stop_running = stop_running, start_running = start_running,
  drain_running = drain_running, running_delta = running_delta, arm = arm, start_paused = start_paused,
  end_paused = end_paused,
  remove = remove, cap = cap, touch = touch, add_box = add_box, listed_state = listed_state,
  detail_of = detail_of, sandbox_of = sandbox_of }
return _M
