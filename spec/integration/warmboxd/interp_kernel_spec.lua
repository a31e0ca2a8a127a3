-- warmboxd's code interpreter (port 49999) over real HTTP: the /execute NDJSON
-- stream line by line, python and bash kernels, contexts, env_vars per run,
-- interrupts on timeout and disconnect, serialized runs and the overlap
-- counter, and kernel state across pause/resume.
-- This file: the part 'kernel' of them; shared helpers in spec/helpers/warmboxd_interp.lua.
local shared = require "spec.helpers.warmboxd_interp"
local wbd = shared.wbd
local http = shared.http
local cjson = shared.cjson
local q = shared.q
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

  local function ctx_api(box, method, path, json)
    return http.sandbox(srv, box, 49999, method, path, { json = json })
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

  describe("a kernel that dies", function()
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

  describe("bash", function()
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

  describe("contexts", function()
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

  describe("interrupts", function()
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

end)
