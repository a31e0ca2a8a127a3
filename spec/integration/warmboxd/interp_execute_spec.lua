-- warmboxd's code interpreter (port 49999) over real HTTP: the /execute NDJSON
-- stream line by line, python and bash kernels, contexts, env_vars per run,
-- interrupts on timeout and disconnect, serialized runs and the overlap
-- counter, and kernel state across pause/resume.
-- This file: the part 'execute' of them; shared helpers in spec/helpers/warmboxd_interp.lua.
local shared = require "spec.helpers.warmboxd_interp"
local wbd = shared.wbd
local http = shared.http
local cjson = shared.cjson
local lines_of = shared.lines_of
local of_type = shared.of_type
local main_result = shared.main_result
local stdout_text = shared.stdout_text

describe("warmboxd code interpreter", function()
  local srv, sb

  local function create(extra) return http.create_interp(srv, extra) end

  local function exec(box, body, timeout)
    local res = http.sandbox(srv, box, 49999, "POST", "/execute", { json = body, timeout = timeout or 60 })
    return res
  end

  -- Runs code and returns the decoded lines; asserts the stream's frame.
  local function run(box, body)
    if type(body) == "string" then body = { code = body } end
    local res = exec(box, body)
    assert.are.equal(200, res.status, res.body)
    local lines, raw = lines_of(res.body)
    assert.are.equal('{"type": "end_of_execution"}', raw[#raw], res.body)
    assert.are.equal("number_of_executions", lines[1].type, res.body)
    return lines, raw
  end

  lazy_setup(function()
    srv = wbd.start{}
    sb = create()
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  describe("POST /execute", function()
    it("streams number_of_executions, stdout, the main result and end_of_execution", function()
      local lines, raw = run(sb, 'print("hi")\n1 + 1')
      assert.are.equal(4, #lines, table.concat(raw, "\n"))
      assert.are.equal("number_of_executions", lines[1].type)
      assert.is_number(lines[1].execution_count)
      assert.are.equal("stdout", lines[2].type)
      assert.are.equal("hi\n", lines[2].text)
      assert.is_string(lines[2].timestamp)
      assert.is_truthy(lines[2].timestamp:match("^%d%d%d%d%-%d%d%-%d%dT"))
      assert.are.same({ type = "result", text = "2", is_main_result = true, extra = {} }, lines[3])
      assert.are.same({ type = "end_of_execution" }, lines[4])
    end)

    it("writes lines with a space after the colon, as the real server does", function()
      local _, raw = run(sb, "1")
      assert.is_truthy(raw[1]:match('^{"type": "number_of_executions", "execution_count": %d+}$'), raw[1])
      assert.are.equal('{"type": "result", "text": "1", "is_main_result": true, "extra": {}}', raw[2])
    end)

    it("counts executions", function()
      local a = run(sb, "1")[1].execution_count
      local b = run(sb, "2")[1].execution_count
      assert.are.equal(a + 1, b)
    end)

    it("strips the quotes of a string main result", function()
      assert.are.equal("abc", main_result(run(sb, "'abc'")).text)
    end)

    it("has no main result when the last statement is not an expression", function()
      local lines = run(sb, "y = 3")
      assert.is_nil(main_result(lines))
      assert.are.equal(0, #of_type(lines, "result"))
    end)

    it("keeps variables, imports and functions between runs", function()
      run(sb, "import math\nkept = 41\ndef inc(v):\n    return v + 1")
      assert.are.equal("42", main_result(run(sb, "inc(kept)")).text)
      assert.are.equal("3.141592653589793", main_result(run(sb, "math.pi")).text)
    end)

    it("sends display() output as non-main results, in order", function()
      local lines = run(sb, "display(1)\ndisplay('two')\n3")
      local results = of_type(lines, "result")
      assert.are.equal(3, #results)
      assert.are.same({ type = "result", text = "1", is_main_result = false, extra = {} }, results[1])
      assert.are.equal("two", results[2].text)  -- quotes stripped on every result, as E2B does
      assert.is_false(results[2].is_main_result)
      assert.are.same({ type = "result", text = "3", is_main_result = true, extra = {} }, results[3])
    end)

    it("sends rich MIME types under their E2B keys and unknown ones in extra", function()
      local lines = run(sb, table.concat({
        "from IPython.display import HTML, Markdown, JSON, display",
        "display({'text/plain': 'p', 'application/vnd.warmbox.outputs+json': {'a': 1}}, raw=True)",
        "display(Markdown('# m'))",
        "class Rich:",
        "    def _repr_html_(self): return '<b>x</b>'",
        "    def _repr_png_(self): return b'\\x89PNG fake'",
        "Rich()",
      }, "\n"))
      local results = of_type(lines, "result")
      assert.are.equal(3, #results)
      assert.are.equal("p", results[1].text)
      assert.are.same({ ["application/vnd.warmbox.outputs+json"] = { a = 1 } }, results[1].extra)
      assert.are.equal("# m", results[2].markdown)
      assert.are.equal("<b>x</b>", results[3].html)
      assert.are.equal("iVBORyBmYWtl", results[3].png)
      assert.is_true(results[3].is_main_result)
      for _, r in ipairs(results) do
        for k, v in pairs(r) do assert.are_not.equal(cjson.null, v, k) end
      end
    end)

    it("turns a matplotlib figure into a png result", function()
      local lines = run(sb, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
      local results = of_type(lines, "result")
      assert.are.equal(1, #results, cjson.encode(lines))
      assert.is_false(results[1].is_main_result)
      assert.is_string(results[1].png)
      assert.is_truthy(results[1].png:match("^iVBOR"))
      assert.is_truthy(results[1].text:match("Figure"))
      -- a figure left open at the end of the cell is shown too
      lines = run(sb, "plt.figure()\nplt.plot([3, 2])\nNone")
      assert.are.equal(1, #of_type(lines, "result"))
      assert.is_string(of_type(lines, "result")[1].png)
    end)

    it("reports an error with name, value and traceback, then ends", function()
      local lines = run(sb, 'print("before")\n1 / 0\nprint("after")')
      assert.are.equal("before\n", stdout_text(lines))
      local errs = of_type(lines, "error")
      assert.are.equal(1, #errs)
      assert.are.equal("ZeroDivisionError", errs[1].name)
      assert.are.equal("division by zero", errs[1].value)
      assert.is_string(errs[1].traceback)
      assert.is_truthy(errs[1].traceback:find("ZeroDivisionError", 1, true))
      assert.are.equal("end_of_execution", lines[#lines].type)
    end)

    it("reports a syntax error", function()
      local errs = of_type(run(sb, "def f(:"), "error")
      assert.are.equal(1, #errs)
      assert.are.equal("SyntaxError", errs[1].name)
    end)

    it("streams stderr, and output of subprocesses", function()
      local lines = run(sb, 'import sys, subprocess\nprint("e", file=sys.stderr)\n'
        .. 'subprocess.run(["echo", "sub"])\nNone')
      assert.are.equal("e\n", of_type(lines, "stderr")[1].text)
      assert.are.equal("sub\n", stdout_text(lines))
    end)

    it("streams output as it is produced, not at the end", function()
      local lines = run(sb, 'import time\nprint("one")\ntime.sleep(1)\nprint("two")')
      local outs = of_type(lines, "stdout")
      assert.are.equal(2, #outs)
      assert.are.equal("one\n", outs[1].text)
      assert.are.equal("two\n", outs[2].text)
      assert.is_true(outs[1].timestamp < outs[2].timestamp)
    end)

    it("delivers a burst of output complete and in order", function()
      local lines = run(sb, "for i in range(20000): print(i)")
      local text = stdout_text(lines)
      local n = 0
      for v in text:gmatch("[^\n]+") do
        assert.are.equal(tostring(n), v)
        n = n + 1
      end
      assert.are.equal(20000, n)
    end)

    it("supports get_ipython() and its post_run_cell event", function()
      run(sb, "_seen = []\nget_ipython().events.register('post_run_cell', lambda r: _seen.append(1))")
      run(sb, "1")
      local n = tonumber(main_result(run(sb, "len(_seen)")).text)
      assert.is_true(n >= 2)
      run(sb, "get_ipython().events.callbacks['post_run_cell'].clear()")
    end)

    it("applies env_vars to that run only", function()
      local lines = run(sb, { code = "import os\nos.environ.get('WB_ONE')", env_vars = { WB_ONE = "v1" } })
      assert.are.equal("v1", main_result(lines).text)
      assert.are.equal("None", main_result(run(sb, "str(os.environ.get('WB_ONE'))")).text)
      lines = run(sb, { code = "echo \"[$WB_TWO]\"", language = "bash", env_vars = { WB_TWO = "b 2" } })
      assert.are.equal("[b 2]\n", stdout_text(lines))
      assert.are.equal("[]\n", stdout_text(run(sb, { code = "echo \"[$WB_TWO]\"", language = "bash" })))
    end)

    it("sees the sandbox's envVars", function()
      local box = create{ envVars = { SB_VAR = "from-create" } }
      assert.are.equal("from-create", main_result(run(box, "import os\nos.environ['SB_VAR']")).text)
      assert.are.equal("/home/user", main_result(run(box, "os.getcwd()")).text)
      http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID)
    end)

    it("answers 400 when both context_id and language are given", function()
      local res = exec(sb, { code = "1", context_id = "x", language = "python" })
      assert.are.equal(400, res.status)
      assert.are.equal("Only one of context_id or language can be provided", res.body)
    end)

    it("answers 404 for an unknown context", function()
      local res = exec(sb, { code = "1", context_id = "nope" })
      assert.are.equal(404, res.status)
      assert.are.equal("Context nope not found", res.body)
    end)

    it("answers 422 without code", function()
      local res = exec(sb, { language = "python" })
      assert.are.equal(422, res.status)
      assert.are.equal("missing", res.json.detail[1].type)
      assert.are.same({ "body", "code" }, res.json.detail[1].loc)
    end)

    it("lowercases the language and refuses languages it has no kernel for", function()
      assert.are.equal("5", main_result(run(sb, { code = "5", language = "PYTHON" })).text)
      local res = exec(sb, { code = "1", language = "R" })
      assert.are.equal(500, res.status)
      assert.is_truthy(res.body:find("no r kernel", 1, true), res.body)
    end)

    it("sends a keepalive line after 5 s without output", function()
      local lines = run(sb, "import time\ntime.sleep(6)\n'slept'")
      assert.is_true(#of_type(lines, "keepalive") >= 1)
      assert.are.equal("slept", main_result(lines).text)
    end)
  end)

end)
