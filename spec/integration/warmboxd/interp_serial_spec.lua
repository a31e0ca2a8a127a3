-- warmboxd's code interpreter (port 49999) over real HTTP: the /execute NDJSON
-- stream line by line, python and bash kernels, contexts, env_vars per run,
-- interrupts on timeout and disconnect, serialized runs and the overlap
-- counter, and kernel state across pause/resume.
-- This file: the part 'serial' of them; shared helpers in spec/helpers/warmboxd_interp.lua.
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

  describe("serialization", function()
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

  describe("pause and resume", function()
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
