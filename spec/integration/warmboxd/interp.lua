-- warmboxd's code interpreter (port 49999) over real HTTP: the /execute NDJSON
-- stream line by line, python and bash kernels, contexts, env_vars per run,
-- interrupts on timeout and disconnect, serialized runs and the overlap
-- counter, and kernel state across pause/resume.

-- Run in parts (spec.helpers.parts), one spec file a group: warmboxd_interp_<group>_spec.lua.
local part = (...)({
  execute = {
    "POST /execute",
  },
  kernel = {
    "a kernel that dies",
    "bash",
    "contexts",
    "interrupts",
  },
  serial = {
    "serialization",
    "pause and resume",
  },
})
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local nd = require "spec.helpers.ndjson"

local cjson = http.cjson
local q = wbd.sh_quote

-- The NDJSON body as decoded lines (and the raw lines, for exact-text checks).
local lines_of, of_type, main_result = nd.lines, nd.of_type, nd.main_result

local function stdout_text(lines) return table.concat(nd.texts(lines, "stdout")) end

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

  local function ctx_api(box, method, path, json)
    return http.sandbox(srv, box, 49999, method, path, { json = json })
  end

  local function stats()
    local res = http.request{ url = srv.url .. "/_warmboxd/stats" }
    return res.json
  end

  -- A background /execute: returns a handle whose :wait() gives the body.
  local function exec_bg(box, body, max_time)
    local tmp = os.tmpname()
    local cmd = string.format("(curl -sS -N --max-time %d -X POST -H %s -H %s -H %s -H %s --data-binary %s %s"
      .. " > %s 2>/dev/null; echo done > %s) &", max_time or 60, q("E2b-Sandbox-Id: " .. box.sandboxID),
      q("E2b-Sandbox-Port: 49999"),
      q("X-Access-Token: " .. (box.envdAccessToken or "")), q("Content-Type: application/json"),
      q(cjson.encode(body)), q(srv.url .. "/execute"), q(tmp .. ".out"), q(tmp .. ".done"))
    os.execute(cmd)
    local function peek()
      local f = io.open(tmp .. ".out", "rb")
      local s = f and f:read("a") or ""
      if f then f:close() end
      return s
    end
    return {
      -- waits until the stream so far contains `text` (the cell is running)
      started = function(text)
        for _ = 1, 1200 do
          if peek():find(text, 1, true) then return true end
          wbd.sleep(0.02)
        end
        error("the background run never printed " .. text)
      end,
      wait = function()
        for _ = 1, 1200 do
          local f = io.open(tmp .. ".done")
          if f then
            f:close()
            break
          end
          wbd.sleep(0.05)
        end
        local f = io.open(tmp .. ".out", "rb")
        local s = f and f:read("a") or ""
        if f then f:close() end
        os.remove(tmp .. ".out")
        os.remove(tmp .. ".done")
        os.remove(tmp)
        return s
      end,
    }
  end

  lazy_setup(function()
    srv = wbd.start{}
    sb = create()
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  part("POST /execute", function()
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

  part("a kernel that dies", function()
    it("ends the run with an error and restarts on the next run, same context", function()
      local ctx = ctx_api(sb, "POST", "/contexts", { language = "python" }).json
      run(sb, { code = "doomed = 1", context_id = ctx.id })
      local lines = run(sb, { code = "import os\nprint('bye', flush=True)\nos._exit(1)", context_id = ctx.id })
      assert.are.equal("bye\n", stdout_text(lines))
      local errs = of_type(lines, "error")
      assert.are.equal(1, #errs)
      assert.are.equal("UnexpectedEndOfExecution", errs[1].name)
      lines = run(sb, { code = "'doomed' in globals()", context_id = ctx.id })
      assert.are.equal("False", main_result(lines).text)
    end)
  end)

  part("bash", function()
    it("keeps variables and the working directory between runs", function()
      local lines = run(sb, { code = "X=5\ncd /tmp\necho hi", language = "bash" })
      assert.are.equal("hi\n", stdout_text(lines))
      assert.are.equal(0, #of_type(lines, "error"))
      lines = run(sb, { code = "echo $X; pwd", language = "bash" })
      assert.are.equal("5\n/tmp\n", stdout_text(lines))
    end)

    it("streams stderr and reports a non-zero exit status as an error", function()
      local lines = run(sb, { code = "echo out; echo err >&2; false", language = "bash" })
      assert.are.equal("out\n", stdout_text(lines))
      assert.are.equal("err\n", of_type(lines, "stderr")[1].text)
      local errs = of_type(lines, "error")
      assert.are.equal(1, #errs)
      assert.is_truthy(errs[1].value:find("1", 1, true))
    end)

    it("survives `exit` in a cell", function()
      local lines = run(sb, { code = "exit 3", language = "bash" })
      assert.are.equal(1, #of_type(lines, "error"))
      lines = run(sb, { code = "echo back", language = "bash" })
      assert.are.equal("back\n", stdout_text(lines))
    end)
  end)

  part("contexts", function()
    it("lists the default python context", function()
      local res = ctx_api(sb, "GET", "/contexts")
      assert.are.equal(200, res.status)
      local found = false
      for _, c in ipairs(res.json) do
        if c.language == "python" and c.cwd == "/home/user" then found = true end
      end
      assert.is_true(found)
    end)

    it("creates, uses, restarts and deletes a context", function()
      local res = ctx_api(sb, "POST", "/contexts", { language = "python", cwd = "/tmp" })
      assert.are.equal(200, res.status, res.body)
      local ctx = res.json
      assert.are.equal("python", ctx.language)
      assert.are.equal("/tmp", ctx.cwd)
      assert.is_truthy(ctx.id:match("^%x+%-%x+%-%x+%-%x+%-%x+$"))
      assert.are.equal("/tmp", main_result(run(sb, { code = "import os\nin_ctx = 1\nos.getcwd()",
        context_id = ctx.id })).text)
      -- contexts are separate interpreters
      assert.are.equal("NameError", of_type(run(sb, "in_ctx"), "error")[1].name)

      local listed = false
      for _, c in ipairs(ctx_api(sb, "GET", "/contexts").json) do
        if c.id == ctx.id then listed = true end
      end
      assert.is_true(listed)

      res = ctx_api(sb, "POST", "/contexts/" .. ctx.id .. "/restart")
      assert.are.equal(200, res.status)
      assert.are.equal("null", res.body)
      assert.are.equal("NameError", of_type(run(sb, { code = "in_ctx", context_id = ctx.id }), "error")[1].name)

      res = ctx_api(sb, "DELETE", "/contexts/" .. ctx.id)
      assert.are.equal(200, res.status)
      assert.are.equal(404, exec(sb, { code = "1", context_id = ctx.id }).status)
      assert.are.equal(404, ctx_api(sb, "DELETE", "/contexts/" .. ctx.id).status)
      assert.are.equal(404, ctx_api(sb, "POST", "/contexts/nope/restart").status)
    end)

    it("ends a run in flight with ContextRestarting when its context restarts", function()
      local ctx = ctx_api(sb, "POST", "/contexts", { language = "python" }).json
      run(sb, { code = "1", context_id = ctx.id })
      local a = exec_bg(sb, { code = "import time\nprint('go', flush=True)\ntime.sleep(600)", context_id = ctx.id })
      a.started("go")
      assert.are.equal(200, ctx_api(sb, "POST", "/contexts/" .. ctx.id .. "/restart").status)
      local lines, raw = lines_of(a.wait())
      local errs = of_type(lines, "error")
      assert.are.equal(1, #errs, table.concat(raw, "\n"))
      assert.are.equal("ContextRestarting", errs[1].name)
      assert.are.equal("end_of_execution", lines[#lines].type)
      assert.are.equal("2", main_result(run(sb, { code = "1 + 1", context_id = ctx.id })).text)
    end)

    it("creates a bash context", function()
      local res = ctx_api(sb, "POST", "/contexts", { language = "bash" })
      assert.are.equal(200, res.status)
      assert.are.equal("/home/user\n", stdout_text(run(sb, { code = "pwd", context_id = res.json.id })))
    end)

    it("answers GET /health", function()
      local res = ctx_api(sb, "GET", "/health")
      assert.are.equal(200, res.status)
      assert.are.equal('"OK"', res.body)
    end)
  end)

  part("interrupts", function()
    it("interrupts a run that exceeds its timeout, and the kernel stays usable", function()
      run(sb, "before_timeout = 7")
      local lines = run(sb, { code = "import time\ntime.sleep(600)", timeout = 1 })
      local errs = of_type(lines, "error")
      assert.are.equal(1, #errs)
      assert.are.equal("KeyboardInterrupt", errs[1].name)
      assert.are.equal("7", main_result(run(sb, "before_timeout")).text)
    end)

    it("interrupts a run whose client disconnects, and the kernel stays usable", function()
      local res = http.sandbox(srv, sb, 49999, "POST", "/execute",
        { json = { code = "import time\nbefore_disconnect = 8\nprint('started', flush=True)\ntime.sleep(600)" },
          timeout = 2 })
      assert.is_truthy(res.body:find("started", 1, true))
      assert.is_falsy(res.body:find("end_of_execution", 1, true))
      -- would wait for the 600 s cell if it had not been interrupted
      local lines = run(sb, "before_disconnect")
      assert.are.equal("8", main_result(lines).text)
    end)

    it("interrupts a bash command on timeout and keeps the shell", function()
      run(sb, { code = "KEEP=9", language = "bash" })
      local lines = run(sb, { code = "sleep 600", language = "bash", timeout = 1 })
      assert.are.equal(1, #of_type(lines, "error"))
      lines = run(sb, { code = "while true; do :; done", language = "bash", timeout = 1 })
      assert.are.equal(1, #of_type(lines, "error"))
      assert.are.equal("9\n", stdout_text(run(sb, { code = "echo $KEEP", language = "bash" })))
    end)

    it("ends a bash cell with an error when the interrupt lands while the cell is handed over", function()
      -- 15 MB of env_vars take the kernel seconds to write to
      -- the shell, so the timeout's interrupt lands in that write; it used to
      -- end the cell with no error (an empty success) and a half-written shell
      -- (on a loaded machine the interrupt may not stop it within the grace:
      -- then the kernel is restarted, and that is an error too)
      local res = exec(sb, { code = "while :; do :; done", language = "bash", timeout = 1,
        env_vars = { BIG = ("x"):rep(15 * 1048576) } })
      assert.are.equal(200, res.status, res.body)
      local lines, raw = lines_of(res.body)
      assert.are.equal('{"type": "end_of_execution"}', raw[#raw], res.body)
      local errs = of_type(lines, "error")
      assert.are.equal(1, #errs, cjson.encode(lines))
      assert.are.equal("ok\n", stdout_text(run(sb, { code = "echo ok", language = "bash" })))
    end)
  end)

  part("serialization", function()
    it("runs one cell at a time per context: a second run waits for the first", function()
      run(sb, "order = []")
      local a = exec_bg(sb, { code = "import time\norder.append('a1')\nprint('a1')\ntime.sleep(1)\n"
        .. "order.append('a2')" })
      a.started("a1")
      local b = exec_bg(sb, { code = "order.append('b')\nlist(order)" })
      local body_a, body_b = a.wait(), b.wait()
      assert.is_truthy(body_a:find("end_of_execution", 1, true))
      assert.are.equal("['a1', 'a2', 'b']", main_result(lines_of(body_b)).text)
    end)

    it("does not count serialized runs as overlapping", function()
      http.request{ method = "POST", url = srv.url .. "/_warmboxd/stats/reset" }
      local a = exec_bg(sb, { code = "import time\nprint('a')\ntime.sleep(0.5)" })
      a.started("number_of_executions")
      local b = exec_bg(sb, { code = "1" })
      a.wait()
      b.wait()
      run(sb, "2")
      assert.are.equal(0, stats().counters.exec_overlap)
    end)

    it("counts runs of one sandbox that overlap across contexts", function()
      local ctx = ctx_api(sb, "POST", "/contexts", { language = "python" }).json
      http.request{ method = "POST", url = srv.url .. "/_warmboxd/stats/reset" }
      local a = exec_bg(sb, { code = "import time\nprint('running')\ntime.sleep(2)" })
      a.started("running")
      local lines = run(sb, { code = "'other context'", context_id = ctx.id })
      assert.are.equal("other context", main_result(lines).text)
      a.wait()
      assert.is_true(stats().counters.exec_overlap >= 1)
    end)
  end)

  part("pause and resume", function()
    local function pause(box, memory)
      local res = http.api(srv, "POST", "/sandboxes/" .. box.sandboxID .. "/pause", { memory = memory })
      assert.are.equal(204, res.status, res.body)
    end

    local function connect(box)
      local res = http.api(srv, "POST", "/sandboxes/" .. box.sandboxID .. "/connect", { timeout = 300 })
      assert.are.equal(201, res.status, res.body)
    end

    it("keeps variables and context ids across a pause with memory", function()
      local box = create()
      local ctx = ctx_api(box, "POST", "/contexts", { language = "python" }).json
      run(box, "kept_across = 'yes'")
      run(box, { code = "in_ctx = 'ctx'", context_id = ctx.id })
      local before = run(box, "1")[1].execution_count
      pause(box, true)
      connect(box)
      local lines = run(box, "kept_across")
      assert.are.equal("yes", main_result(lines).text)
      assert.are.equal(before + 1, lines[1].execution_count)
      assert.are.equal("ctx", main_result(run(box, { code = "in_ctx", context_id = ctx.id })).text)
      http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID)
    end)

    it("does not count a pause after the runs ended as a pause during a run", function()
      local box = create()
      run(box, "1")
      run(box, { code = "true", language = "bash" })
      local before = stats().counters
      pause(box, true)
      connect(box)
      http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID)
      local after = stats().counters
      assert.are.equal(before.pause_during_run, after.pause_during_run)
      assert.are.equal(before.kill_during_run, after.kill_during_run)
    end)

    it("keeps bash state across a pause with memory", function()
      local box = create()
      run(box, { code = "B=kept", language = "bash" })
      pause(box, true)
      connect(box)
      assert.are.equal("kept\n", stdout_text(run(box, { code = "echo $B", language = "bash" })))
      http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID)
    end)

    it("loses kernels and contexts on a pause without memory, but keeps files", function()
      local box = create()
      local ctx = ctx_api(box, "POST", "/contexts", { language = "python" }).json
      run(box, "lost = 1\nopen('/home/user/kept.txt', 'w').write('file')")
      pause(box, false)
      connect(box)
      assert.are.equal("NameError", of_type(run(box, "lost"), "error")[1].name)
      assert.are.equal("file", main_result(run(box, "open('/home/user/kept.txt').read()")).text)
      local res = exec(box, { code = "1", context_id = ctx.id })
      assert.are.equal(404, res.status)
      assert.are.equal("Context " .. ctx.id .. " not found", res.body)
      http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID)
    end)

    it("drops a stream in flight at a pause; the cell continues after resume", function()
      local box = create()
      run(box, "1")
      -- The cell runs until the spec lets it finish (a file in its home, made
      -- from the host after the resume), so the pause lands while it runs
      -- however slow the machine is.
      local a = exec_bg(box, { code = "import time, os\nprint('started', flush=True)\n"
        .. "while not os.path.exists('/home/user/go'):\n    time.sleep(0.05)\nfinished = 'yes'" })
      a.started("started")
      local before = stats().counters.pause_during_run
      pause(box, true)
      assert.are.equal(before + 1, stats().counters.pause_during_run)
      local body = a.wait()
      assert.is_falsy(body:find("end_of_execution", 1, true))
      connect(box)
      local go = assert(io.open(srv:sandbox_home(box.sandboxID) .. "/go", "w"))
      go:close()
      -- waits for the cell that was running when the sandbox paused
      assert.are.equal("yes", main_result(run(box, "finished")).text)
      http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID)
    end)

    it("auto-resumes a paused sandbox on /execute and keeps its state", function()
      local box = create{ autoPause = true, autoResume = { enabled = true } }
      run(box, "auto = 'still here'")
      pause(box, true)
      assert.are.equal("still here", main_result(run(box, "auto")).text)
      http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID)
    end)
  end)
end)
