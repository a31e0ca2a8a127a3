-- warmbox.e2b's data plane against a real warmboxd: files (octet-stream and
-- multipart), Filesystem RPCs, Process.Start over the Connect stream,
-- run_code over the NDJSON stream with callbacks, contexts, and the error
-- codes (SANDBOX_GONE for a gone/paused sandbox, NOT_FOUND, AUTH).
local wbd = require "spec.helpers.warmboxd"
local e2b = require "warmbox.e2b"


describe("warmbox.e2b data plane against warmboxd", function()
  local srv, c, sb, s

  lazy_setup(function()
    srv = wbd.start{ args = { "--rtt-ms", "0" } }
    c = e2b.new{ api_key = srv.api_key, api_url = srv.url, sandbox_url = srv.url }
    sb = assert(c:create{ template = "base", timeout = 600, lifecycle = { on_timeout = "pause" } })
    s = c:sandbox(sb)
  end)

  lazy_teardown(function()
    if sb then c:kill(sb.sandbox_id) end
    if c then c:close() end
    if srv then srv:stop() end
  end)

  describe("files", function()
    it("writes and reads binary bytes", function()
      local data = "\0\1\2binary\255" .. string.rep("z", 70000)
      local e = assert(s:write_file("/home/user/dir/a.bin", data))
      assert.equals("/home/user/dir/a.bin", e.path)
      assert.equals("a.bin", e.name)
      assert.equals(data, assert(s:read_file("/home/user/dir/a.bin")))
    end)

    it("writes several files with multipart", function()
      local es = assert(s:write_files{ { path = "/home/user/m1.txt", data = "one" },
        { path = "/home/user/sub/m2.txt", data = "two\r\n--x" } })
      assert.equals(2, #es)
      assert.equals("one", s:read_file("/home/user/m1.txt"))
      assert.equals("two\r\n--x", s:read_file("/home/user/sub/m2.txt"))
    end)

    it("reads an empty file", function()
      assert(s:write_file("/home/user/empty", ""))
      assert.equals("", s:read_file("/home/user/empty"))
    end)

    it("NOT_FOUND for a missing file, BAD_REQUEST for a directory", function()
      local r, msg, code, detail = s:read_file("/home/user/nope.txt")
      assert.is_nil(r)
      assert.equals("NOT_FOUND", code)
      assert.equals(404, detail.status)
      assert.equals(msg:lower(), msg)
      local _, _, code2 = s:read_file("/home/user")
      assert.equals("BAD_REQUEST", code2)
    end)
  end)

  describe("filesystem RPCs", function()
    it("stat, make_dir, list_dir, move, remove", function()
      assert.is_true(s:make_dir("/home/user/d1/d2"))
      assert.is_false(s:make_dir("/home/user/d1/d2"))
      local st = assert(s:stat("/home/user/d1"))
      assert.equals("dir", st.type)
      assert.equals("d1", st.name)
      assert(s:write_file("/home/user/d1/f.txt", "12345"))
      local f = assert(s:stat("/home/user/d1/f.txt"))
      assert.equals("file", f.type)
      assert.equals(5, f.size)
      local entries = assert(s:list_dir("/home/user/d1"))
      local names = {}
      for _, e in ipairs(entries) do names[#names + 1] = e.name end
      table.sort(names)
      assert.same({ "d2", "f.txt" }, names)
      local deep = assert(s:list_dir("/home/user/d1", 2))
      assert.is_true(#deep >= 2)
      local moved = assert(s:move("/home/user/d1/f.txt", "/home/user/d1/g.txt"))
      assert.equals("/home/user/d1/g.txt", moved.path)
      assert.equals("12345", s:read_file("/home/user/d1/g.txt"))
      assert.is_true(s:remove("/home/user/d1"))
      assert.is_true(s:remove("/home/user/d1"))
      local r, _, code, detail = s:stat("/home/user/d1")
      assert.is_nil(r)
      assert.equals("NOT_FOUND", code)
      assert.equals("not_found", detail.rpc_code)
      local _, _, code2 = s:list_dir("/home/user/missing")
      assert.equals("NOT_FOUND", code2)
    end)
  end)

  describe(":run_command()", function()
    it("collects stdout, stderr and the exit code, streaming chunks", function()
      local chunks = {}
      local r = assert(s:run_command("echo hello; echo oops >&2; printf 'a%.0s' $(seq 1 3); exit 3",
        { on_stdout = function(t) chunks[#chunks + 1] = t end }))
      assert.equals("hello\naaa", r.stdout)
      assert.equals("oops\n", r.stderr)
      assert.equals(3, r.exit_code)
      assert.equals("hello\naaa", table.concat(chunks))
    end)

    it("passes envs and cwd; exit code 0", function()
      local r = assert(s:run_command("echo $FOO; pwd", { envs = { FOO = "bar baz" }, cwd = "/tmp" }))
      assert.equals(0, r.exit_code)
      assert.equals("bar baz\n/tmp\n", r.stdout)
    end)

    it("times out a long command", function()
      local r, _, code = s:run_command("sleep 5", { timeout = 1 })
      assert.is_nil(r)
      assert.equals("TIMEOUT", code)
    end)
  end)

  describe(":run_code()", function()
    it("streams stdout, results and keeps kernel state", function()
      local out, results = {}, {}
      local r = assert(s:run_code("x = 40\nprint('hi')\nx + 2", {
        on_stdout = function(t) out[#out + 1] = t end,
        on_result = function(res) results[#results + 1] = res end }))
      assert.equals("hi\n", table.concat(out))
      assert.same(out, r.stdout)
      assert.equals(1, #r.results)
      assert.equals("42", r.results[1].text)
      assert.is_true(r.results[1].is_main_result)
      assert.equals(1, #results)
      assert.is_number(r.execution_count)
      local r2 = assert(s:run_code("x"))
      assert.equals("40", r2.results[1].text)
    end)

    it("delivers output in chunks as it is produced", function()
      local n = 0
      local r = assert(s:run_code("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)",
        { on_stdout = function() n = n + 1 end }))
      assert.is_true(n >= 2)
      assert.equals("0\n1\n2\n", table.concat(r.stdout))
    end)

    it("reports a kernel error", function()
      local errs = {}
      local r = assert(s:run_code("1/0", { on_error = function(e) errs[#errs + 1] = e end }))
      assert.equals("ZeroDivisionError", r.error.name)
      assert.is_string(r.error.traceback)
      assert.equals(1, #errs)
    end)

    it("NOT_FOUND for an unknown context", function()
      local r, _, code = s:run_code("1", { context_id = "nope" })
      assert.is_nil(r)
      assert.equals("NOT_FOUND", code)
    end)

    it("contexts keep their own state", function()
      local ctx = assert(s:create_context{ language = "python" })
      assert.is_string(ctx.id)
      assert(s:run_code("y = 'ctx'", { context_id = ctx.id }))
      assert.equals("ctx", assert(s:run_code("y", { context_id = ctx.id })).results[1].text)
      local listed = assert(s:list_contexts())
      local found = false
      for _, x in ipairs(listed) do if x.id == ctx.id then found = true end end
      assert.is_true(found)
      assert.is_true(s:restart_context(ctx.id))
      local r = assert(s:run_code("y", { context_id = ctx.id }))
      assert.equals("NameError", r.error.name)
      assert.is_true(s:delete_context(ctx.id))
      local ok, _, code = s:delete_context(ctx.id)
      assert.is_nil(ok)
      assert.equals("NOT_FOUND", code)
    end)
  end)

  describe("errors", function()
    it("SANDBOX_GONE for a paused sandbox without auto-resume and for a killed one", function()
      local sb2 = assert(c:create{ lifecycle = { on_timeout = "pause" } })
      local s2 = c:sandbox(sb2)
      assert(s2:run_code("1"))
      assert.is_true(c:pause(sb2.sandbox_id))
      local r, _, code, detail = s2:run_code("1")
      assert.is_nil(r)
      assert.equals("SANDBOX_GONE", code)
      assert.equals(502, detail.status)
      local _, _, code2 = s2:read_file("/home/user/x")
      assert.equals("SANDBOX_GONE", code2)
      assert.is_true(c:kill(sb2.sandbox_id))
      local _, _, code3 = s2:run_command("true")
      assert.equals("SANDBOX_GONE", code3)
    end)

    it("AUTH for a wrong access token", function()
      local bad = c:sandbox(sb.sandbox_id, { access_token = "wrong" })
      local r, msg, code = bad:stat("/home/user")
      assert.is_nil(r)
      assert.equals("AUTH", code)
      assert.falsy(msg:find("wrong", 1, true))
    end)

    it("STREAM_BROKEN (or an error line) when the sandbox dies after output started", function()
      local sb3 = assert(c:create{})
      local s3 = c:sandbox(sb3)
      local killed = false
      local r, _, code, detail = s3:run_code("import time\nprint('started', flush=True)\ntime.sleep(10)\nprint('late')",
        { timeout = 30, on_stdout = function()
          if not killed then
            killed = true
            assert.is_true(c:kill(sb3.sandbox_id)) -- a control-plane call from inside the stream
          end
        end })
      assert.is_true(killed)
      if r then
        assert.truthy(r.error) -- the interpreter reported the lost kernel as an error line
        print("\n  (sandbox killed mid-run: reported as an error line: " .. tostring(r.error.name) .. ")")
      else
        assert.equals("STREAM_BROKEN", code)
        assert.is_true(detail.output_started)
        assert.same({ "started\n" }, detail.partial.stdout)
      end
    end)
  end)
end)
