-- `warmbox simulate` as a person comparing policies uses it: a custom
-- policy file beside the built-ins, a raising hook's error on stderr with a
-- non-zero exit, the report's `errors`, and charts: a real PNG for .png
-- (matplotlib, else gnuplot; never SVG bytes), an SVG otherwise, axes from
-- zero, policies never joined by a line, lost state marked, a clean error
-- for a metric the report does not have.
local sim = require "warmbox.sim"
local chart = require "warmbox.sim.chart"

local function sink()
  local buf = {}
  return { write = function(self, ...)
    for _, s in ipairs({ ... }) do buf[#buf + 1] = tostring(s) end
    return self
  end, flush = function() end, text = function() return table.concat(buf) end }
end

local function cli(args)
  local out, err = sink(), sink()
  local status = require("warmbox.cli").main(args, { stdout = out, stderr = err })
  return status, out:text(), err:text()
end

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function policy_file(src)
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w"))
  f:write(src)
  f:close()
  return path
end

local WORKLOAD = { "--sessions", "8", "--turns", "3-6", "--gap", "300", "--seed", "3" }

local function with(list, ...)
  local t = { "--exec-timeout", "60", "simulate" }
  for _, a in ipairs(WORKLOAD) do t[#t + 1] = a end
  for _, a in ipairs(list) do t[#t + 1] = a end
  for _, a in ipairs({ ... }) do t[#t + 1] = a end
  return t
end

describe("warmbox simulate: policies side by side", function()
  it("puts --policy FILE (and files in --policies) beside the built-ins in one table", function()
    local mine = policy_file('return { name = "one-minute", lease = function() return 65 end }')
    local status, out, err = cli(with({ "--policies", "all", "--policy", mine }))
    assert.equal(0, status, err)
    for _, name in ipairs({ "reference", "no-reuse", "keep-alive", "default", "one-minute" }) do
      assert.matches("\n" .. name:gsub("%-", "%%-") .. "%s+%d", out)
    end
    status, out = cli(with({ "--policies", "default," .. mine }))
    assert.equal(0, status)
    assert.matches("\ndefault%s+%d", out)
    assert.matches("\none%-minute%s+%d", out)
    os.remove(mine)
  end)

  it("runs the sweep for each policy: columns policy and the swept parameter", function()
    local status, out = cli(with({ "--policies", "default,keep-alive", "--idle-timeout", "60,900" }))
    assert.equal(0, status)
    assert.matches("policy%s+idle_timeout%s+runs", out)
    assert.matches("\ndefault%s+60%s+%d", out)
    assert.matches("\nkeep%-alive%s+900%s+%d", out)
  end)

  it("prints a raising hook's first error and exits non-zero; report.errors holds { code, message }", function()
    local bad = policy_file('return { name = "buggy", lease = function() error("lease hook exploded") end }')
    local status, out, err = cli(with({ "--policy", bad }))
    assert.equal(2, status)
    assert.matches("failures (policy buggy): POLICY=", out, 1, true)
    assert.matches("^warmbox: policy 'buggy' hook 'lease' failed: .*lease hook exploded %(%d+ of %d+ runs failed%) "
      .. "%(POLICY%)\n$", err)
    -- beside the built-ins too
    local _, err2
    status, _, err2 = cli(with({ "--policies", "default", "--policy", bad }))
    assert.equal(2, status)
    assert.matches("lease hook exploded", err2, 1, true)
    local r = assert(sim.run{ workload = { sessions = 2, seed = 1 }, policy = bad })
    assert.is_true(#r.errors >= 1)
    assert.equal("POLICY", r.errors[1].code)
    assert.matches("lease hook exploded", r.errors[1].message, 1, true)
    os.remove(bad)
  end)
end)

describe("warmbox simulate --chart", function()
  it("writes a real PNG for a .png path, never SVG bytes", function()
    local path = os.tmpname() .. ".png"
    local status, _, err = cli(with({ "--policies", "all", "--chart", path }))
    assert.equal(0, status, err)
    assert.matches("warmbox: chart written to " .. path:gsub("%p", "%%%0") .. " %((%a+)%)\n$", err)
    local png = assert(read(path))
    assert.equal("\137PNG\r\n\26\n", png:sub(1, 8))
    assert.is_nil(png:find("<svg", 1, true))
    os.remove(path)
  end)

  it("refuses to draw a PNG it cannot draw (no matplotlib, no gnuplot) rather than write an SVG there", function()
    local rows = assert(sim.compare({ workload = { sessions = 3, seed = 1 } }, { "default", "no-reuse" }))
    local path = os.tmpname() .. ".png"
    local ok, err, code = sim.plot(rows, path, { python = false, gnuplot = false })
    assert.is_nil(ok)
    assert.equal("NOT_FOUND", code)
    assert.matches("install python3-matplotlib", err, 1, true)
    assert.is_nil(read(path))
  end)

  it("gives a clean error for a metric the report does not have", function()
    local path = os.tmpname() .. ".svg"
    local status, _, err = cli(with({ "--chart", path, "--chart-y", "p96_ms" }))
    assert.equal(2, status)
    assert.matches("^warmbox: %-%-chart%-y: 'p96_ms' is not a number of the report %(one of: .*p95_ms", err)
    assert.is_nil(err:find("%.lua:%d+"))
    assert.is_nil(read(path))
  end)

  it("draws policies unjoined, a sweep per policy as a line, axes from zero, lost state ringed", function()
    local rows = assert(sim.compare({ workload = { sessions = 6, turns = { 3, 5 }, gap = 600, seed = 2 } },
      { "reference", "no-reuse", "default" }))
    local svg = chart.chart(rows)
    assert.is_nil(svg:find("<polyline", 1, true)) -- no line joins different policies
    local _, dots = svg:gsub('<circle [^>]*r="5"', "")
    assert.equal(3, dots)
    -- no-reuse loses every conversation's state after its first turn: ringed and said
    assert.matches("lost state: %d+", svg)
    assert.matches('r="9" fill="none" stroke="#000000"', svg, 1, true)
    -- both axes start at zero: a tick labelled 0 on each
    local _, zeros = svg:gsub('>0</text>', "")
    assert.is_true(zeros >= 2)
    -- a sweep of two policies: one line each
    local both = {}
    for _, name in ipairs({ "default", "keep-alive" }) do
      for _, r in ipairs(assert(sim.sweep({ workload = { sessions = 6, seed = 2 }, builtin = name },
        { param = "idle_timeout", values = { 60, 300, 900 } }))) do
        r.series = name
        both[#both + 1] = r
      end
    end
    local svg2 = chart.chart(both)
    local _, lines = svg2:gsub("<polyline", "")
    assert.equal(2, lines)
    assert.matches(">keep%-alive</text>", svg2)
  end)
end)

describe("the charts in docs/", function()
  it("docs/img/idle.svg is what docs/simulator.md's command writes", function()
    local path = os.tmpname() .. ".svg"
    local status = cli({ "--exec-timeout", "60", "simulate", "--sessions", "100", "--turns", "20-40", "--gap", "300",
      "--seed", "7", "--idle-timeout", "60,300,900,1800", "--chart", path })
    assert.equal(0, status)
    assert.equal(read("docs/img/idle.svg"), read(path))
    os.remove(path)
    local png = assert(read("docs/img/policies-idle.png"))
    assert.equal("\137PNG\r\n\26\n", png:sub(1, 8))
  end)
end)
