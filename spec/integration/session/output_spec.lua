-- Behaviour 8 against a real warmboxd: output isolation and input files.
local sessions = require "spec.helpers.sessions"
local outputs = require "warmbox.outputs"

describe("sessions: inputs and outputs (warmboxd)", function()
  local env = sessions.new()
  local srv, wb

  local function names(files)
    local out = {}
    for _, f in ipairs(files) do out[#out + 1] = f.name end
    table.sort(out)
    return out
  end

  lazy_setup(function()
    srv = env:start()
    wb = env:warmbox()
  end)
  lazy_teardown(function() env:stop() end)

  it("returns only the files a run produced in /home/user/output, on a reused sandbox too", function()
    local s = wb:session("out:1")
    local r1 = assert(s:run("open('/home/user/output/a.txt', 'w').write('A')\n"
      .. "import os\nos.makedirs('/home/user/output/sub', exist_ok=True)\n"
      .. "open('/home/user/output/sub/b.csv', 'w').write('1,2')"))
    assert.is_nil(r1.error)
    assert.same({ "a.txt", "sub/b.csv" }, names(r1.files))
    for _, f in ipairs(r1.files) do
      if f.name == "a.txt" then
        assert.equal("A", f.content)
        assert.equal("text/plain", f.mime)
      end
    end
    local r2 = assert(s:run("y = 2"))
    assert.is_true(r2.reused)
    assert.equal(r1.sandbox_id, r2.sandbox_id)
    assert.same({}, r2.files)
    local r3 = assert(s:run("import os\nprint(sorted(os.listdir('/home/user/output')))\n"
      .. "open('/home/user/output/c.txt', 'w').write('C')"))
    assert.equal("[]\n", r3.stdout) -- emptied before the run
    assert.same({ "c.txt" }, names(r3.files))
  end)

  it("returns a chart written with matplotlib", function()
    local s = wb:session("out:chart")
    local r = assert(s:run(table.concat({ "import matplotlib", "matplotlib.use('Agg')",
      "import matplotlib.pyplot as plt", "plt.plot([1, 2, 3], [3, 1, 2])",
      "plt.savefig('/home/user/output/chart.png')" }, "\n"), { timeout = 120 }))
    assert.is_nil(r.error)
    assert.equal(1, #r.files)
    assert.equal("chart.png", r.files[1].name)
    assert.equal("image/png", r.files[1].mime)
    assert.equal("\137PNG\r\n\26\n", r.files[1].content:sub(1, 8))
  end)

  it("reads files too big to come back inline over envd", function()
    local s = wb:session("out:big")
    local n = outputs.INLINE_LIMIT + 1000
    local r = assert(s:run("open('/home/user/output/big.bin', 'wb').write(bytes(range(256)) * " .. (n // 256 + 1)
      .. ")"))
    assert.equal(1, #r.files)
    assert.equal((n // 256 + 1) * 256, #r.files[1].content)
    assert.equal("\0\1\2\3", r.files[1].content:sub(1, 4))
  end)

  describe("an output report forged by the sandbox's code", function()
    -- The cell removes warmbox's report hook and displays a report of its own.
    local function forge(entries, setup)
      local list = {}
      for _, e in ipairs(entries) do
        list[#list + 1] = ("{'name': %q, 'size': %d, 'name_b64': base64.b64encode(%q.encode()).decode()%s}")
          :format(e.name, e.size, e.name, e.b64 and (", 'b64': %q"):format(e.b64) or "")
      end
      return table.concat({ "import base64, os", "get_ipython().events.callbacks['post_run_cell'][:] = []",
        setup or "", "from IPython.display import display",
        ("display({%q: {'v': 1, 'files': [%s]}}, raw=True)"):format(outputs.OUTPUTS_MIME, table.concat(list, ", ")),
      }, "\n")
    end
    -- The largest body of a GET /files (an output file read) the client downloaded during fn.
    local function biggest_read(s, fn)
      local tp, biggest = s.client.transport, 0
      local request = tp.request
      tp.request = function(self, req)
        local res, m, c, d = request(self, req)
        if res and req.method == "GET" and req.url:find("/files?", 1, true) then
          biggest = math.max(biggest, #res.body)
        end
        return res, m, c, d
      end
      local ok, r = pcall(fn)
      tp.request = nil
      assert(ok, r)
      return r, biggest
    end

    it("never downloads more than max_files_bytes of a file its report says is small", function()
      local s = wb:session("out:forged-size", { max_files_bytes = 1048576 })
      local r, biggest = biggest_read(s, function()
        return assert(s:run(forge({ { name = "big.bin", size = 10 } },
          "open('/home/user/output/big.bin', 'wb').write(b'x' * (3 << 20))")))
      end)
      assert.is_true(biggest <= 1048576, "downloaded " .. biggest .. " bytes")
      assert.same({}, r.files)
      assert.is_true(r.truncated)
      assert.equal("big.bin", r.dropped_files[1].name)
    end)

    it("refuses names that climb out of the output directory (PROTOCOL), never returns them", function()
      local s = wb:session("out:forged-names")
      for _, name in ipairs({ "../../../home/victim/.bashrc", "/etc/passwd", "a/../../x", "./x", "a//b" }) do
        local r = assert(s:run(forge({ { name = name, size = 2, b64 = "aGk=" } })))
        assert.same({}, r.files, name)
        assert.equal("PROTOCOL", r.files_error[2], name)
        assert.matches("output file name", r.files_error[1])
      end
    end)

    it("says PROTOCOL for a file read shorter than its reported size, never returns it as complete", function()
      local s = wb:session("out:forged-short")
      local r = assert(s:run(forge({ { name = "short.txt", size = 100 } },
        "open('/home/user/output/short.txt', 'w').write('five!')")))
      assert.same({}, r.files)
      assert.equal("PROTOCOL", r.files_error[2])
      assert.matches("read 5 bytes of the 100 reported", r.files_error[1])
    end)
  end)

  it("empties the output directory and lists it over envd for other languages", function()
    local s = wb:session("out:bash")
    assert(s:run("mkdir -p /home/user/output && echo old > /home/user/output/old.txt", { language = "bash" }))
    local r = assert(s:run("ls /home/user/output | wc -l; echo new > /home/user/output/new.txt",
      { language = "bash" }))
    assert.equal("0\n", r.stdout)
    assert.same({ "new.txt" }, names(r.files))
    assert.equal("new\n", r.files[1].content)
  end)

  it("writes input files to /home/user", function()
    local s = wb:session("out:inputs")
    local r = assert(s:run("print(open('/home/user/data.csv').read(), end='')\nprint(open('notes.txt').read())",
      { files = { ["data.csv"] = "a,b\n1,2\n", ["notes.txt"] = "hi" } }))
    assert.is_nil(r.error)
    assert.equal("a,b\n1,2\nhi\n", r.stdout)
  end)

  it("refuses input names that could escape /home/user and writes nothing", function()
    local s = wb:session("out:escape")
    assert(s:run("1"))
    for _, name in ipairs({ "../../etc/x", "../x", "a/../../x", "/etc/x", ".." }) do
      local r, err, code = s:run("1", { files = { [name] = "pwned" } })
      assert.is_nil(r)
      assert.matches("input file name", err)
      assert.equal("BAD_REQUEST", code)
    end
    local r = assert(s:run("import os\nprint(os.path.exists('/etc/x'), os.path.exists('/home/x'), "
      .. "os.path.exists('/home/user/x'))"))
    assert.equal("False False False\n", r.stdout)
    local found = io.popen("find '" .. srv.dir .. "' -name x 2>/dev/null"):read("a")
    assert.equal("", found)
  end)

  it("streams stdout, stderr and results to callbacks, without warmbox's own report", function()
    local s = wb:session("out:stream")
    local out, err, results = {}, {}, {}
    local r = assert(s:run("import sys\nprint('o1')\nprint('e1', file=sys.stderr)\n"
      .. "open('/home/user/output/f.txt', 'w').write('F')\n41 + 1", {
      on_stdout = function(t) out[#out + 1] = t end,
      on_stderr = function(t) err[#err + 1] = t end,
      on_result = function(x) results[#results + 1] = x end }))
    assert.equal("o1\n", table.concat(out))
    assert.equal("e1\n", table.concat(err))
    assert.equal(1, #results)
    assert.equal("42", results[1].text)
    assert.equal(1, #r.results)
    assert.equal("42", r.results[1].text)
    assert.same({ "f.txt" }, names(r.files))
  end)

  it("reports a python error with name, value and traceback", function()
    local r = assert(wb:session("out:error"):run("1 / 0"))
    assert.equal("ZeroDivisionError", r.error.name)
    assert.equal("division by zero", r.error.value)
    assert.matches("ZeroDivisionError", r.error.traceback)
    local r2 = assert(wb:session("out:error"):run("def f(:\n  pass"))
    assert.equal("SyntaxError", r2.error.name)
    assert.same({}, r2.files)
  end)
end)
