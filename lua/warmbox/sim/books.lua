--- warmbox.sim.books: the model's records through time (internal to
-- `warmbox.sim.model` and its fast path `warmbox.sim.fast`).
--
-- A sandbox record's lifecycle (running, paused, killed) and the books kept
-- on the way: running and paused seconds (by size), the running count and its
-- peak, the lease timer heap, and the live list ordered as E2B lists it. Every
-- function takes the model (`self`) and applies a change at an explicit time,
-- so the exact path (which waits in tasks) and the fast path (which books
-- ahead of the clock) share them.
-- @module warmbox.sim.books

local pairs, next = pairs, next
local string_format, math_floor, math_max = string.format, math.floor, math.max
local os_date = os.date

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

--- RFC 3339 (UTC, milliseconds) of a virtual time.
local function rfc3339(t)
  local s = math_floor(t)
  local ms = math_floor((t - s) * 1000 + 0.5)
  if ms >= 1000 then s, ms = s + 1, ms - 1000 end
  return os_date("!%Y-%m-%dT%H:%M:%S", s) .. string_format(".%03dZ", ms)
end

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

return {
  new_heap = new_heap, heap_push = heap_push, heap_pop = heap_pop, rfc3339 = rfc3339,
  running_delta = running_delta, drain_running = drain_running, add_running = add_running,
  stop_running = stop_running, start_running = start_running, newer_than = newer_than, touch = touch,
  arm = arm, start_paused = start_paused, end_paused = end_paused, remove = remove, expire = expire,
  settle = settle, sync = sync,
}
