-- warmboxd's `e2b/chart` results over real HTTP (python/charts.py): a shown
-- matplotlib figure comes out as png and as the chart E2B's code interpreter
-- gives (the SDKs' `result.chart`): its type, title, labels and units, axes
-- (ticks, tick labels, scale) and elements, for each kind of chart.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local cjson = http.cjson

local function lines_of(body)
  local out = {}
  for line in body:gmatch("[^\n]+") do out[#out + 1] = assert(cjson.decode(line), "not JSON: " .. line) end
  return out
end

local function all(t, pred)
  for _, v in ipairs(t) do
    if not pred(v) then return false end
  end
  return true
end

local function is_num(v) return type(v) == "number" end
local function is_str(v) return type(v) == "string" end

describe("warmboxd python kernel: charts", function()
  local srv, sb

  -- the results of a cell (no error)
  local function run(code)
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute", { json = { code = code }, timeout = 120 })
    assert.are.equal(200, res.status, res.body)
    local r = {}
    for _, l in ipairs(lines_of(res.body)) do
      assert.are_not.equal("error", l.type, res.body)
      if l.type == "result" then r[#r + 1] = l end
    end
    return r, res.body
  end

  -- the chart of a cell that shows one figure (its png beside it)
  local function chart(code)
    local r, body = run("import matplotlib.pyplot as plt\nimport numpy as np\n" .. code .. "\nplt.show()")
    assert.are.equal(1, #r, body)
    assert.matches("^iVBORw0KGgo", r[1].png)
    assert.is_table(r[1].chart, body)
    return r[1].chart
  end

  lazy_setup(function()
    srv = wbd.start{}
    local res = http.api(srv, "POST", "/sandboxes", { templateID = "code-interpreter-v1", timeout = 600 })
    assert.are.equal(201, res.status, res.body)
    sb = res.json
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("line: labels with units, datetime and linear axes, points with dates as ISO text", function()
    local c = chart(table.concat({
      "import datetime",
      "d = [datetime.datetime(2023, 9, 1) + datetime.timedelta(hours=i) for i in range(10)]",
      "plt.figure()",
      "plt.plot(d, np.sin(np.arange(10)), label='sin(x)')",
      "plt.plot(d, np.cos(np.arange(10)))",
      "plt.xlabel('Time (s)'); plt.ylabel('Amplitude [Hz]'); plt.title('Waves')",
    }, "\n"))
    assert.are.equal("line", c.type)
    assert.are.equal("Waves", c.title)
    assert.are.same({ "Time (s)", "Amplitude [Hz]", "s", "Hz" }, { c.x_label, c.y_label, c.x_unit, c.y_unit })
    assert.are.same({ "datetime", "linear" }, { c.x_scale, c.y_scale })
    assert.is_true(#c.x_ticks > 0 and all(c.x_ticks, is_str))
    assert.matches("^%d%d%d%d%-%d%d%-%d%dT", c.x_ticks[1])
    assert.is_true(#c.y_ticks > 0 and all(c.y_ticks, is_num))
    assert.are.equal(#c.x_ticks, #c.x_tick_labels)
    assert.is_true(all(c.y_tick_labels, is_str))
    assert.are.equal(2, #c.elements)
    assert.are.same({ "sin(x)", "Line 1" }, { c.elements[1].label, c.elements[2].label })
    assert.are.equal(10, #c.elements[1].points)
    assert.are.same({ "2023-09-01T00:00:00", 0 }, c.elements[1].points[1])
    assert.are.equal("2023-09-01T09:00:00", c.elements[2].points[10][1])
  end)

  it("line: a log scale, a categorical axis, no title or labels (null)", function()
    local c = chart("plt.figure()\nplt.plot([1, 10, 100], [1, 1e3, 1e6])\nplt.yscale('log')")
    assert.are.same({ "linear", "log" }, { c.x_scale, c.y_scale })
    assert.are.equal(cjson.null, c.title)
    assert.are.same({ cjson.null, cjson.null, cjson.null, cjson.null }, { c.x_label, c.y_label, c.x_unit, c.y_unit })
    c = chart("plt.figure()\nplt.plot([1, 2, 3], ['A', 'B', 'C'])")
    assert.are.same({ "linear", "categorical" }, { c.x_scale, c.y_scale })
    assert.are.same({ 0, 1, 2 }, c.y_ticks)
    assert.are.same({ "A", "B", "C" }, c.y_tick_labels)
    assert.are.same({ { 1, "A" }, { 2, "B" }, { 3, "C" } }, c.elements[1].points)
  end)

  it("scatter: one element per collection, with its label and points", function()
    local c = chart(table.concat({
      "plt.figure()",
      "plt.scatter([1, 2, 3], [4, 5, 6], label='a')",
      "plt.scatter([0.5, 1.5], [2, 3], label='b')",
      "plt.xlabel('A'); plt.ylabel('B')",
    }, "\n"))
    assert.are.equal("scatter", c.type)
    assert.are.same({ "A", "B" }, { c.x_label, c.y_label })
    assert.are.same({ "a", "b" }, { c.elements[1].label, c.elements[2].label })
    assert.are.same({ { 1, 4 }, { 2, 5 }, { 3, 6 } }, c.elements[1].points)
    assert.are.same({ { 0.5, 2 }, { 1.5, 3 } }, c.elements[2].points)
    assert.is_true(all(c.x_ticks, is_num) and all(c.x_tick_labels, is_str))
  end)

  it("bar: a bar per category with its group; horizontal bars too, and bars of one height", function()
    local c = chart(table.concat({
      "plt.figure()",
      "plt.bar(['A', 'B', 'C'], [1, 2, 3], label='sold')",
      "plt.bar(['A', 'B', 'C'], [2, 2, 2], bottom=[1, 2, 3])",
      "plt.xlabel('Author'); plt.ylabel('Books (k)'); plt.title('Sales')",
    }, "\n"))
    assert.are.equal("bar", c.type)
    assert.are.same({ "Sales", "Author", "Books (k)", "k" }, { c.title, c.x_label, c.y_label, c.y_unit })
    assert.are.equal(6, #c.elements)
    assert.are.same({ label = "A", group = "sold", value = 1 }, c.elements[1])
    assert.are.same({ label = "C", group = "sold", value = 3 }, c.elements[3])
    -- the second container: unlabelled, all of one height (still vertical bars)
    assert.are.same({ label = "B", group = "Group 1", value = 2 }, c.elements[5])
    c = chart("plt.figure()\nplt.barh(['x', 'y'], [5, 7], label='h')\nplt.xlabel('Value'); plt.ylabel('Name')")
    assert.are.same({ { label = "x", group = "h", value = 5 }, { label = "y", group = "h", value = 7 } }, c.elements)
    -- named as for vertical bars: x the categories, y the values
    assert.are.same({ "Name", "Value" }, { c.x_label, c.y_label })
  end)

  it("pie: each wedge's label, angle (degrees) and radius", function()
    local c = chart(table.concat({
      "fig, ax = plt.subplots()",
      "ax.pie([90, 10], labels=['No', 'Yes'], autopct='%1.1f%%', startangle=90)",
      "plt.title('Poll')",
    }, "\n"))
    assert.are.equal("pie", c.type)
    assert.are.equal("Poll", c.title)
    assert.are.same({ { label = "No", angle = 324, radius = 1 }, { label = "Yes", angle = 36, radius = 1 } },
      c.elements)
    assert.is_nil(c.x_label)   -- not a 2-D chart
  end)

  it("box and whisker: quartiles, median, whiskers and outliers of each box", function()
    local c = chart(table.concat({
      "fig, ax = plt.subplots()",
      "data = {'A': [85, 90, 78, 92, 88], 'B': [95, 89, 76, 91, 84, 87], 'C': [75, 82, 88, 79, 86]}",
      "ax.boxplot(list(data.values()), patch_artist=True)",
      "ax.set_xticklabels(list(data.keys()))",
      "ax.set_title('Scores'); ax.set_xlabel('Class'); ax.set_ylabel('Score')",
    }, "\n"))
    assert.are.equal("box_and_whisker", c.type)
    assert.are.same({ "Scores", "Class", "Score" }, { c.title, c.x_label, c.y_label })
    local got = {}
    for i, b in ipairs(c.elements) do
      got[i] = { b.label, b.min, b.first_quartile, b.median, b.third_quartile, b.max, b.outliers }
    end
    assert.are.same({
      { "A", 78, 85, 88, 90, 92, {} },
      { "B", 84, 84.75, 88, 90.5, 95, { 76 } },
      { "C", 75, 79, 82, 86, 88, {} },
    }, got)
    -- lying boxes: the same figures, axes named as for standing ones
    c = chart(table.concat({
      "fig, ax = plt.subplots()",
      "ax.boxplot([[1, 2, 3, 4, 5], [2, 4, 6, 8, 30]], vert=False, patch_artist=True)",
      "ax.set_xlabel('Value'); ax.set_ylabel('Set')",
    }, "\n"))
    assert.are.same({ "Set", "Value" }, { c.x_label, c.y_label })
    assert.are.same({ "1", 1, 2, 3, 4, 5, {} }, { c.elements[1].label, c.elements[1].min,
      c.elements[1].first_quartile, c.elements[1].median, c.elements[1].third_quartile, c.elements[1].max,
      c.elements[1].outliers })
    assert.are.same({ 30 }, c.elements[2].outliers)
  end)

  it("superchart: a figure of several axes, its suptitle, a chart per axes", function()
    local c = chart(table.concat({
      "fig, axs = plt.subplots(1, 2)",
      "fig.suptitle('Both')",
      "axs[0].plot([0, 1, 2], [0, 1, 4], 'r'); axs[0].set_title('Line'); axs[0].grid(True)",
      "axs[1].scatter([1, 2], [3, 4], label='pts'); axs[1].set_title('Dots'); axs[1].set_xlabel('X')",
    }, "\n"))
    assert.are.equal("superchart", c.type)
    assert.are.equal("Both", c.title)
    assert.are.equal(2, #c.elements)
    assert.are.same({ "line", "Line", 1, 3 },
      { c.elements[1].type, c.elements[1].title, #c.elements[1].elements, #c.elements[1].elements[1].points })
    assert.are.same({ "scatter", "Dots", "X", 2 },
      { c.elements[2].type, c.elements[2].title, c.elements[2].x_label, #c.elements[2].elements[1].points })
  end)

  it("unknown: other artists give the type and title only; axes without data no chart", function()
    local c = chart(table.concat({
      "fig, ax = plt.subplots()",
      "ax.add_artist(plt.Circle((0, 0), 1, fill=False))",
      "ax.grid(True)",
      "plt.title('Circle')",
    }, "\n"))
    assert.are.same({ type = "unknown", title = "Circle", elements = {} }, c)
    local r, body = run("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.set_title('empty')\nplt.show()")
    assert.are.equal(1, #r, body)
    assert.matches("^iVBORw0KGgo", r[1].png)
    assert.is_nil(r[1].chart)
  end)

  it("a figure left open at the end of the cell has its chart too; other results have none", function()
    local r, body = run("import matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 2], [3, 5])\n1 + 1")
    assert.are.equal(2, #r, body)
    local main, fig = r[1].is_main_result and r[1] or r[2], r[1].is_main_result and r[2] or r[1]
    assert.are.equal("2", main.text)
    assert.is_nil(main.chart)
    assert.are.equal("line", fig.chart.type)
    assert.are.same({ { 1, 3 }, { 2, 5 } }, fig.chart.elements[1].points)
  end)
end)
