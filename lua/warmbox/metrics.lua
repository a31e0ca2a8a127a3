--- warmbox.metrics: what a run reports about itself.
--
-- A run's timings (`r.timings`, and `detail.timings` of a failed run): seconds
-- on the monotonic clock spent waiting for the session's lock (`lock_wait`),
-- finding or making its sandbox (`resolve`: the list, a connect, a create, and
-- writing the session's state), getting it ready for the cell (`prepare`: the
-- input files, the output directory, the hooks cell, which starts the kernel of
-- a new sandbox), extending its lease before the cell (`lease`), in the
-- execute (`execute`), reading its output files (`outputs`), waiting before a
-- run is sent again (`retry`), after the cell (`finish`: the state written, the
-- lock released, a checkpoint), and in all (`total`): the phases add up to it.
--
-- The counters a `warmbox` object's sessions share (`wb:stats()`, `s:stats()`):
-- `runs`, by outcome (`runs_ok`: ran, `runs_error`: ran and the cell raised,
-- `runs_failed`: warmbox failed; `codes[code]` counts those by code), how the
-- sandbox was had (`reuse`, `resume`, `create`), and the total latency of the
-- runs in a fixed histogram (bounded memory: BUCKETS buckets growing by RATIO
-- from BASE seconds): `latency = { count, p50, p90, p99 }` (each an upper
-- bucket bound, within RATIO of the true quantile; nil before any run).
-- @module warmbox.metrics

local core = require "warmbox.core"

local now = core.now
local pairs, type, log, ceil, max, min = pairs, type, math.log, math.ceil, math.max, math.min

local _M = {}

_M.BASE, _M.RATIO, _M.BUCKETS = 0.001, 1.1, 200
local LOG_RATIO = log(_M.RATIO)

--- The timing fields, in order.
_M.FIELDS = { "lock_wait", "resolve", "prepare", "lease", "execute", "outputs", "retry", "finish", "total" }

--- A run's timer: `tm[field]` accumulates (see `phase`); `t0` is its start and
-- `mark` the end of its last phase; `locked` is set once the run has its lock.
-- syntax: tm = metrics.timer()
function _M.timer()
  local t = now()
  return { t0 = t, mark = t, lock_wait = 0, resolve = 0, prepare = 0, lease = 0, execute = 0, outputs = 0,
    retry = 0, finish = 0 }
end

--- Ends a phase: the time since the last one ended (or the run began) goes to
-- `tm[field]` (nothing without a timer). The phases are contiguous, so they
-- add up to the total.
-- syntax: metrics.phase(tm, field) (ends a phase: the time since the last one ended, or the run began, goes to
--   `tm[field]`; the phases are contiguous, so they add up to `total`: the session's run ends `lock_wait`,
--   `resolve`, `prepare`, `lease`, `execute`, `outputs`, `retry` where each happens, and `timings` puts the
--   rest, after the last phase, in `finish`; nothing when `tm` is nil)
function _M.phase(tm, field)
  if tm then
    local t = now()
    tm[field] = tm[field] + (t - tm.mark)
    tm.mark = t
  end
end

--- Adds the time since `t0` to `tm[field]` (nothing without a timer).
-- syntax: metrics.add(tm, field, t0) (adds `core.now() - t0`; nothing when `tm` is nil)
function _M.add(tm, field, t0)
  if tm then tm[field] = tm[field] + (now() - t0) end
end

--- The timings table of `tm` (a copy; `total` up to now, and the time since
-- its last phase in `finish`).
-- syntax: t = metrics.timings(tm) (the `r.timings` table)
function _M.timings(tm)
  local out = {}
  for _, f in pairs(_M.FIELDS) do out[f] = tm[f] end
  local t = now()
  out.total = t - tm.t0
  if tm.locked then
    out.finish = tm.finish + (t - tm.mark)
  else
    out.lock_wait, out.finish = out.total, 0 -- (the lock was never had)
  end
  return out
end

-- The log level of each event for the `log` hook (the rest: "debug"; any
-- event with `ok = false`: "warn").
local EVENT_LEVEL = { lease_floor = "warn", lease_failed = "warn", memory_lost = "warn", create = "info",
  kill = "info", recycle = "info", retry = "info", gc_kill = "info" }

--- One event to the hooks: `on_event(name, info)`, then
-- `log(level, "warmbox: <name> (<where>)", info)`; either may be nil.
-- syntax: metrics.emit(on_event, log, name, info, where) (one event to both hooks; the level table is here)
function _M.emit(on_event, log_fn, name, info, where)
  if on_event then on_event(name, info) end
  if log_fn then
    local level = EVENT_LEVEL[name] or "debug"
    if type(info) == "table" and info.ok == false then level = "warn" end
    log_fn(level, "warmbox: " .. name .. (where and (" (" .. where .. ")") or ""), info)
  end
end

local function bucket(seconds)
  if seconds <= _M.BASE then return 1 end
  return min(_M.BUCKETS, max(1, ceil(log(seconds / _M.BASE) / LOG_RATIO) + 1))
end

local function inc(t, k)
  t[k] = (t[k] or 0) + 1
end

--- Counts one run into `counters`: its outcome (a result `r`, else `code`),
-- how its sandbox was had, and its total latency.
-- syntax: metrics.count_run(counters, r, code, total)
function _M.count_run(counters, r, code, total)
  inc(counters, "runs")
  if r then
    inc(counters, r.error ~= nil and "runs_error" or "runs_ok")
    inc(counters, (r.resumed and "resume") or (r.reused and "reuse") or "create")
  else
    inc(counters, "runs_failed")
    local codes = counters.codes or {}
    counters.codes = codes
    inc(codes, code or "?")
  end
  local h = counters.latency or { n = 0 }
  counters.latency = h
  h.n = h.n + 1
  inc(h, bucket(total))
end

local function quantile(h, q)
  local want, seen = q * h.n, 0
  for i = 1, _M.BUCKETS do
    seen = seen + (h[i] or 0)
    if seen >= want then return _M.BASE * _M.RATIO ^ (i - 1) end
  end
  return _M.BASE * _M.RATIO ^ (_M.BUCKETS - 1)
end

--- A copy of `counters` for `stats()`: `defaults` for the counters not yet
-- counted, `codes` copied, the histogram as `latency = { count, p50, p90, p99 }`.
-- syntax: out = metrics.stats(counters, defaults) (wb:stats's copy, quantiles from the histogram)
function _M.stats(counters, defaults)
  local out = { runs = 0, runs_ok = 0, runs_error = 0, runs_failed = 0, reuse = 0, resume = 0, create = 0 }
  for k, v in pairs(defaults or {}) do out[k] = v end
  for k, v in pairs(counters) do
    if type(v) == "number" then out[k] = v end
  end
  out.codes = {}
  for k, v in pairs(counters.codes or {}) do out.codes[k] = v end
  local h = counters.latency
  if h and h.n > 0 then
    out.latency = { count = h.n, p50 = quantile(h, 0.5), p90 = quantile(h, 0.9), p99 = quantile(h, 0.99) }
  else
    out.latency = { count = 0 }
  end
  return out
end

return _M
