-- warmboxd's Python kernel start-up, over real HTTP: the
-- `e2b/data` form of a pandas DataFrame (the code-interpreter SDK's
-- `result.data`), and images as results: a matplotlib figure shown or left
-- open (png), a PIL image shown, saved to a path, or as the last expression.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local cjson = http.cjson

local function lines_of(body)
  local out = {}
  for line in body:gmatch("[^\n]+") do out[#out + 1] = assert(cjson.decode(line), "not JSON: " .. line) end
  return out
end

local function results(lines)
  local r = {}
  for _, l in ipairs(lines) do
    if l.type == "result" then r[#r + 1] = l end
  end
  return r
end

local function errors(lines)
  for _, l in ipairs(lines) do
    if l.type == "error" then return l end
  end
end

local PNG = "^iVBORw0KGgo"   -- base64 of the PNG signature

describe("warmboxd python kernel: data and images", function()
  local srv, sb

  local function run(code, context_id)
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute",
      { json = { code = code, context_id = context_id }, timeout = 120 })
    assert.are.equal(200, res.status, res.body)
    local lines = lines_of(res.body)
    assert.is_nil(errors(lines), res.body)
    return lines, res.body
  end

  lazy_setup(function()
    srv = wbd.start{}
    local res = http.api(srv, "POST", "/sandboxes",
      { templateID = "code-interpreter-v1", secure = true, timeout = 600 })
    assert.are.equal(201, res.status, res.body)
    sb = res.json
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("imports neither pandas nor matplotlib for a cell that does not", function()
    local ctx = http.sandbox(srv, sb, 49999, "POST", "/contexts", { json = { language = "python" } })
    assert.are.equal(200, ctx.status, ctx.body)
    local lines, body = run("import sys\nprint([m in sys.modules for m in ('pandas', 'matplotlib', 'numpy', 'PIL')])",
      ctx.json.id)
    local out = {}
    for _, l in ipairs(lines) do
      if l.type == "stdout" then out[#out + 1] = l.text end
    end
    assert.are.equal("[False, False, False, False]\n", table.concat(out), body)
  end)

  it("gives a DataFrame's columns as e2b/data, next to its text and html", function()
    local lines, body = run(table.concat({
      "import pandas as pd",
      "pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', None], 'c': [0.5, float('nan'), 2.0],",
      "              't': pd.to_datetime(['2024-01-02', '2024-01-03', '2024-01-04'])})",
    }, "\n"))
    local r = results(lines)
    assert.are.equal(1, #r, body)
    assert.is_true(r[1].is_main_result)
    assert.are.same({ 1, 2, 3 }, r[1].data.a)
    assert.are.same({ "x", "y", cjson.null }, r[1].data.b)
    assert.are.same({ 0.5, cjson.null, 2.0 }, r[1].data.c)   -- NaN: null (JSON has no NaN)
    assert.are.same({ "2024-01-02T00:00:00", "2024-01-03T00:00:00", "2024-01-04T00:00:00" }, r[1].data.t)
    assert.matches("<table", r[1].html)
    assert.is_string(r[1].text)
    assert.are.same({}, r[1].extra)
  end)

  it("leaves other results without data", function()
    local r = results((run("1 + 1")))
    assert.are.equal("2", r[1].text)
    assert.is_nil(r[1].data)
    r = results((run("import pandas as pd\npd.Series([1, 2])")))
    assert.is_nil(r[1].data)
    assert.is_string(r[1].text)
  end)

  it("gives a displayed DataFrame its data too", function()
    local r = results((run("import pandas as pd\ndisplay(pd.DataFrame({'k': ['v']}))\nNone")))
    assert.are.equal(1, #r)
    assert.is_false(r[1].is_main_result)
    assert.are.same({ k = { "v" } }, r[1].data)
  end)

  it("answers a shown matplotlib figure with a png", function()
    local r = results((run(table.concat({
      "import matplotlib.pyplot as plt",
      "plt.plot([1, 2, 3], [3, 1, 2])",
      "plt.show()",
    }, "\n"))))
    assert.are.equal(1, #r)
    assert.matches(PNG, r[1].png)
    assert.is_string(r[1].text)
    assert.are.same({}, r[1].extra)
  end)

  it("answers a figure that was only saved with a png at the end of the cell", function()
    local r = results((run(table.concat({
      "import matplotlib.pyplot as plt",
      "plt.figure(); plt.bar(['a', 'b'], [1, 2])",
      "plt.savefig('/home/user/bar.png')",
      "print('saved')",
    }, "\n"))))
    -- matplotlib writes its png with PIL, whose save E2B's hook (and
    -- warmboxd's) also displays: the saved image, then the open figure
    assert.are.equal(2, #r)
    assert.matches(PNG, r[1].png)
    assert.matches(PNG, r[2].png)
    assert.matches("Figure", r[2].text)
    local f = io.open(srv:sandbox_home(sb.sandboxID) .. "/bar.png", "rb")
    assert.is_not_nil(f, "the file was not saved")
    assert.are.equal("\137PNG", f:read(4))
    f:close()
  end)

  it("answers a PIL image saved to a path, shown, or as the last expression with a png", function()
    local make = "from PIL import Image\nimg = Image.new('RGBA', (16, 16), (255, 0, 0, 255))\n"
    local r = results((run(make .. "img.save('/home/user/red.png')")))
    assert.are.equal(1, #r)
    assert.matches(PNG, r[1].png)
    local f = io.open(srv:sandbox_home(sb.sandboxID) .. "/red.png", "rb")
    assert.is_not_nil(f, "the file was not saved")
    f:close()
    r = results((run(make .. "img.show()\nprint('done')")))
    assert.are.equal(1, #r)
    assert.matches(PNG, r[1].png)
    r = results((run(make .. "img")))
    assert.are.equal(1, #r)
    assert.matches(PNG, r[1].png)
    -- a file object is written, not displayed (as E2B's hook does)
    r = results((run(make .. "with open('/home/user/fo.png', 'wb') as fo:\n    img.save(fo, format='PNG')")))
    assert.are.equal(0, #r)
  end)
end)
