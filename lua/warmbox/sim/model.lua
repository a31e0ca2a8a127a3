--- warmbox.sim.model: a virtual-time model of E2B for the simulator.
--
-- An object with the methods of a `warmbox.e2b` client that `warmbox.session`
-- and `warmbox.gc` call (`create`, `list`, `list_pages`, `list_all`, `info`,
-- `connect`, `set_timeout`, `pause`, `kill`, `kill_many`, `sandbox` and, on a
-- sandbox handle, `run_code`, `read_file`, `write_file(s)`, `remove`,
-- `make_dir`, `list_dir`, `stat`), whose state machine follows E2B's
-- lifecycle (e2b-api.md section 5):
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
local os_date = os.date
local task_mod = require "warmbox.task"

-- A binary min-heap of values ordered by (t, seq), kept in three arrays
-- (`t`, `s`, `v`) so a comparison reads two numbers next to each other and
-- never the value itself (which is cold in a large simulation).
local function heap_push(h, t, seq, v)
  local n = h.n + 1
  h.n = n
  local ht, hs, hv = h.t, h.s, h.v
  local i = n
  while i > 1 do
    local p = i >> 1
    local pt = ht[p]
    if pt < t or (pt == t and hs[p] < seq) then break end
    ht[i], hs[i], hv[i] = pt, hs[p], hv[p]
    i = p
  end
  ht[i], hs[i], hv[i] = t, seq, v
end

-- Pops the least: its t and value (nil when empty).
local function heap_pop(h)
  local n = h.n
  if n == 0 then return nil end
  local ht, hs, hv = h.t, h.s, h.v
  local top_t, top_v = ht[1], hv[1]
  local lt, ls, lv = ht[n], hs[n], hv[n]
  ht[n], hs[n], hv[n] = nil, nil, nil
  n = n - 1
  h.n = n
  if n > 0 then
    local i = 1
    while true do
      local l = i << 1
      if l > n then break end
      local ct, cs = ht[l], hs[l]
      if l < n then
        local rt, rs = ht[l + 1], hs[l + 1]
        if rt < ct or (rt == ct and rs < cs) then l, ct, cs = l + 1, rt, rs end
      end
      if lt < ct or (lt == ct and ls < cs) then break end
      ht[i], hs[i], hv[i] = ct, cs, hv[l]
      i = l
    end
    ht[i], hs[i], hv[i] = lt, ls, lv
  end
  return top_t, top_v
end

local function new_heap() return { n = 0, t = {}, s = {}, v = {} } end

local _M = {}
_M.heap_push, _M.heap_pop, _M.new_heap = heap_push, heap_pop, new_heap

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

-- The per-run context: the running task's data table, or the model itself
-- outside tasks (`duration`, the run's length, and `mark`, what happened).
local function ctx(self)
  local t = task_mod.current()
  if t and t.sched == self.sched then
    local d = t.data
    if not d.mark then d.mark = {} end
    return d
  end
  return self
end
_M.ctx = ctx

--- RFC 3339 (UTC, milliseconds) of a virtual time.
local function rfc3339(t)
  local s = math_floor(t)
  local ms = math_floor((t - s) * 1000 + 0.5)
  if ms >= 1000 then s, ms = s + 1, ms - 1000 end
  return os_date("!%Y-%m-%dT%H:%M:%S", s) .. string_format(".%03dZ", ms)
end
_M.rfc3339 = rfc3339

-- ------------------------------------------------------------------
-- Time and the lifecycle
-- ------------------------------------------------------------------

-- A running sandbox stops running at time t (paused or killed): book its run time.
-- The count of running sandboxes changes by `d` at time `t`. The fast path
-- (`warmbox.sim.fast`) books changes ahead of the global clock, so it keeps
-- them in a heap (`deltas`: arrays `k` of times and `d` of changes, ordered
-- by time, then a stop before a start) applied in time order (see
-- `drain_running`). `d` is 1 (a start), -1 (a stop) or +-1.5 (a create's
-- boot begins / ends: running for the count, but not towards
-- `peak_running`, as the exact path's create books it).
local function running_delta(self, t, d)
  local h = self.deltas
  if h then
    local n = h.n + 1
    h.n = n
    local keys, ds = h.k, h.d
    local i = n
    while i > 1 do
      local p = i >> 1
      local pk = keys[p]
      if pk < t or (pk == t and ds[p] <= d) then break end
      keys[i], ds[i] = pk, ds[p]
      i = p
    end
    keys[i], ds[i] = t, d
    return
  end
  local n = self.running + d
  self.running = n
  if n > self.stats.peak_running then self.stats.peak_running = n end
end

-- Apply the booked changes of the running count up to time `t` (fast path).
local function drain_running(self, t)
  local h = self.deltas
  local keys, ds = h.k, h.d
  local n, peak = self.running, self.stats.peak_running
  local size = h.n
  while size > 0 and keys[1] <= t do
    local d = ds[1]
    if d == 1.5 then            -- a create's boot: counts as running, but as the
      n = n + 1                 -- exact path's create does, not towards the peak
    elseif d == -1.5 then
      n = n - 1
    else
      n = n + d
      if n > peak then peak = n end
    end
    local lk, ld = keys[size], ds[size]
    keys[size], ds[size] = nil, nil
    size = size - 1
    if size > 0 then
      local i = 1
      while true do
        local l = i << 1
        if l > size then break end
        if l < size then
          local a, b = keys[l + 1], keys[l]
          if a < b or (a == b and ds[l + 1] < ds[l]) then l = l + 1 end
        end
        local c = keys[l]
        if lk < c or (lk == c and ld <= ds[l]) then break end
        keys[i], ds[i] = c, ds[l]
        i = l
      end
      keys[i], ds[i] = lk, ld
    end
  end
  h.n = size
  self.running, self.stats.peak_running = n, peak
end

-- Adds dt running seconds of b to the totals, and to those of its size.
local function add_running(self, b, dt)
  local st = self.stats
  st.running_seconds = st.running_seconds + dt
  local by = st.running_by_size
  by[b.size_key] = (by[b.size_key] or 0) + dt
end

local function stop_running(self, b, t)
  if b.running_since then add_running(self, b, math_max(0, t - b.running_since)) end
  b.running_since = nil
  b.epoch, b.stopped_at = b.epoch + 1, t
  running_delta(self, t, -1)
end

local function start_running(self, t)
  running_delta(self, t or self.now, 1)
end

-- Live sandboxes in a list ordered by started_at (then creation order),
-- newest at `self.newest`: the order E2B lists them in, kept without a sort
-- (a sandbox that starts moves to the newest end; the walk back is short
-- because starts come in nearly increasing time); `self.oldest` is its
-- other end.
local function newer_than(a, b)
  return a.started_at > b.started_at or (a.started_at == b.started_at and a.n > b.n)
end

local function unlink(self, b)
  local o, w = b.older, b.newer
  if w then w.older = o else if self.newest == b then self.newest = o end end
  if o then o.newer = w else if self.oldest == b then self.oldest = w end end
  b.older, b.newer = nil, nil
end

local function touch(self, b)
  unlink(self, b)
  local w = nil                 -- the node that will be just newer than b
  local o = self.newest
  while o and not newer_than(b, o) do w, o = o, o.older end
  b.older, b.newer = o, w
  if o then o.newer = b else self.oldest = b end
  if w then w.older = b else self.newest = b end
end

-- The lease of a running sandbox ends at b.end_at: keep one heap entry per
-- sandbox at or before it (an extension is found when the entry pops).
local function arm(self, b)
  local at = b.timer_at
  if at and at <= b.end_at then return end
  self.tseq = self.tseq + 1
  b.timer_at = b.end_at
  heap_push(self.leases, b.end_at, self.tseq, b)
end

local function start_paused(b, t)
  b.state, b.paused_since, b.end_at = "paused", t, t
end

local function end_paused(self, b, t)
  self.stats.paused_seconds = self.stats.paused_seconds + math_max(0, t - b.paused_since)
  b.paused_since = nil
end

local function remove(self, b, t)
  if b.state == "running" or b.state == "resuming" then
    stop_running(self, b, t)
  elseif b.state == "paused" then
    end_paused(self, b, t)
  end
  b.state, b.killed_at = "killed", t
  if self.live[b.id] then
    self.live[b.id] = nil
    self.nlive = self.nlive - 1
  end
  unlink(self, b)
  if not self.keep_history then self.boxes[b.id] = nil end
  for k, v in pairs(b.metadata) do
    local vals = self.by_md[k]
    local set = vals and vals[v]
    if set then
      set[b] = nil
      if next(set) == nil then vals[v] = nil end
    end
  end
end

-- A running sandbox's lease ran out (at b.end_at): paused or killed then.
local function expire(self, b)
  local at = b.end_at
  if b.on_timeout == "pause" then
    stop_running(self, b, at)
    start_paused(b, at)
    b.memory = b.keep_memory
    if not b.memory then b.kernel, b.hooked = false, false end
    self.stats.auto_pauses = self.stats.auto_pauses + 1
  else
    remove(self, b, at)
    self.stats.timeout_kills = self.stats.timeout_kills + 1
  end
end

-- Leases that ran out by time `t`, applied at the time each one ran out.
local function settle(self, t)
  local h = self.leases
  local ht = h.t
  while h.n > 0 and ht[1] <= t do
    local et, b = heap_pop(h)
    if b.timer_at == et then b.timer_at = nil end
    if b.state ~= "running" then goto continue end
    if b.end_at > et then
      arm(self, b)                   -- extended since: wait for the new end
      goto continue
    end
    expire(self, b)
    ::continue::
  end
end

-- Bring the model to the scheduler's clock: leases expire on the way.
local function sync(self)
  local t = self.backend.t
  if t > self.now then
    settle(self, t)
    self.now = t
  end
end
_M.sync = sync

--- Let virtual time pass to `t` (never backwards); leases expire on the way.
-- Outside tasks only (a task waits with its scheduler instead).
function Model:advance_to(t)
  if t > self.backend.t then self.backend.t = t end
  sync(self)
end

-- Time passes by `d` seconds for the caller: a task sleeps (others run
-- meanwhile), anyone else moves the clock.
local function pass(self, d)
  if d > 0 then
    local t = task_mod.current()
    if t and t.sched == self.sched then
      self.sched:sleep_until(self.backend.t + d)
    else
      local at = self.backend.t + d
      if at > self.backend.t then self.backend.t = at end
    end
  end
  sync(self)
end

-- The answer a rejected request gets.
local REJECT = setmetatable({}, { __name = "warmbox.sim.REJECT" })
_M.REJECT = REJECT

-- The control plane's token bucket: true when a request may pass now, else
-- false and the seconds until a token is free.
local function admit(self)
  local rate = self.cfg.rate_per_s
  if rate <= 0 then return true end
  local burst = self.cfg.rate_burst
  local tok = math_min(burst, self.tokens + (self.now - self.tokens_at) * rate)
  self.tokens_at = self.now
  if tok < 1 then
    self.tokens = tok
    self.stats.rejected_rate = self.stats.rejected_rate + 1
    return false, (1 - tok) / rate
  end
  self.tokens = tok - 1
  return true
end

-- The Retry-After a 429 carries (whole seconds, as the header), or nil when
-- the model sends none (`retry_after = 0`). The rate limit names the time
-- until a token is free (at least 1 s), the concurrency cap `retry_after`.
local function retry_after(self, wait)
  local ra = self.cfg.retry_after
  if ra <= 0 then return nil end
  if wait then return math_max(1, math.ceil(wait)) end
  return ra
end

-- A request: half a round trip out, server work, half back. `work` may return
-- REJECT (429: over the concurrency cap) and a Retry-After; the rate limit
-- applies to the control plane (`cp`). Like `warmbox.core`'s retry rules, an
-- idempotent request (`idem`) or one E2B refuses without acting (`refused`:
-- create) is tried again after a 429 up to `retries` times: after the
-- Retry-After the server named, else a capped exponential backoff (0.1 s
-- doubling, at most 2 s, jittered in [d/2, d]); no retry starts that would
-- end past the 30 s budget.
local function request(self, work, idem, cp, refused)
  local attempts = (idem or refused) and math_floor(self.cfg.retries) + 1 or 1
  local t_first = self.backend.t
  for attempt = 1, attempts do
    self.stats.requests = self.stats.requests + 1
    pass(self, self.rtt / 2)
    local a, b, c
    if cp then
      local ok, wait = admit(self)
      if not ok then a, b = REJECT, retry_after(self, wait) end
    end
    if a == nil then a, b, c = work() end
    pass(self, self.rtt / 2)
    if a ~= REJECT then return a, b, c end
    if attempt == attempts then break end
    local d = math_min(2, 0.1 * 2 ^ (attempt - 1))
    d = d / 2 + self.rand() * d / 2
    if b then d = b end
    if self.backend.t - t_first + d > 30 then break end
    self.stats.retries = self.stats.retries + 1
    if b then self.stats.retry_after_waits = self.stats.retry_after_waits + 1 end
    local mark = ctx(self).mark
    mark.retries = (mark.retries or 0) + 1
    pass(self, d)
  end
  return nil, "429: too many requests or running sandboxes", "RATE_LIMITED"
end

-- Over the concurrency cap: one more running sandbox is refused.
local function capped(self)
  local cap = self.cfg.max_running
  if cap > 0 and self.running >= cap then
    self.stats.rejected_cap = self.stats.rejected_cap + 1
    return true
  end
  return false
end

local function cap(self, b, end_at)
  return math_min(end_at, b.started_at + self.max_length)
end

-- Resume a paused sandbox now with a lease of `timeout` seconds (server side).
-- It counts as running (for the cap) from the start of the resume; a request
-- for it meanwhile finds it "resuming" and waits for the same resume.
local function resume(self, b, timeout)
  end_paused(self, b, self.now)
  b.state = "resuming"
  start_running(self, self.now)
  local ev = self.sched:event()
  b.resuming = ev
  if b.memory then
    pass(self, self.cfg.resume_ms / 1000)
  else
    -- A filesystem-only snapshot boots cold: the kernel starts again.
    pass(self, self.cfg.create_ms / 1000)
    self.stats.cold_boot_resumes = self.stats.cold_boot_resumes + 1
  end
  b.resuming = nil
  if b.state == "resuming" then
    b.state, b.started_at, b.running_since = "running", self.now, self.now
    b.end_at = cap(self, b, self.now + timeout)
    arm(self, b)
    touch(self, b)
  end
  b.memory = true
  self.stats.resumes = self.stats.resumes + 1
  ctx(self).mark.resumed = true
  ev:broadcast()
end

-- A request that finds its sandbox resuming waits for that resume to end.
local function settled_state(self, b)
  while b.state == "resuming" and b.resuming do
    b.resuming:wait()
    sync(self)
    if task_mod.current() == nil then break end
  end
  return b.state
end

-- A resuming sandbox lists as paused (its resume has not answered yet).
local function listed_state(b)
  if b.state == "resuming" then return "paused" end
  return b.state
end

local function sandbox_of(b)
  return { sandbox_id = b.id, template_id = b.template, client_id = "sim", envd_version = "0.5.7",
           envd_access_token = b.token, domain = "sim.local" }
end

local function detail_of(b)
  local d = sandbox_of(b)
  local md = {}
  for k, v in pairs(b.metadata) do md[k] = v end
  d.metadata, d.state = md, listed_state(b)
  -- The formatted times are kept until they change (GC lists every sandbox each pass).
  if b.fmt_started ~= b.started_at then b.fmt_started, b.s_started = b.started_at, rfc3339(b.started_at) end
  if b.fmt_end ~= b.end_at then b.fmt_end, b.s_end = b.end_at, rfc3339(b.end_at) end
  d.started_at, d.end_at = b.s_started, b.s_end
  d.cpu_count, d.memory_mb, d.disk_size_mb = b.cpu_count, b.memory_mb, 1024
  d.lifecycle = { on_timeout = b.on_timeout, auto_resume = b.auto_resume }
  return d
end

local function not_found(id)
  return nil, string_format("sandbox '%s' not found", tostring(id)), "NOT_FOUND"
end

local function check_id(id, fname)
  if type(id) == "table" then id = id.sandbox_id end
  if type(id) ~= "string" then error("bad argument #1 to '" .. fname .. "' (sandbox id expected)", 3) end
  return id
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
-- Checkpoints: persistent snapshots (`warmbox.checkpoint`)
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

-- ------------------------------------------------------------------
-- Data plane
-- ------------------------------------------------------------------

local Sandbox = {}
Sandbox.__index = Sandbox
Sandbox.__name = "warmbox.sim.Sandbox"

--- `c:sandbox(sb_or_id, opts)`: a data-plane handle.
function Model:sandbox(sb, opts) -- luacheck: ignore 212
  local id = check_id(sb, "sandbox")
  return setmetatable({ model = self, sandbox_id = id }, Sandbox)
end

-- Reach the sandbox through the proxy: a paused one with autoResume (and a
-- memory snapshot) is resumed, else the proxy answers 502.
local function reach(self, id)
  local b = self.live[id]
  if b then settled_state(self, b) end
  if b and b.state == "paused" and b.auto_resume and b.memory then
    if capped(self) then return REJECT, retry_after(self) end
    resume(self, b, math_min(math_max(b.timeout, self.cfg.auto_resume_min), self.max_length))
    self.stats.auto_resumes = self.stats.auto_resumes + 1
  end
  if not b or b.state ~= "running" then
    return nil, string_format("sandbox '%s' is not reachable (the sandbox was not found)", id), "SANDBOX_GONE"
  end
  return b
end

local function dp(self, id, work)
  return request(self, function()
    local b, err, code = reach(self, id)
    if b == REJECT then return REJECT, err end
    if not b then return nil, err, code end
    return work(b)
  end, true, false)
end

function Sandbox:write_files(files)
  return dp(self.model, self.sandbox_id, function()
    local out = {}
    for i, f in ipairs(files) do out[i] = { path = f.path, name = f.path:match("[^/]*$"), type = "file" } end
    return out
  end)
end

function Sandbox:write_file(path, data)
  local r, err, code = self:write_files{ { path = path, data = data } }
  if not r then return nil, err, code end
  return r[1]
end

function Sandbox:read_file(path, _)
  return dp(self.model, self.sandbox_id, function()
    return nil, string_format("file '%s' not found", tostring(path)), "NOT_FOUND"
  end)
end

function Sandbox:remove(path)
  return dp(self.model, self.sandbox_id, function() return true, path end)
end

function Sandbox:make_dir(path)
  return dp(self.model, self.sandbox_id, function() return true, path end)
end

function Sandbox:list_dir(path) -- luacheck: ignore 212
  -- The simulated runs leave no files behind.
  return dp(self.model, self.sandbox_id, function() return {} end)
end

function Sandbox:stat(path)
  return dp(self.model, self.sandbox_id, function() return { path = path, type = "dir" } end)
end

--- `s:run_code(code, opts)`: the run takes `model.duration` seconds (set by
-- the simulator per run; 0 by default). The first cell on a fresh kernel
-- pays `kernel_ms`. warmbox's python hooks cell (`outputs.PRELUDE`) registers the
-- output hooks, so the kernel then reports its (empty) output directory the way
-- `warmbox.session` expects. A lease that runs out during the run pauses (or
-- kills) the sandbox under it: the stream breaks.
function Sandbox:run_code(code, opts)
  opts = opts or {}
  local m = self.model
  local c = ctx(m)
  -- warmbox's hooks cell (sent once per new kernel) takes no time of the run's own
  local duration = code == outputs.PRELUDE and 0 or c.duration or 0
  local timeout = opts.timeout
  m.stats.requests = m.stats.requests + 1
  pass(m, m.rtt / 2)
  local b, err, ecode = reach(m, self.sandbox_id)
  if b == REJECT then
    pass(m, m.rtt / 2)
    return nil, "429: too many running sandboxes", "RATE_LIMITED"   -- a stream is not retried
  end
  if not b then
    pass(m, m.rtt / 2)
    return nil, err, ecode
  end
  local epoch = b.epoch
  local function broken()
    -- Paused (lease ran out) or killed under the run: the stream breaks.
    if b.state == "paused" then m.stats.paused_during_run = m.stats.paused_during_run + 1 end
    pass(m, m.rtt / 2)
    return nil, "the stream broke: the sandbox was " .. (b.state == "paused" and "paused" or "killed")
      .. " during the run", "STREAM_BROKEN"
  end
  if not b.kernel then
    pass(m, m.cfg.kernel_ms / 1000)
    if b.epoch ~= epoch then return broken() end
    b.kernel, b.hooked = true, false
  end
  c.mark.code_started = m.now
  c.mark.sandbox_id = b.id
  m.stats.runs = m.stats.runs + 1
  local stop = duration
  local timed_out = timeout and duration > timeout
  if timed_out then stop = timeout end
  local finish = m.now + stop
  -- Run until the end, or until the lease runs out under the run.
  pass(m, math_min(finish, b.end_at) - m.now)
  if b.epoch ~= epoch and b.stopped_at < finish then return broken() end
  if m.now < finish then
    pass(m, finish - m.now)
    if b.epoch ~= epoch and b.stopped_at < finish then return broken() end
  end
  pass(m, m.rtt / 2)
  if timed_out then return nil, "execution timed out", "TIMEOUT" end
  b.executions = b.executions + 1
  local language = opts.language or "python"
  local results = {}
  if language == "python" then
    -- The kernel gets the hooks from warmbox's hooks cell (warmbox.outputs' source).
    if not b.hooked and type(code) == "string" and code:find(outputs.PRELUDE, 1, true) then
      b.hooked = true
    end
    if b.hooked then
      local res = { is_main_result = false, extra = { [_M.OUTPUTS_MIME] = { v = 1, files = {} } } }
      if opts.on_result then opts.on_result(res) end
      results[1] = res
    end
  end
  return { stdout = {}, stderr = {}, results = results, error = nil, execution_count = b.executions }
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
_M.Sandbox = Sandbox
-- The model's rules, for the fast path (`warmbox.sim.fast`), which applies
-- them at explicit times instead of waiting in tasks.
_M.ops = { settle = settle, expire = expire, stop_running = stop_running, start_running = start_running,
  drain_running = drain_running, running_delta = running_delta, arm = arm, start_paused = start_paused,
  end_paused = end_paused,
  remove = remove, cap = cap, touch = touch, add_box = add_box, listed_state = listed_state,
  detail_of = detail_of, sandbox_of = sandbox_of }
return _M
