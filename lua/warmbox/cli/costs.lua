--- `warmbox costs`: what each conversation, tenant and day cost, from E2B's
-- lifecycle events (warmbox.ledger), as tables, JSON, or a chart.
local ipairs, tostring, tonumber = ipairs, tostring, tonumber
local string_format = string.format

local parse_args = require("warmbox.cli.args").parse_args
local common = require "warmbox.cli.common"
local util = require "warmbox.util"

local fail, FAILED = common.fail, common.FAILED

local _M = {}

local function when(v, flag)
  local t = tonumber(v) or util.parse_time(v)
  if not t then error(flag .. " takes unix seconds or an RFC 3339 time, got " .. v, 0) end
  return t
end

local function write_table(out, title, rows, totals)
  out:write(string_format("%s\n", title))
  local line = "  %-40s %10s %12s %10s %12s\n"
  out:write(string_format(line, "KEY", "SANDBOXES", "RUNNING S", "COMPUTE $", "SNAPSHOTS $"))
  for _, r in ipairs(rows) do
    local key = r.key
    if r.branch_of then key = key .. " (branch of " .. r.branch_of .. ")" end
    out:write(string_format(line, key, tostring(r.sandboxes), string_format("%.1f", r.running_seconds),
      string_format("%.6f", r.usd), string_format("%.6f", r.snapshot_usd)))
  end
  out:write(string_format(line, "total", tostring(totals.sandboxes), string_format("%.1f", totals.running_seconds),
    string_format("%.6f", totals.usd), string_format("%.6f", totals.snapshot_usd)))
end

-- The chart's data: cost per day and tenant, running/paused over time.
local function chart_data(L, o)
  local per = {}
  for _, day in ipairs(L:costs{ by = "day", since = o.since, ["until"] = o["until"], now = o.now }) do
    local d0 = util.parse_time(day.key .. "T00:00:00Z")
    for _, t in ipairs(L:costs{ by = "tenant", since = d0, ["until"] = d0 + 86400, now = o.now }) do
      if t.total_usd > 0 then per[#per + 1] = { day = day.key, tenant = t.key, usd = t.total_usd } end
    end
  end
  return { cost = per, timeline = L:timeline() }
end

--- Draws the chart with python3's matplotlib (python/costs_chart.py, built into
-- warmbox.core): PNG or SVG by the file's name.
function _M.chart(data, path)
  local json = require "warmbox.json"
  local src = require("warmbox.core").embedded("costs_chart.py")
  if not src then return nil, "warmbox.core was built without python/costs_chart.py", "CHART" end
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "wb"))
  f:write(src)
  f:close()
  local dtmp = os.tmpname()
  f = assert(io.open(dtmp, "wb"))
  f:write(json.encode(data))
  f:close()
  -- the first python3 that has matplotlib: $WARMBOX_PYTHON, the PATH's, the system's
  local py
  for _, cand in ipairs{ os.getenv("WARMBOX_PYTHON") or false, "python3", "/usr/bin/python3" } do
    if cand and not py and os.execute(util.sh_quote(cand) .. " -c 'import matplotlib' 2>/dev/null") then py = cand end
  end
  local ok = py and os.execute(util.sh_quote(py) .. " " .. util.sh_quote(tmp) .. " " .. util.sh_quote(dtmp) .. " "
    .. util.sh_quote(path))
  os.remove(tmp)
  os.remove(dtmp)
  if not ok then return nil, "the chart could not be drawn (python3 with matplotlib is needed)", "CHART" end
  return true
end

--- The command: status 0 or 2.
function _M.execute(o, args, io_)
  local as_json, chart, w = false, nil, {}
  parse_args(args, "costs", {
    ["--json"] = { function() as_json = true end },
    ["--chart"] = function(v) chart = v end,
    ["--since"] = function(v, f) w.since = when(v, f) end,
    ["--until"] = function(v, f) w["until"] = when(v, f) end,
  })
  local wb = common.new_warmbox(o, io_)
  if not wb then return FAILED end
  local ledger = require "warmbox.ledger"
  local L = ledger.of(wb.client, { tag = wb.tag, tenant = wb.policy.tenant })
  local n, msg, code = L:sync()
  wb:close()
  if not n then return fail(io_.stderr, msg, code) end
  local doc = {}
  for _, by in ipairs{ "conversation", "tenant", "day" } do
    local rows, totals = L:costs{ by = by, since = w.since, ["until"] = w["until"] }
    doc[by] = { rows = rows, totals = totals }
  end
  if as_json then
    io_.stdout:write(require("warmbox.json").encode(doc), "\n")
  else
    write_table(io_.stdout, "by conversation", doc.conversation.rows, doc.conversation.totals)
    write_table(io_.stdout, "by tenant", doc.tenant.rows, doc.tenant.totals)
    write_table(io_.stdout, "by day (UTC)", doc.day.rows, doc.day.totals)
    io_.stdout:write("priced at $0.000014 per vCPU-second and $0.0000045 per GiB-second while running "
      .. "(E2B's pricing page); paused sandboxes are free; snapshots apart (docs/costs.md)\n")
  end
  if chart then
    local ok, cmsg, ccode = _M.chart(chart_data(L, { since = w.since, ["until"] = w["until"], now = L.now() }), chart)
    if not ok then return fail(io_.stderr, cmsg, ccode) end
    common.note(io_, "chart written to " .. chart .. "\n")
  end
  return 0
end

return _M
