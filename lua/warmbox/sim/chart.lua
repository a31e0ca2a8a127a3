--- warmbox.sim.chart: an SVG scatter chart of simulator rows (plain text).
--
--   local svg = require("warmbox.sim.chart").chart(rows, { x = "compute_cost", y = "p95_ms" })
--
-- One point (`<circle>`) per row, labelled with the swept value, joined by a
-- line in row order; axes with five ticks each.
-- @module warmbox.sim.chart

local errors = require "warmbox.errors"

local type, ipairs, tostring, error, math_type =
  type, ipairs, tostring, error, math.type
local string_format, table_concat, math_min, math_max, math_abs, math_floor, math_ceil, math_log =
  string.format, table.concat, math.min, math.max, math.abs, math.floor, math.ceil, math.log

local _M = {}

--- Axis titles of the metrics a chart is usually drawn with.
_M.LABELS = {
  compute_cost = "compute cost ($)", cost = "total cost ($)", p50_ms = "p50 added latency (ms)",
  p95_ms = "p95 added latency (ms)", p99_ms = "p99 added latency (ms)", mean_ms = "mean added latency (ms)",
  cold_starts = "cold starts", resumes = "resumes", warm_hits = "warm hits", paused_seconds = "paused sandbox-seconds",
  compute_seconds = "running sandbox-seconds", gc_kills = "GC kills", alive = "sandboxes alive at the end",
  value = "swept value",
}

local function esc(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;",
    ["'"] = "&#39;" }))
end
_M.escape = esc

local function num(v)
  if math_type(v) == "integer" then return tostring(v) end
  local a = math_abs(v)
  if a == 0 then return "0" end
  if a >= 1000 then return string_format("%.0f", v) end
  if a >= 1 then return (string_format("%.2f", v):gsub("%.?0+$", "")) end
  local digits = math_max(2, 2 - math_floor(math_log(a, 10)))
  return (string_format("%." .. digits .. "f", v):gsub("0+$", ""))
end

-- A round tick step (1, 2 or 5 times a power of ten) near `raw`.
local function nice_step(raw)
  if raw <= 0 then return 1 end
  local p = 10 ^ math_floor(math_log(raw, 10))
  local f = raw / p
  local m = f <= 1 and 1 or f <= 2 and 2 or f <= 5 and 5 or 10
  return m * p
end

local KEYS = { x = true, y = true, title = true, width = true, height = true }

-- The rows' points `{ x, y, label, name }`; raises at error level `level` when a row lacks a number.
local function chart_points(rows, xk, yk, level)
  local pts = {}
  for i, r in ipairs(rows) do
    local x, y = r[xk], r[yk]
    if type(x) ~= "number" or type(y) ~= "number" then
      error(string_format("bad argument #1 to 'chart' (row %d has no number '%s' and '%s')", i, xk, yk), level)
    end
    pts[i] = { x = x, y = y, label = r.param and tostring(r.value) or tostring(r.policy or i),
               name = r.param and string_format("%s=%s", r.param, tostring(r.value)) or tostring(r.policy or i) }
  end
  return pts
end

-- The axes' ranges and tick steps for the points: x0, x1, y0, y1, xstep, ystep (y starts at 0 or below).
local function chart_bounds(pts)
  local x0, x1, y0, y1 = math.huge, -math.huge, 0, -math.huge
  for _, p in ipairs(pts) do
    x0, x1 = math_min(x0, p.x), math_max(x1, p.x)
    y0, y1 = math_min(y0, p.y), math_max(y1, p.y)
  end
  if #pts == 0 then x0, x1, y1 = 0, 1, 1 end
  if x1 - x0 <= 0 then x0, x1 = x0 - math_max(math_abs(x0) * 0.1, 1e-9), x1 + math_max(math_abs(x1) * 0.1, 1e-9) end
  if y1 - y0 <= 0 then y1 = y0 + math_max(math_abs(y0) * 0.1, 1) end
  local padx = (x1 - x0) * 0.08
  x0, x1, y1 = x0 - padx, x1 + padx, y1 + (y1 - y0) * 0.08
  local xstep, ystep = nice_step((x1 - x0) / 5), nice_step((y1 - y0) / 5)
  x0, x1 = math_floor(x0 / xstep) * xstep, math_ceil(x1 / xstep) * xstep
  y0, y1 = math_floor(y0 / ystep) * ystep, math_ceil(y1 / ystep) * ystep
  return x0, x1, y0, y1, xstep, ystep
end

-- Adds the points to the SVG: a line joining them in row order, then a titled, labelled circle each.
local function draw_points(add, pts, sx, sy, ml, pw, xl, yl)
  if #pts > 1 then
    local path = {}
    for i, p in ipairs(pts) do path[i] = string_format("%.1f,%.1f", sx(p.x), sy(p.y)) end
    add('<polyline points="%s" fill="none" stroke="#1f77b4" stroke-opacity="0.5"/>', table_concat(path, " "))
  end
  for _, p in ipairs(pts) do
    add('<circle cx="%.1f" cy="%.1f" r="5" fill="#1f77b4"><title>%s: %s %s, %s %s</title></circle>',
      sx(p.x), sy(p.y), esc(p.name), esc(xl), esc(num(p.x)), esc(yl), esc(num(p.y)))
    local right = sx(p.x) > ml + pw * 0.85
    add('<text x="%.1f" y="%.1f" font-size="11"%s>%s</text>', sx(p.x) + (right and -8 or 8), sy(p.y) - 8,
      right and ' text-anchor="end"' or "", esc(p.label))
  end
end

--- Build the SVG.
-- @tparam table rows sweep rows (or reports); each needs numbers under `x` and `y`
-- @tparam[opt] table opts `x` ("compute_cost"), `y` ("p95_ms"), `title`, `width` (640), `height` (420)
-- @treturn string an SVG document
function _M.chart(rows, opts, level)
  level = (level or 1) + 1
  if type(rows) ~= "table" then
    error("bad argument #1 to 'chart' (table expected, got " .. type(rows) .. ")", level)
  end
  if rows.runs then rows = { rows } end
  opts = errors.check_options(opts, KEYS, "chart", 2, level)
  local xk, yk = opts.x or "compute_cost", opts.y or "p95_ms"
  local W, H = opts.width or 640, opts.height or 420
  local ml, mr, mt, mb = 80, 30, 40, 56
  local pts = chart_points(rows, xk, yk, level + 1)
  local x0, x1, y0, y1, xstep, ystep = chart_bounds(pts)
  local pw, ph = W - ml - mr, H - mt - mb
  local function sx(x) return ml + (x - x0) / (x1 - x0) * pw end
  local function sy(y) return mt + ph - (y - y0) / (y1 - y0) * ph end
  local out = {}
  local function add(...) out[#out + 1] = string_format(...) end
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
    .. 'font-family="sans-serif" font-size="12">', W, H, W, H)
  add('<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>', W, H)
  local xl, yl = _M.LABELS[xk] or xk, _M.LABELS[yk] or yk
  add('<text x="%d" y="22" text-anchor="middle" font-size="15">%s</text>', W // 2,
    esc(opts.title or (yl .. " vs " .. xl)))
  -- axes and ticks
  add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333333"/>', ml, mt + ph, ml + pw, mt + ph)
  add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333333"/>', ml, mt, ml, mt + ph)
  for i = 0, math_floor((x1 - x0) / xstep + 0.5) do
    local xv = x0 + i * xstep
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333333"/>', sx(xv), mt + ph, sx(xv), mt + ph + 5)
    add('<text x="%.1f" y="%d" text-anchor="middle">%s</text>', sx(xv), mt + ph + 18, esc(num(xv)))
  end
  for i = 0, math_floor((y1 - y0) / ystep + 0.5) do
    local yv = y0 + i * ystep
    add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#dddddd"/>', ml, sy(yv), ml + pw, sy(yv))
    add('<text x="%d" y="%.1f" text-anchor="end">%s</text>', ml - 6, sy(yv) + 4, esc(num(yv)))
  end
  if rows[1] and rows[1].param then
    add('<text x="%d" y="%d" text-anchor="end" fill="#555555">points: %s</text>', ml + pw, mt - 6, esc(rows[1].param))
  end
  add('<text x="%d" y="%d" text-anchor="middle">%s</text>', ml + pw // 2, H - 12, esc(xl))
  add('<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>', mt + ph // 2,
    mt + ph // 2, esc(yl))
  draw_points(add, pts, sx, sy, ml, pw, xl, yl)
  add("</svg>")
  return table_concat(out, "\n") .. "\n"
end

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

--- Draw the same chart with gnuplot (a data file and a script in a temporary
-- directory, removed afterwards).
-- @treturn[1] true
-- @return[2] nil, message
function _M.gnuplot(rows, path, opts, cmd)
  if rows.runs then rows = { rows } end
  opts = opts or {}
  local xk, yk = opts.x or "compute_cost", opts.y or "p95_ms"
  local dir = os.tmpname()
  os.remove(dir)
  if not os.execute("mkdir -p " .. sh_quote(dir)) then return nil, "cannot make a temporary directory" end
  local data = {}
  for i, r in ipairs(rows) do
    local label = (r.param and tostring(r.value) or tostring(r.policy or i)):gsub("[%s\"]", "_")
    data[#data + 1] = string_format("%.10g %.10g \"%s\"", r[xk], r[yk], label)
  end
  local df = io.open(dir .. "/data", "w")
  df:write(table_concat(data, "\n"), "\n")
  df:close()
  local png = path:lower():match("%.png$")
  local xl, yl = _M.LABELS[xk] or xk, _M.LABELS[yk] or yk
  local function gq(s) return '"' .. tostring(s):gsub('[\\"]', "\\%0") .. '"' end
  local script = table_concat({
    png and "set terminal pngcairo size 640,420" or "set terminal svg size 640,420",
    "set output " .. gq(path),
    "set title " .. gq(opts.title or (yl .. " vs " .. xl)),
    "set xlabel " .. gq(xl), "set ylabel " .. gq(yl), "set grid ytics", "unset key",
    "plot " .. gq(dir .. "/data") .. " using 1:2 with linespoints pt 7, '' using 1:2:3 with labels offset 1,1",
  }, "\n") .. "\n"
  local sf = io.open(dir .. "/plot.gp", "w")
  sf:write(script)
  sf:close()
  local ok = os.execute(cmd .. " " .. sh_quote(dir .. "/plot.gp") .. " >/dev/null 2>&1")
  os.execute("rm -rf " .. sh_quote(dir))
  if not ok then return nil, "gnuplot failed" end
  return true
end

return _M
