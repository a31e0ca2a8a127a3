-- Trust under faults, against a real warmboxd with its fault knobs: every
-- run executes at most once (counted by a line each cell appends to a file in
-- its sandbox before doing anything else, read from the host), the execute
-- stream is decoded without loss, a transient fault never destroys the
-- conversation's state, refusals are retried, timeouts say whether the cell
-- started, and outputs are capped.

-- Run in parts (spec.helpers.parts), one spec file a group: session_faults_<group>_spec.lua.
local part = (...)({
  transient = {
    "a transient fault never destroys state",
  },
  once = {
    "at most once",
    "retrying what is safe",
    "lossless decoding",
    "timeouts",
    "bounded output",
  },
})
local sessions = require "spec.helpers.sessions"
local sandbox_mod = require "warmbox.e2b.sandbox"

describe("sessions under faults (warmboxd)", function()
  local env = sessions.new()
  local srv, wb, wb_fast
  local seq = 0

  lazy_setup(function()
    srv = env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60, request_timeout = 2 }
    -- The same with every Retry-After cut to 0 s (retry_after_max): what is
    -- retried, not how long the header says to wait (the 429 execute below
    -- waits the real one).
    wb_fast = env:warmbox{ exec_timeout = 60, idle_timeout = 60, request_timeout = 2, retry_after_max = 0 }
  end)
  lazy_teardown(function() env:stop() end)
  before_each(function() srv:clear_faults() end)

  -- Executions counted in the sandbox (spec.helpers.sessions).
  local function executions(id, mark) return env:executions(id, mark) end
  local function cell(body) return env:cell(body) end
  local function warm(key, w) return env:warm(w or wb, key) end
  local function survived(s, id) return env:survived(s, id) end

  part("at most once", function()
    local BIG = "open('/home/user/output/big.bin', 'wb').write(b'z' * 600000)"

    for _, st in ipairs({ 502, 404 }) do
      it("never re-runs a cell whose output read got " .. st .. ": files_error in the result", function()
        local s, id = warm("faults:read-" .. st)
        srv:fault{ route = "envd GET /files", count = 1, status = st }
        local code, mark = cell(BIG)
        local r = assert(s:run(code))
        assert.equal(1, executions(id, mark))
        assert.equal(id, r.sandbox_id)
        assert.same({}, r.files)
        assert.equal(st == 502 and "SANDBOX_GONE" or "NOT_FOUND", r.files_error[2])
        survived(s, id)
        -- without the fault the same file comes back
        srv:clear_faults()
        r = assert(s:run(BIG))
        assert.equal(600000, #r.files[1].content)
      end)
    end

    it("never re-runs a bash cell whose output listing failed", function()
      local s = wb:session("faults:bash-list")
      local r0 = assert(s:run("echo warm", { language = "bash" }))
      srv:fault{ route = "envd POST /filesystem.Filesystem/ListDir", count = 1, status = 502 }
      seq = seq + 1
      local mark = "bash-" .. seq
      local r = assert(s:run("echo " .. mark .. " >> /home/user/runs.log; echo hi > /home/user/output/a.txt",
        { language = "bash" }))
      assert.equal(1, executions(r0.sandbox_id, mark))
      assert.equal("SANDBOX_GONE", r.files_error[2])
    end)

    for _, st in ipairs({ 502, 404 }) do
      it("retries once an execute refused with " .. st .. " before any byte: ran once, state kept", function()
        local s, id = warm("faults:exec-" .. st)
        srv:reset_stats()
        srv:fault{ route = "interp POST /execute", count = 1, status = st }
        local code, mark = cell("y = x")
        local r = assert(s:run(code))
        assert.equal(1, executions(id, mark))
        assert.equal(id, r.sandbox_id)
        -- the refused one, then the cell again: the sandbox said it never got it (and kept the kernel's hooks)
        assert.equal(2, srv:count("interp POST /execute"))
        survived(s, id)
      end)
    end

    it("never re-sends an execute whose connection dropped after sending", function()
      local s, id = warm("faults:exec-drop")
      srv:reset_stats()
      srv:fault{ route = "interp POST /execute", count = 1, drop = true }
      local code, mark = cell()
      local r, _, ecode, detail = s:run(code)
      assert.is_nil(r)
      assert.equal("TRANSPORT", ecode)
      assert.is_true(detail.sent)
      assert.equal(1, srv:count("interp POST /execute"))
      assert.equal(0, executions(id, mark))
      survived(s, id)
    end)

    it("fails an execute answered 500 without re-sending it, and keeps the state", function()
      local s, id = warm("faults:exec-500")
      srv:reset_stats()
      srv:fault{ route = "interp POST /execute", count = 1, status = 500 }
      local code, mark = cell()
      local r, _, ecode = s:run(code)
      assert.is_nil(r)
      assert.equal("HTTP", ecode)
      assert.equal(1, srv:count("interp POST /execute"))
      assert.equal(0, executions(id, mark))
      survived(s, id)
    end)
  end)

  part("retrying what is safe", function()
    for _, st in ipairs({ 429, 503 }) do
      local real = st == 429 -- the 503 with Retry-After cut to 0 (wb_fast)
      it("retries an execute answered " .. st .. (real and " (Retry-After honoured)" or " (Retry-After capped at 0)")
        .. ": ran once", function()
        local s, id = warm("faults:exec-refused-" .. st, not real and wb_fast or nil)
        srv:reset_stats()
        srv:fault{ route = "interp POST /execute", count = 1, status = st, headers = { ["Retry-After"] = "1" } }
        local code, mark = cell()
        local t0 = os.time()
        assert(s:run(code))
        if real then assert.is_true(os.time() - t0 >= 1) end
        assert.equal(2, srv:count("interp POST /execute"))
        assert.equal(1, executions(id, mark))
        survived(s, id)
      end)
    end

    it("creates through a 429 with Retry-After (capped at 0)", function()
      local s = wb_fast:session("faults:create-429")
      srv:reset_stats()
      srv:fault{ route = "POST /sandboxes", count = 1, status = 429, headers = { ["Retry-After"] = "1" } }
      local code, mark = cell()
      local r = assert(s:run(code))
      assert.equal(2, srv:count("POST /sandboxes"))
      assert.equal(1, executions(r.sandbox_id, mark))
    end)
  end)

  part("a transient fault never destroys state", function()
    local cases = {
      { "GET /v2/sandboxes", { status = 500 }, "HTTP" },
      { "GET /v2/sandboxes", { status = 429, count = 9, headers = { ["Retry-After"] = "0" } }, "RATE_LIMITED" },
      { "POST /sandboxes/{id}/connect", { status = 500 }, "HTTP" },
      { "POST /sandboxes/{id}/connect", { status = 503, count = 9 }, "HTTP" },
      { "POST /sandboxes/{id}/connect", { delay_ms = 2500, count = 9 }, "TIMEOUT" },
      { "POST /sandboxes/{id}/timeout", { status = 500 }, "HTTP" },
      { "POST /sandboxes/{id}/timeout", { status = 429, count = 9, headers = { ["Retry-After"] = "0" } },
        "RATE_LIMITED" },
      -- a list of the wrong shape is no "no sandboxes" (that made a duplicate)
      { "GET /v2/sandboxes", { status = 200, body = "{}" }, "PROTOCOL" },
      { "GET /v2/sandboxes", { status = 200, body = "[1, 2]" }, "PROTOCOL" },
    }
    for i, c in ipairs(cases) do
      local route, fault, want = c[1], c[2], c[3]
      it(("%s %s fails the run with %s, kills nothing, and the next run has the state"):format(route,
        fault.status or (fault.delay_ms and "delay") or "?", want), function()
        local s, id = warm("faults:transient-" .. i)
        assert(s:forget()) -- the next run lists, connects and sets the lease
        srv:reset_stats()
        local f = { route = route, count = 1 }
        for k, v in pairs(fault) do f[k] = v end
        srv:fault(f)
        local code, mark = cell()
        local r, _, ecode = s:run(code)
        assert.is_nil(r)
        assert.equal(want, ecode)
        assert.equal(0, executions(id, mark))
        assert.equal(0, srv:count("DELETE /sandboxes/{id}"))
        assert.equal(0, srv:count("POST /sandboxes"))
        srv:clear_faults()
        survived(s, id)
      end)
    end

    it("keeps the remembered sandbox when its refresh (connect) fails transiently", function()
      -- The session's clock moves on (os.time moved, not slept) to 25 s before the lease
      -- end: less than half the 60 s idle window is left, so the run refreshes, and more
      -- than 20 s, so the extension goes alongside the execute.
      local moved = 0
      local w = env:warmbox{ exec_timeout = 60, idle_timeout = 60, request_timeout = 2,
        clock = function() return os.time() + moved end }
      local s, id = warm("faults:refresh", w)
      local lease_end = s:state().lease_end
      moved = lease_end - 25 - os.time()    -- 25 s of the lease left on the session's clock
      srv:reset_stats()
      srv:fault{ route = "POST /sandboxes/{id}/connect", count = 9, status = 503 }
      -- The remembered lease has a safe margin, so the extension goes alongside
      -- the execute: the run goes on while it fails; the lease stays
      -- what it was.
      local r = assert(s:run("x"))
      assert.equal(id, r.sandbox_id)
      assert.is_true(srv:count("POST /sandboxes/{id}/connect") >= 1)
      assert.equal(0, srv:count("GET /v2/sandboxes"))
      assert.equal(id, s:state().sandbox_id)
      assert.equal(lease_end, s:state().lease_end)
      srv:clear_faults()
      survived(s, id)
    end)
  end)

  part("lossless decoding", function()
    it("keeps an error whose value holds a lone surrogate (U+FFFD), with name and traceback", function()
      local s = wb:session("faults:surrogate")
      local r = assert(s:run("raise ValueError('bad \\udcff value')"))
      assert.is_table(r.error)
      assert.equal("ValueError", r.error.name)
      assert.equal("bad \xEF\xBF\xBD value", r.error.value)
      assert.matches("ValueError", r.error.traceback)
    end)

    it("loses no line of a batch holding a lone surrogate", function()
      local s = wb:session("faults:batch")
      local r = assert(s:run("import sys\nfor i in range(20):\n    print('line', i, '\\udcff' if i == 7 else '')"))
      local n = 0
      for _ in r.stdout:gmatch("line %d+") do n = n + 1 end
      assert.equal(20, n)
      assert.truthy(r.stdout:find("line 7 \xEF\xBF\xBD", 1, true))
      assert.is_nil(r.error)
    end)

    it("returns output files whose names are not UTF-8, name bytes as they are (inline and read)", function()
      local s = wb:session("faults:names")
      local r = assert(s:run(
        "import os\n" ..
        "open(os.fsdecode(b'/home/user/output/caf\\xe9.txt'), 'wb').write(b'small')\n" ..
        "open(os.fsdecode(b'/home/user/output/big\\xff.bin'), 'wb').write(b'q' * 600000)\n"))
      table.sort(r.files, function(a, b) return a.name < b.name end)
      assert.equal(2, #r.files)
      assert.equal("big\xff.bin", r.files[1].name)
      assert.equal(600000, #r.files[1].content)
      assert.equal("caf\xe9.txt", r.files[2].name)
      assert.equal("small", r.files[2].content)
      assert.is_nil(r.files_error)
    end)

    it("returns a bash run's output files whose names are not UTF-8 (listed again by a command)", function()
      local s = wb:session("faults:names-bash")
      local r = assert(s:run("printf small > $'/home/user/output/caf\\xe9.txt'; echo ok > /home/user/output/plain.txt",
        { language = "bash" }))
      table.sort(r.files, function(a, b) return a.name < b.name end)
      assert.equal(2, #r.files)
      assert.equal("caf\xe9.txt", r.files[1].name)
      assert.equal("small", r.files[1].content)
      assert.equal("plain.txt", r.files[2].name)
      assert.equal("ok\n", r.files[2].content)
      assert.is_nil(r.files_error)
    end)

    it("says PROTOCOL in files_error when the output listing has the wrong shape, never no files", function()
      -- a ListDir answer whose entries are no list read as an empty directory
      local s = wb:session("faults:listdir-shape")
      assert(s:run("echo warm", { language = "bash" }))
      srv:fault{ route = "envd POST /filesystem.Filesystem/ListDir", count = 1, status = 200,
        body = '{"entries": "x"}' }
      local r = assert(s:run("echo ok > /home/user/output/a.txt", { language = "bash" }))
      assert.same({}, r.files)
      assert.equal("PROTOCOL", r.files_error and r.files_error[2])
      assert.matches("not a list of objects", r.files_error[1])
    end)
  end)

  part("timeouts", function()
    it("interrupts the cell server-side at the run's timeout and says it started", function()
      local s, id = warm("faults:timeout")
      local t0 = os.time()
      local r, msg, ecode, detail = s:run("import time\ntime.sleep(30)", { timeout = 1 })
      assert.is_nil(r)
      assert.equal("TIMEOUT", ecode)
      assert.is_true(detail.started)
      assert.matches("timed out", msg)
      assert.is_true(os.time() - t0 < 10)
      survived(s, id) -- the kernel is free again, its state kept
    end)

    it("interrupts a bash cell at the run's timeout too, every time (20 runs)", function()
      -- once a successful, empty result came back
      local s = wb:session("faults:timeout-bash")
      assert(s:run("echo warm", { language = "bash" }))
      for i = 1, 20 do
        local t0 = os.time()
        local r, _, ecode, detail = s:run("sleep 30", { language = "bash", timeout = 1 })
        assert.is_nil(r, "run " .. i)
        assert.equal("TIMEOUT", ecode, "run " .. i)
        assert.is_true(detail.started, "run " .. i)
        assert.is_true(os.time() - t0 < 10, "run " .. i)
        assert.equal("again\n", assert(s:run("echo again", { language = "bash" })).stdout, "run " .. i)
      end
    end)

    it("says started = true when the run timed out before any answer: the request reached the server", function()
      local s, id = warm("faults:timeout-before")
      local grace = sandbox_mod.EXEC_GRACE
      sandbox_mod.EXEC_GRACE = 0.5
      srv:fault{ route = "interp POST /execute", count = 1, delay_ms = 2500 }
      local code, mark = cell()
      local r, _, ecode, detail = s:run(code, { timeout = 1 })
      sandbox_mod.EXEC_GRACE = grace
      assert.is_nil(r)
      assert.equal("TIMEOUT", ecode)
      -- nothing came back yet, but the cell may run (a proxy
      -- or a slow answer): never "not started" once the request left
      assert.is_true(detail.started)
      -- the delayed request is served after the client left: the cell may start, at most once
      assert.is_true(executions(id, mark) <= 1)
      survived(s, id)
    end)
  end)

  part("bounded output", function()
    it("keeps max_output bytes of stdout, drops the rest, says truncated", function()
      local s = wb:session("faults:cap", { max_output = 1048576 })
      local r = assert(s:run("import sys\nfor i in range(200):\n    sys.stdout.write('y' * 65535 + '\\n')\n"
        .. "print('done')"))
      assert.is_true(r.truncated)
      assert.equal(1048576, #r.stdout)
      assert.is_nil(r.error)
      -- one line far longer than the cap: cut, dropped, the run still ok
      r = assert(s:run("import sys\nsys.stdout.write('w' * 5000000)\nsys.stdout.flush()\n1 + 1"))
      assert.is_true(r.truncated)
      assert.is_true(#r.stdout <= 1048576)
      assert.equal("2", r.results[1].text)
    end)

    it("returns output files up to max_files_bytes and lists the ones it dropped", function()
      local s = wb:session("faults:files-cap", { max_files_bytes = 1000000 })
      local r = assert(s:run("for n in 'abc':\n    open('/home/user/output/' + n + '.bin', 'wb').write(b'f' * 600000)"))
      assert.equal(1, #r.files)
      assert.equal("a.bin", r.files[1].name)
      assert.is_true(r.truncated)
      assert.same({ { name = "b.bin", size = 600000 }, { name = "c.bin", size = 600000 } }, r.dropped_files)
    end)
  end)
end)
