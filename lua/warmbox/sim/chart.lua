--- warmbox.sim.chart: charts of simulator rows, cost against latency.
--
--   local svg = require("warmbox.sim.chart").chart(rows, { x = "compute_cost", y = "p95_ms" })
--   local how = assert(require("warmbox.sim.chart").png(rows, "out.png"))   -- matplotlib, else gnuplot
--
-- One point per row. Rows form series: the rows of one policy over a swept
-- parameter are one series (a line joins them in the parameter's order, each
-- point labelled with its value); different policies are different series
-- (own colour, in the legend, never joined to each other). A point whose
-- conversations lost their state is ringed in black and says how many. Both
-- axes start at zero. The SVG is text built here; a PNG is drawn by
-- matplotlib (Debian's python3-matplotlib) or gnuplot's pngcairo, never by hand.
-- @module warmbox.sim.chart

local errors = require "warmbox.errors"

local type, ipairs, pairs, tostring, tonumber, error, math_type =
  type, ipairs, pairs, tostring, tonumber, error, math.type
local string_format, table_concat, math_max, math_abs, math_floor, math_ceil, math_log =
  string.format, table.concat, math.max, math.abs, math.floor, math.ceil, math.log

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

-- Series colours (matplotlib's tab10, which the PNG uses too).
local COLOURS = { "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf" }
_M.COLOURS = COLOURS

--- The numeric fields a chart can use (those of the first row), sorted.
function _M.metrics(rows)
  local r = rows and (rows.runs and rows or rows[1])
  local out = {}
  for k, v in pairs(type(r) == "table" and r or {}) do
    if type(v) == "number" then out[#out + 1] = k end
  end
  table.sort(out)
  return out
end

-- The series a row belongs to: its policy when rows compare policies (over a
-- sweep or not), else one series for all the rows of a sweep.
local function series_name(r)
  if r.series then return tostring(r.series) end
  if r.param == "policy" then return tostring(r.value) end
  return tostring(r.policy or "rows")
end

-- Sets each point's `text`, the label drawn beside it: its swept value, or
-- its policy's name when policies are compared, and "lost state: N" when its
-- conversations lost their state. Points at one place (two policies that
-- behave alike) share one label naming them all, so no label hides another.
local function annotate(list)
  local at, order = {}, {}
  for _, s in ipairs(list) do
    for _, p in ipairs(s.points) do
      local k = string_format("%.6g|%.6g", p.x, p.y)
      if not at[k] then
        at[k] = {}
        order[#order + 1] = k
      end
      local g = at[k]
      g[#g + 1] = p
      p.text = ""
    end
  end
  for _, k in ipairs(order) do
    local g = at[k]
    local names, seen, labels, lseen = {}, {}, {}, {}
    for _, p in ipairs(g) do
      if not seen[p.series] then
        seen[p.series] = true
        names[#names + 1] = p.series
      end
      if p.label ~= "" and not lseen[p.label] then
        lseen[p.label] = true
        labels[#labels + 1] = p.label
      end
    end
    local label = table_concat(labels, ", ")
    local text
    if label == "" then
      text = table_concat(names, ", ")
      if #list == 1 then text = "" end
    else
      text = #names > 1 and (table_concat(names, ", ") .. ": " .. label) or label
    end
    if g[1].lost > 0 then text = (text ~= "" and text .. "; " or "") .. "lost state: " .. g[1].lost end
    g[1].text = text
  end
end

-- The rows as series `{ name, joined, points = { { x, y, label, name, lost } } }`
-- in order of first appearance; raises at `level` when a row lacks a number.
local function series_of(rows, xk, yk, level)
  local list, by = {}, {}
  for i, r in ipairs(rows) do
    local x, y = r[xk], r[yk]
    if type(x) ~= "number" or type(y) ~= "number" then
      error(string_format("bad argument #1 to 'chart' (row %d has no number '%s' and '%s')", i, xk, yk), level)
    end
    local sname = series_name(r)
    local s = by[sname]
    if not s then
      s = { name = sname, points = {}, joined = r.param ~= nil and r.param ~= "policy" }
      by[sname] = s
      list[#list + 1] = s
    end
    local swept = r.param and r.param ~= "policy"
    s.points[#s.points + 1] = { x = x, y = y, label = swept and tostring(r.value) or "",
      name = swept and string_format("%s %s=%s", sname, r.param, tostring(r.value)) or sname,
      lost = math_floor(tonumber(r.conversations_lost_state) or 0), series = sname }
  end
  annotate(list)
  return list
end


-- The axes' ranges and tick steps: x1, y1, xstep, ystep (both axes from 0).
local function chart_bounds(list)
  local x1, y1 = 0, 0
  for _, s in ipairs(list) do
    for _, p in ipairs(s.points) do x1, y1 = math_max(x1, p.x), math_max(y1, p.y) end
  end
  if x1 <= 0 then x1 = 1 end
  if y1 <= 0 then y1 = 1 end
  local xstep, ystep = nice_step(x1 * 1.1 / 5), nice_step(y1 * 1.12 / 5)
  return math_ceil(x1 * 1.1 / xstep) * xstep, math_ceil(y1 * 1.12 / ystep) * ystep, xstep, ystep
end

-- Adds the series to the SVG: per series a line (a sweep), its points, their
-- labels; a red ring and a note on points whose conversations lost state.
local function draw_series(add, list, sx, sy)
  for i, s in ipairs(list) do
    local dy = i % 2 == 1 and -8 or 16 -- every other series' labels below its points
    local colour = COLOURS[(i - 1) % #COLOURS + 1]
    if s.joined and #s.points > 1 then
      local path = {}
      for j, p in ipairs(s.points) do path[j] = string_format("%.1f,%.1f", sx(p.x), sy(p.y)) end
      add('<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>', table_concat(path, " "), colour)
    end
    for _, p in ipairs(s.points) do
      if p.lost > 0 then
        add('<circle cx="%.1f" cy="%.1f" r="9" fill="none" stroke="#000000" stroke-width="1.5"/>', sx(p.x), sy(p.y))
      end
      add('<circle cx="%.1f" cy="%.1f" r="5" fill="%s"><title>%s</title></circle>', sx(p.x), sy(p.y), colour,
        esc(p.name))
      local text = p.text
      if text ~= "" then
        add('<text x="%.1f" y="%.1f" font-size="11" fill="%s">%s</text>', sx(p.x) + 8, sy(p.y) + dy, colour, esc(text))
      end
    end
  end
end

-- The legend: a swatch and the name of each series, top left inside the plot.
local function draw_legend(add, list, ml, mt)
  if #list < 2 and not (list[1] and list[1].joined) then return end
  for i, s in ipairs(list) do
    local y = mt + 8 + (i - 1) * 16
    add('<rect x="%d" y="%d" width="10" height="10" fill="%s"/>', ml + 10, y, COLOURS[(i - 1) % #COLOURS + 1])
    add('<text x="%d" y="%d" font-size="12">%s</text>', ml + 26, y + 9, esc(s.name))
  end
end

-- The chart's title: the caller's, else "Y vs X", with what the points are.
local function title_of(opts, rows, xl, yl)
  if opts.title then return opts.title end
  local r = rows[1] or {}
  local sweep
  for _, row in ipairs(rows) do
    if row.param and row.param ~= "policy" then sweep = row.param end
  end
  local what = sweep and (" (points: " .. sweep .. ")") or (r.param == "policy" and " by policy" or "")
  return yl .. " vs " .. xl .. what
end

--- Build the SVG.
-- @tparam table rows sweep rows (or reports); each needs numbers under `x` and `y`
-- @tparam[opt] table opts `x` ("compute_cost"), `y` ("p95_ms"), `title`, `width` (720), `height` (460)
-- @treturn string an SVG document
function _M.chart(rows, opts, level)
  level = (level or 1) + 1
  if type(rows) ~= "table" then
    error("bad argument #1 to 'chart' (table expected, got " .. type(rows) .. ")", level)
  end
  if rows.runs then rows = { rows } end
  opts = errors.check_options(opts, KEYS, "chart", 2, level)
  local xk, yk = opts.x or "compute_cost", opts.y or "p95_ms"
  local W, H = opts.width or 720, opts.height or 460
  local ml, mr, mt, mb = 80, 40, 40, 56
  local list = series_of(rows, xk, yk, level + 1)
  local x1, y1, xstep, ystep = chart_bounds(list)
  local pw, ph = W - ml - mr, H - mt - mb
  local function sx(x) return ml + x / x1 * pw end
  local function sy(y) return mt + ph - y / y1 * ph end
  local out = {}
  local function add(...) out[#out + 1] = string_format(...) end
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
    .. 'font-family="sans-serif" font-size="12">', W, H, W, H)
  add('<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>', W, H)
  local xl, yl = _M.LABELS[xk] or xk, _M.LABELS[yk] or yk
  add('<text x="%d" y="22" text-anchor="middle" font-size="15">%s</text>', W // 2, esc(title_of(opts, rows, xl, yl)))
  add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333333"/>', ml, mt + ph, ml + pw, mt + ph)
  add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333333"/>', ml, mt, ml, mt + ph)
  for i = 0, math_floor(x1 / xstep + 0.5) do
    local xv = i * xstep
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333333"/>', sx(xv), mt + ph, sx(xv), mt + ph + 5)
    add('<text x="%.1f" y="%d" text-anchor="middle">%s</text>', sx(xv), mt + ph + 18, esc(num(xv)))
  end
  for i = 0, math_floor(y1 / ystep + 0.5) do
    local yv = i * ystep
    add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#dddddd"/>', ml, sy(yv), ml + pw, sy(yv))
    add('<text x="%d" y="%.1f" text-anchor="end">%s</text>', ml - 6, sy(yv) + 4, esc(num(yv)))
  end
  add('<text x="%d" y="%d" text-anchor="middle">%s</text>', ml + pw // 2, H - 12, esc(xl))
  add('<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>', mt + ph // 2,
    mt + ph // 2, esc(yl))
  draw_series(add, list, sx, sy)
  draw_legend(add, list, ml, mt)
  add("</svg>")
  return table_concat(out, "\n") .. "\n"
end

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- A temporary directory (removed by the caller), or nil.
local function tmpdir()
  local p = io.popen("mktemp -d 2>/dev/null")
  local dir = p and p:read("l")
  if p then p:close() end
  return dir ~= "" and dir or nil
end

-- matplotlib's part: reads the series (JSON) and writes the PNG.
local MATPLOTLIB = [==[
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
spec = json.load(open(sys.argv[1]))
fig, ax = plt.subplots(figsize=(9, 5.2), dpi=110)
labels = []
for i, s in enumerate(spec["series"]):
    colour = spec["colours"][i % len(spec["colours"])]
    xs = [p["x"] for p in s["points"]]
    ys = [p["y"] for p in s["points"]]
    if s["joined"] and len(xs) > 1:
        ax.plot(xs, ys, "-o", color=colour, label=s["name"], markersize=6)
    else:
        ax.plot(xs, ys, "o", color=colour, label=s["name"], markersize=8)
    for p in s["points"]:
        if p["lost"] > 0:
            ax.plot([p["x"]], [p["y"]], "o", markersize=15, markerfacecolor="none", markeredgecolor="black",
                    markeredgewidth=1.5)
        if p["text"]:
            labels.append((p["x"], p["y"], p["text"], colour))
ax.set_xlim(left=0, right=max(1e-9, ax.get_xlim()[1] * 1.05))
ax.set_ylim(bottom=0, top=max(1e-9, ax.get_ylim()[1] * 1.08))
ax.set_xlabel(spec["xlabel"])
ax.set_ylabel(spec["ylabel"])
ax.set_title(spec["title"])
ax.grid(True, color="#e5e5e5")
if len(spec["series"]) > 1 or (spec["series"] and spec["series"][0]["joined"]):
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, borderaxespad=0)
fig.tight_layout()
# Each label goes where it overlaps no label placed before it (a few places
# around its point are tried in turn), so labels stay readable.
fig.canvas.draw()
renderer = fig.canvas.get_renderer()
placed = []
PLACES = [(7, 7, "left"), (7, -15, "left"), (-7, 7, "right"), (-7, -15, "right"), (7, 20, "left"),
          (7, -28, "left"), (-7, 20, "right"), (-7, -28, "right")]
for x, y, text, colour in labels:
    for k, (dx, dy, ha) in enumerate(PLACES):
        t = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), ha=ha, fontsize=9,
                        color=colour)
        bb = t.get_window_extent(renderer=renderer)
        if k == len(PLACES) - 1 or not any(bb.overlaps(o) for o in placed):
            placed.append(bb)
            break
        t.remove()
fig.savefig(sys.argv[2], format="png")
]==]

-- The PNG drawn by matplotlib (`python` runs it). → true | nil, message
local function matplotlib_png(list, path, labels, python)
  local dir = tmpdir()
  if not dir then return nil, "cannot make a temporary directory" end
  local json = require "warmbox.json"
  local series = {}
  for i, s in ipairs(list) do
    local pts = {}
    for j, p in ipairs(s.points) do pts[j] = { x = p.x, y = p.y, text = p.text, lost = p.lost } end
    series[i] = { name = s.name, joined = s.joined, points = pts }
  end
  local f = io.open(dir .. "/spec.json", "w")
  f:write(json.encode({ series = series, colours = COLOURS, xlabel = labels.x, ylabel = labels.y,
    title = labels.title }))
  f:close()
  f = io.open(dir .. "/plot.py", "w")
  f:write(MATPLOTLIB)
  f:close()
  local ok = os.execute(python .. " " .. sh_quote(dir .. "/plot.py") .. " " .. sh_quote(dir .. "/spec.json") .. " "
    .. sh_quote(path) .. " >" .. sh_quote(dir .. "/err") .. " 2>&1")
  local ef = io.open(dir .. "/err")
  local err = ef and ef:read("a") or ""
  if ef then ef:close() end
  os.execute("rm -rf " .. sh_quote(dir))
  if not ok then return nil, "matplotlib failed: " .. (err:match("([^\n]+)\n?$") or "?") end
  return true
end

--- Draw the chart with gnuplot (a data file and a script in a temporary
-- directory, removed afterwards): PNG (pngcairo) for a `.png` path, else SVG.
-- @treturn[1] true
-- @return[2] nil, message
function _M.gnuplot(rows, path, opts, cmd)
  if rows.runs then rows = { rows } end
  opts = opts or {}
  local xk, yk = opts.x or "compute_cost", opts.y or "p95_ms"
  local list = series_of(rows, xk, yk, 2)
  local dir = tmpdir()
  if not dir then return nil, "cannot make a temporary directory" end
  local plots = {}
  local function gq(s) return '"' .. tostring(s):gsub('[\\"]', "\\%0") .. '"' end
  for i, s in ipairs(list) do
    local data = {}
    for j, p in ipairs(s.points) do
      data[j] = string_format("%.10g %.10g \"%s\"", p.x, p.y, (p.text:gsub("[\"]", "_")))
    end
    local df = io.open(dir .. "/data" .. i, "w")
    df:write(table_concat(data, "\n"), "\n")
    df:close()
    local colour = COLOURS[(i - 1) % #COLOURS + 1]
    plots[#plots + 1] = string_format("%s using 1:2 with %s pt 7 lc rgb %s title %s", gq(dir .. "/data" .. i),
      s.joined and "linespoints" or "points", gq(colour), gq(s.name))
    plots[#plots + 1] = string_format("%s using 1:2:3 with labels offset 1,1 tc rgb %s notitle",
      gq(dir .. "/data" .. i), gq(colour))
  end
  local png = path:lower():match("%.png$")
  local xl, yl = _M.LABELS[xk] or xk, _M.LABELS[yk] or yk
  local script = table_concat({
    png and "set terminal pngcairo size 880,572" or "set terminal svg size 720,460",
    "set output " .. gq(path),
    "set title " .. gq(title_of(opts, rows, xl, yl)),
    "set xlabel " .. gq(xl), "set ylabel " .. gq(yl), "set grid", "set xrange [0:*]", "set yrange [0:*]",
    "set key top left",
    "plot " .. table_concat(plots, ", "),
  }, "\n") .. "\n"
  local sf = io.open(dir .. "/plot.gp", "w")
  sf:write(script)
  sf:close()
  local ok = os.execute(cmd .. " " .. sh_quote(dir .. "/plot.gp") .. " >/dev/null 2>&1")
  os.execute("rm -rf " .. sh_quote(dir))
  if not ok then return nil, "gnuplot failed" end
  return true
end

-- The Python that has Debian's python3-matplotlib: /usr/bin/python3 (a
-- python3 earlier on the PATH, say pyenv's, may not), else python3.
local function default_python()
  if os.execute("test -x /usr/bin/python3") then return "/usr/bin/python3" end
  return "python3"
end

local function has_matplotlib(python)
  return os.execute(python .. " -c 'import matplotlib' >/dev/null 2>&1") == true
end

--- Draw the chart as a PNG: with matplotlib (Debian's python3-matplotlib)
-- when it is installed, else gnuplot (pngcairo); never anything but a PNG.
-- @tparam table rows
-- @tparam string path
-- @tparam[opt] table opts `x`, `y`, `title` (as `chart`), `python` (a command, or false:
--   not matplotlib), `gnuplot` (a command, or false)
-- @treturn[1] string "matplotlib" or "gnuplot"
-- @return[2] nil, message, "NOT_FOUND" (neither is installed) | "IO"
function _M.png(rows, path, opts)
  if rows.runs then rows = { rows } end
  opts = opts or {}
  local xk, yk = opts.x or "compute_cost", opts.y or "p95_ms"
  local list = series_of(rows, xk, yk, 2)
  local xl, yl = _M.LABELS[xk] or xk, _M.LABELS[yk] or yk
  local python = opts.python
  if python == nil then python = default_python() end
  local errs = {}
  if python and has_matplotlib(python) then
    local ok, err = matplotlib_png(list, path, { x = xl, y = yl, title = title_of(opts, rows, xl, yl) }, python)
    if ok then return "matplotlib" end
    errs[#errs + 1] = err
  end
  local gp = opts.gnuplot
  if gp == nil then gp = "gnuplot" end
  if gp and os.execute("command -v " .. gp .. " >/dev/null 2>&1") then
    local ok, err = _M.gnuplot(rows, path, opts, gp)
    if ok then return "gnuplot" end
    errs[#errs + 1] = err
  end
  if #errs > 0 then return nil, "cannot draw " .. path .. ": " .. table_concat(errs, "; "), "IO" end
  return nil, "cannot draw a PNG: install python3-matplotlib (or gnuplot), or ask for an SVG (a .svg path)",
    "NOT_FOUND"
end

return _M
