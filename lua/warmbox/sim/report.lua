--- warmbox.sim.report: what a simulation reports (`warmbox.sim` exports the
-- public names): the prices and the costs by sandbox size, the latency
-- percentiles, and the rows as a text table, CSV or a chart.
-- @module warmbox.sim.report

local chart_mod = require "warmbox.sim.chart"

local type, pairs, ipairs, tostring, error = type, pairs, ipairs, tostring, error
local string_format, table_sort, table_concat, math_floor, math_ceil, math_max =
  string.format, table.sort, table.concat, math.floor, math.ceil, math.max
local io_open, math_type = io.open, math.type

local _M = {}

--- E2B's published rates (its pricing page, FAQ "How do I calculate the price of a
-- sandbox?": billed per second while running, $0.000014 per vCPU-second and
-- $0.0000045 per GiB-second; "Paused and killed sandboxes are not billed").
-- A sandbox's size comes from its template (`sim.model.TEMPLATE_SIZES`) or
-- the run's `size`; `paused_second` prices paused storage for other providers
-- or checkpoint storage (0 at E2B).
_M.PRICES = {
  vcpu_second = 0.000014,   -- $ per vCPU-second while running
  gib_second = 0.0000045,   -- $ per GiB-RAM-second while running
  paused_second = 0,        -- $ per paused sandbox-second (E2B: not billed)
  -- $ per GiB-month (730 h) a checkpoint (persistent snapshot) stores: E2B's pricing page and
  -- its FAQ "How do I calculate the price of a sandbox?" name no price for snapshots (disk is
  -- "Included"), so 0 unless given
  snapshot_gib_month = 0,
}
--- Hours in the month `snapshot_gib_month` prices (730: a year's 8760 / 12, as cloud storage bills).
_M.MONTH_HOURS = 730

--- The nearest-rank percentile of a sorted list (nil when empty).
function _M.percentile(sorted, p)
  local n = #sorted
  if n == 0 then return nil end
  local k = math_ceil(p / 100 * n)
  if k < 1 then k = 1 end
  return sorted[k]
end

-- Running seconds by size ("CPUxMB" keys) priced at E2B's rates: a list of
-- { cpu_count, memory_mb, seconds, cost } (by size) and the total cost.
local function compute_by_size(by, prices)
  local keys = {}
  for k in pairs(by) do keys[#keys + 1] = k end
  table_sort(keys)
  local out, total = {}, 0
  for i, k in ipairs(keys) do
    local cpu, mb = k:match("^(%d+)x(%d+)$")
    cpu, mb = tonumber(cpu), tonumber(mb)
    local cost = by[k] * (cpu * prices.vcpu_second + mb / 1024 * prices.gib_second)
    out[i] = { cpu_count = cpu, memory_mb = mb, seconds = by[k], cost = cost }
    total = total + cost
  end
  return out, total
end

-- The checkpoints of a finished run: taken, deleted, peak, GiB-hours stored and their cost.
local function model_checkpoints(report, model, prices)
  local st = model.stats
  report.checkpoints_taken, report.checkpoints_deleted = st.snapshots, st.snapshots_deleted
  report.peak_checkpoints, report.checkpoints_alive = st.peak_snapshots, model.nsnaps
  report.checkpoint_gib_hours = st.snapshot_gib_seconds / 3600
  report.checkpoint_cost = report.checkpoint_gib_hours / _M.MONTH_HOURS * prices.snapshot_gib_month
end

-- Fills a finished run's report: latency percentiles, costs, the model's counts, and details when asked.
local function finish_report(report, o, model, prices, latencies, nlat, log, t0)
  local alive = model:close_books()

  table_sort(latencies)
  local sum = 0
  for i = 1, nlat do sum = sum + latencies[i] end
  report.p50_ms = _M.percentile(latencies, 50) or 0
  report.p95_ms = _M.percentile(latencies, 95) or 0
  report.p99_ms = _M.percentile(latencies, 99) or 0
  report.max_ms = latencies[nlat] or 0
  report.mean_ms = nlat > 0 and sum / nlat or 0
  local st = model.stats
  report.compute_seconds = st.running_seconds
  report.compute_by_size, report.compute_cost = compute_by_size(st.running_by_size, prices)
  report.paused_seconds = st.paused_seconds
  report.paused_hours = st.paused_seconds / 3600
  report.storage_cost = st.paused_seconds * prices.paused_second
  model_checkpoints(report, model, prices)
  report.cost = report.compute_cost + report.storage_cost + report.checkpoint_cost
  report.created = st.creates
  report.model_resumes = st.resumes
  report.pauses = st.pauses
  report.kills = st.kills
  report.timeout_kills = st.timeout_kills
  report.requests = st.requests
  report.requests_per_run = report.runs > 0 and st.requests / report.runs or 0
  report.auto_pauses = st.auto_pauses
  report.paused_during_run = st.paused_during_run
  report.rejected_cap, report.rejected_rate, report.retries = st.rejected_cap, st.rejected_rate, st.retries
  report.retry_after_waits = st.retry_after_waits
  report.prewarm = o.prewarm == "jit" and "jit" or (o.prewarm and true or false)
  report.prewarms = report.prewarms or 0
  report.prewarms_unused, report.prewarms_failed = report.prewarms_unused or 0, report.prewarms_failed or 0
  report.prewarm_creates, report.prewarm_resumes = report.prewarm_creates or 0, report.prewarm_resumes or 0
  report.peak_running = st.peak_running
  report.alive_running, report.alive_paused = alive.running, alive.paused
  report.alive = alive.running + alive.paused
  report.simulated_seconds = model.now - t0
  if o.details then
    report.sandboxes = model:sandboxes()
    report.latencies_ms = latencies
    report.log = log
  end
  return report
end

-- ------------------------------------------------------------------
-- output: a text table and a chart
-- ------------------------------------------------------------------

local COLUMNS = {
  { "runs", "runs", "%d" }, { "cold", "cold_starts", "%d" }, { "resumes", "resumes", "%d" },
  { "warm", "warm_hits", "%d" }, { "failed", "failed", "%d" }, { "lost state", "conversations_lost_state", "%d" },
  { "p50 ms", "p50_ms", "%.0f" }, { "p95 ms", "p95_ms", "%.0f" }, { "p99 ms", "p99_ms", "%.0f" },
  { "compute s", "compute_seconds", "%.0f" }, { "compute $", "compute_cost", "%.4f" },
  { "paused h", "paused_hours", "%.1f" }, { "storage $", "storage_cost", "%.4f" },
  { "gc kills", "gc_kills", "%d" }, { "alive", "alive", "%d" },
}
_M.COLUMNS = COLUMNS

-- The fields of a CSV row, in order.
local CSV_FIELDS = { "policy", "param", "value", "conversations", "runs", "ok", "failed", "cold_starts", "resumes",
  "warm_hits", "conversations_lost_state", "turns_lost_state", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms",
  "compute_seconds", "compute_cost", "paused_seconds", "paused_hours", "storage_cost", "cost", "created",
  "model_resumes", "pauses", "auto_pauses", "kills", "timeout_kills", "gc_passes", "gc_kills", "gc_demoted",
  "requests", "requests_per_run", "rejected_cap", "rejected_rate", "retries", "peak_running", "paused_during_run",
  "alive", "exec_timeout", "idle_timeout", "max_age", "gc_every", "paused_price_hour", "simulated_seconds", "path",
  "prewarm", "prewarms", "prewarms_unused", "prewarms_failed", "prewarm_creates", "prewarm_resumes", "turns",
  "retry_after_waits", "checkpoints_taken", "checkpoints_deleted", "peak_checkpoints", "checkpoints_alive",
  "checkpoint_gib_hours", "checkpoint_cost" }
_M.CSV_FIELDS = CSV_FIELDS

--- Rows as CSV text: a header line, then one line per row (fields in
-- `CSV_FIELDS`; text fields never hold a comma or a quote here, so none is quoted).
-- @tparam table rows a report or a list of them
-- @treturn string
function _M.csv(rows)
  if type(rows) ~= "table" then error("bad argument #1 to 'csv' (table expected, got " .. type(rows) .. ")", 2) end
  if rows.runs then rows = { rows } end
  local out = { table_concat(CSV_FIELDS, ",") }
  for _, r in ipairs(rows) do
    local line = {}
    for i, k in ipairs(CSV_FIELDS) do
      local v = r[k]
      if k == "paused_price_hour" then v = (r.prices and r.prices.paused_second or 0) * 3600 end
      if type(v) == "boolean" then
        line[i] = tostring(v)
      elseif type(v) == "number" then
        line[i] = math_type(v) == "integer" and string_format("%d", v) or string_format("%.10g", v)
      elseif v == nil then
        line[i] = ""
      else
        line[i] = (tostring(v):gsub("[,\"\r\n]", " "))
      end
    end
    out[#out + 1] = table_concat(line, ",")
  end
  return table_concat(out, "\n") .. "\n"
end

-- The footer of a table: the sizes compute was priced at, the rates and their source, the storage price.
local function price_note(rows)
  local prices = rows[1] and rows[1].prices or _M.PRICES
  local sizes, seen = {}, {}
  for _, r in ipairs(rows) do
    for _, z in ipairs(r.compute_by_size or {}) do
      local name = string_format("%d vCPU / %d MiB", z.cpu_count, z.memory_mb)
      if not seen[name] then seen[name], sizes[#sizes + 1] = true, name end
    end
  end
  local function usd(v) return (string_format("%.9f", v):gsub("0+$", ""):gsub("%.$", "")) end
  local cp_price, cps = prices.snapshot_gib_month or 0, false
  for _, r in ipairs(rows) do cps = cps or (r.checkpoints_taken or 0) > 0 end
  local cp_line = (cps or cp_price > 0) and string_format("checkpoint storage: $%s per GiB-month%s\n", usd(cp_price),
    cp_price == 0 and " (E2B publishes no snapshot price)" or " (assumed)") or ""
  return string_format("compute by size: %s, at $%s per vCPU-second and $%s per GiB-second (E2B's pricing page)\n"
    .. "paused storage: $%s per sandbox-hour%s\n%s", #sizes > 0 and table_concat(sizes, ", ") or "none",
    usd(prices.vcpu_second), usd(prices.gib_second), usd(prices.paused_second * 3600),
    prices.paused_second == 0 and " (E2B bills paused sandboxes nothing)" or " (assumed)", cp_line)
end

-- The columns `format` shows: COLUMNS, plus the prewarm counts when a row
-- prewarmed, and the checkpoints' when a row took any.
local function format_columns(rows)
  local prewarm, cps = false, false
  for _, r in ipairs(rows) do
    prewarm = prewarm or r.prewarm
    cps = cps or (r.checkpoints_taken or 0) > 0
  end
  if not prewarm and not cps then return COLUMNS end
  local columns = { table.unpack(COLUMNS) }
  if prewarm then
    columns[#columns + 1] = { "prewarms", "prewarms", "%d" }
    columns[#columns + 1] = { "unused", "prewarms_unused", "%d" }
  end
  if cps then
    columns[#columns + 1] = { "checkpoints", "checkpoints_taken", "%d" }
    columns[#columns + 1] = { "cp deleted", "checkpoints_deleted", "%d" }
    columns[#columns + 1] = { "cp peak", "peak_checkpoints", "%d" }
    columns[#columns + 1] = { "cp GiB-h", "checkpoint_gib_hours", "%.1f" }
    columns[#columns + 1] = { "cp $", "checkpoint_cost", "%.4f" }
  end
  return columns
end

-- Lines of cells as text lines: the first column left-aligned, the others right-aligned.
local function align(lines)
  local widths = {}
  for _, l in ipairs(lines) do
    for i, cell in ipairs(l) do widths[i] = math_max(widths[i] or 0, #cell) end
  end
  local out = {}
  for _, l in ipairs(lines) do
    local cells = {}
    for i, cell in ipairs(l) do
      cells[i] = i == 1 and cell .. (" "):rep(widths[i] - #cell) or (" "):rep(widths[i] - #cell) .. cell
    end
    out[#out + 1] = table_concat(cells, "  ")
  end
  return out
end

-- One "failures (...): CODE=n, ..." line per row that had failures.
local function failure_lines(rows)
  local failures = {}
  for _, r in ipairs(rows) do
    local codes = {}
    for c, n in pairs(r.failures or {}) do codes[#codes + 1] = string_format("%s=%d", c, n) end
    table_sort(codes)
    if #codes > 0 then
      failures[#failures + 1] = string_format("failures (%s%s %s): %s", r.series and (tostring(r.series) .. " ") or "",
        tostring(r.param or "policy"), tostring(r.param and r.value or r.policy), table_concat(codes, ", "))
    end
  end
  return failures
end

--- Format reports (or sweep rows) as a text table, one line per row.
-- @tparam table rows a report or a list of them
-- @treturn string
function _M.format(rows)
  if type(rows) ~= "table" then error("bad argument #1 to 'format' (table expected, got " .. type(rows) .. ")", 2) end
  if rows.runs then rows = { rows } end
  -- rows of several policies over a sweep (`series`: the policy): both columns
  local series = rows[1] and rows[1].series ~= nil
  local header = { rows[1] and rows[1].param or "policy" }
  if series then header = { "policy", header[1] } end
  local columns = format_columns(rows)
  for _, c in ipairs(columns) do header[#header + 1] = c[1] end
  local lines = { header }
  for _, r in ipairs(rows) do
    local line = { r.param and tostring(r.value) or tostring(r.policy) }
    if series then line = { tostring(r.series), line[1] } end
    for _, c in ipairs(columns) do
      local v = r[c[2]] or 0
      line[#line + 1] = string_format(c[3], c[3] == "%d" and math_floor(v) or v)
    end
    lines[#lines + 1] = line
  end
  local out = align(lines)
  local failures = failure_lines(rows)
  local note = price_note(rows)
  return table_concat(out, "\n") .. "\n" .. (#failures > 0 and table_concat(failures, "\n") .. "\n" or "") .. note
end

--- Draw the chart: a PNG for a `.png` path (matplotlib, else gnuplot; see
-- `warmbox.sim.chart.png`: never SVG bytes in a .png), else the built-in SVG.
-- @tparam table rows
-- @tparam string path the image to write
-- @tparam[opt] table opts `x`, `y`, `title` (as `chart`), `python`, `gnuplot` (commands, or
--   false: not that one)
-- @treturn[1] string "svg", "matplotlib" or "gnuplot" (what drew it)
-- @return[2] nil, message, "IO" | "NOT_FOUND" (a PNG asked for, and nothing to draw it)
function _M.plot(rows, path, opts)
  if type(path) ~= "string" then error("bad argument #2 to 'plot' (string expected, got " .. type(path) .. ")", 2) end
  opts = opts or {}
  local copts = { x = opts.x, y = opts.y, title = opts.title }
  local svg = chart_mod.chart(rows, copts, 2)  -- also checks the rows and options
  if path:lower():match("%.png$") then
    return chart_mod.png(rows, path, { x = opts.x, y = opts.y, title = opts.title, python = opts.python,
      gnuplot = opts.gnuplot })
  end
  local f, err = io_open(path, "wb")
  if not f then return nil, "cannot write " .. path .. ": " .. tostring(err), "IO" end
  f:write(svg)
  f:close()
  return "svg"
end

--- An SVG chart of sweep rows (see `warmbox.sim.chart`).
-- @tparam table rows
-- @tparam[opt] table opts
-- @treturn string SVG text
function _M.chart(rows, opts)
  local svg = chart_mod.chart(rows, opts, 2)
  return svg
end

_M.finish_report = finish_report
return _M
