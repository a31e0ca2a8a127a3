--- warmbox.sim.requests: how a request reaches the model (internal to
-- `warmbox.sim.model` and `warmbox.sim.sandbox`).
--
-- Time passing for the caller (a task sleeps, anyone else moves the clock), a
-- request's round trip with the concurrency cap, the rate limit and the
-- client's 429 retries, a resume, and the shapes the model answers in.
-- @module warmbox.sim.requests

local books = require "warmbox.sim.books"
local task_mod = require "warmbox.task"

local type, pairs, tostring, error, setmetatable = type, pairs, tostring, error, setmetatable
local string_format, math_floor, math_max, math_min = string.format, math.floor, math.max, math.min
local sync, end_paused, start_running, arm, touch, rfc3339 =
  books.sync, books.end_paused, books.start_running, books.arm, books.touch, books.rfc3339

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

return {
  ctx = ctx, pass = pass, REJECT = REJECT, request = request, capped = capped, cap = cap, resume = resume,
  retry_after = retry_after, settled_state = settled_state, listed_state = listed_state,
  sandbox_of = sandbox_of, detail_of = detail_of, not_found = not_found, check_id = check_id,
}
