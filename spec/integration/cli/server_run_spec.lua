-- The warmbox command as a newcomer meets it: the per-user server (`warmbox server`),
-- the first cell's traceback, --json, output fit for a pipe, `warmbox doctor`.
-- Every spec has its own XDG_RUNTIME_DIR and stops any server it started (also on failure).
-- This file: the part 'run' of them; shared helpers in spec/helpers/cli_server.lua.
local shared = require "spec.helpers.cli_server"
local wbd = shared.wbd
local cjson = shared.cjson
local ROOT = shared.ROOT
local q = shared.q
local slurp = shared.slurp
local mkdtemp = shared.mkdtemp
local warmbox = shared.warmbox
local state_of = shared.state_of
local private_xdg = shared.private_xdg

describe("warmbox run output", function()
  local x
  lazy_setup(function()
    x = private_xdg()
    assert.equal(0, (warmbox(x.dir, "server start")))
    x.pid = state_of(x.dir).pid
  end)
  lazy_teardown(function() x.cleanup() end)

  it("shows a first cell's traceback as the user's own: line 1 is the user's line 1", function()
    local code, out, err = warmbox(x.dir, "run --session tb:1 " .. q("1/0\nprint('never')"))
    assert.equal(1, code)
    assert.equal("", out)
    assert.no.matches("b64decode", err)
    assert.no.matches("exec%(", err)
    -- the first frame is the user's cell at line 1, numbered as IPython numbers it
    local frame = err:match("\n(Cell In %[%d+%], line %d+)\n")
    assert.equal("Cell In [1], line 1", frame, err)
    assert.matches("\n%-%-%-%-> 1 1/0\n", err)
    assert.matches("\nZeroDivisionError: division by zero\n", err)
    -- the rule and the header are on lines of their own, as IPython prints them
    assert.matches("\n%-%-%-%-%-+\nZeroDivisionError +Traceback %(most recent call last%)\n", err)
  end)

  it("reports a syntax error in a first cell at the user's line", function()
    local code, _, err = warmbox(x.dir, "run --session tb:2 " .. q("x = 1\ndef f(:\n  pass"))
    assert.equal(1, code)
    assert.matches("line 2", err)
    assert.matches("SyntaxError", err)
    assert.no.matches("b64decode", err)
  end)

  it("prints no escape codes when stderr is not a terminal", function()
    local code, _, err = warmbox(x.dir, "run --session esc:1 " .. q("raise ValueError('\\x1b[31mred\\x1b[0m')"))
    assert.equal(1, code)
    assert.matches("ValueError: red", err)
    assert.no.matches("\27", err, 1, true)
  end)

  it("keeps colours on a terminal unless NO_COLOR is set", function()
    local build = require("warmbox.core").module_path():match("^(.*)/warmbox/[^/]*$")
    local function on_tty(env)
      local tmp = os.tmpname()
      local inner = string.format("cd %s && env -u E2B_API_KEY XDG_RUNTIME_DIR=%s WARMBOX_BUILD_DIR=%s %s "
        .. "/usr/bin/lua5.4 bin/warmbox run --session esc:2 %s", q(ROOT), q(x.dir), q(build), env,
        q("raise ValueError('\\x1b[31mred\\x1b[0m')"))
      os.execute("script -qec " .. q(inner) .. " /dev/null </dev/null >" .. tmp .. " 2>&1")
      local s = slurp(tmp)
      os.remove(tmp)
      return s
    end
    local coloured = on_tty("")
    assert.matches("ValueError", coloured)
    assert.truthy(coloured:find("\27[31m", 1, true))
    local plain = on_tty("NO_COLOR=1")
    assert.matches("ValueError", plain)
    assert.falsy(plain:find("\27", 1, true))
  end)

  it("--json prints one JSON object: outputs, error, results without binary data, files, timings", function()
    local code, out, err = warmbox(x.dir, "run --json --session js:1 " .. q("print('hi'); x = 41; x + 1"))
    assert.equal(0, code, err)
    local doc = cjson.decode(out)
    assert.equal("hi\n", doc.stdout)
    assert.equal("", doc.stderr)
    assert.equal(cjson.null, doc.error)
    assert.equal("42", doc.results[1].text)
    assert.same({ "text" }, doc.results[1].formats)
    assert.is_false(doc.reused)
    assert.is_false(doc.resumed)
    assert.matches("^%w+$", doc.sandbox_id)
    assert.is_number(doc.timings.total_ms)
    assert.is_number(doc.timings.run_ms)

    local cell = table.concat({ "import matplotlib.pyplot as plt", "plt.plot([1, 2], [3, 4])", "plt.show()",
      "open('/home/user/output/a.txt', 'w').write('abc')", "raise KeyError('k')" }, "\n")
    code, out, err = warmbox(x.dir, "run --json --session js:1 " .. q(cell))
    assert.equal(1, code, err)
    doc = cjson.decode(out)
    assert.is_true(doc.reused)
    assert.equal("KeyError", doc.error.name)
    assert.matches("line 5", doc.error.traceback)
    assert.no.matches("\27", doc.error.traceback, 1, true)
    local png
    for _, r in ipairs(doc.results) do
      for _, f in ipairs(r.formats) do if f == "png" then png = r end end
    end
    assert.truthy(png, out)
    assert.is_nil(png.png)
    assert.same({ { name = "a.txt", bytes = 3, mime = "text/plain" } }, doc.files)
  end)
end)

describe("warmbox doctor", function()
  local pathdir
  lazy_setup(function()
    -- every program of /usr/bin except node and bwrap
    pathdir = mkdtemp()
    os.execute("ln -s /usr/bin/* " .. q(pathdir) .. "/ 2>/dev/null; rm -f " .. q(pathdir .. "/node")
      .. " " .. q(pathdir .. "/bwrap"))
  end)
  lazy_teardown(function() os.execute("rm -rf " .. q(pathdir)) end)

  it("passes the embedded checks on this machine and says what is ready", function()
    local x = private_xdg()
    local code, out, err = warmbox(x.dir, "doctor --embedded")
    x.cleanup()
    assert.equal(0, code, out .. err)
    assert.matches("ok +bubblewrap", out)
    assert.matches("ok +user namespaces", out)
    assert.matches("ok +IPython", out)
    assert.matches("ok +pandas", out)
    assert.matches("ok +node +/usr/bin/node %(javascript and typescript cells%)", out)
    assert.matches("ok +typescript", out)
    assert.matches("ok +slirp4netns +/usr/bin/slirp4netns: sandboxes that allow it reach the internet", out)
    assert.matches("warn +local server +not running: each command starts an embedded warmboxd", out)
    assert.matches("fix: warmbox server start", out)
    assert.matches("ready", out)
  end)

  it("names the running local server, the one the other commands use", function()
    local x = private_xdg()
    local ok, e = pcall(function()
      local code, out, err = warmbox(x.dir, "server start")
      assert.equal(0, code, err)
      local url = assert(out:match("started at (http://[%d.]+:%d+)"), out)
      code, out, err = warmbox(x.dir, "doctor --embedded")
      assert.equal(0, code, out .. err)
      assert.matches("ok +local server +running at " .. url:gsub("%p", "%%%0") .. " %(pid %d+%)", out)
    end)
    x.cleanup()
    assert(ok, e)
  end)

  it("names a missing program and what to install (PATH without node and bwrap)", function()
    local x = private_xdg()
    local code, out = warmbox(x.dir, "doctor --embedded", "PATH=" .. q(pathdir))
    x.cleanup()
    assert.equal(1, code, out)
    assert.matches("FAIL +bubblewrap +bwrap not found on PATH", out)
    assert.matches("fix: apt%-get install bubblewrap", out)
    assert.matches("warn +node +node not found on PATH", out)
    assert.matches("fix: apt%-get install nodejs", out)
    assert.matches("1 check failed", out)
  end)

  it("checks an E2B setup: no key, then an API that does not answer, then one that does", function()
    local x = private_xdg()
    local srv = wbd.start()
    local ok, e = pcall(function()
      local code, out = warmbox(x.dir, "doctor --e2b")
      assert.equal(1, code)
      assert.matches("FAIL +E2B key", out)
      assert.matches("export E2B_API_KEY", out)
      -- a closed loopback port: nothing answers
      code, out = warmbox(x.dir, "--api-url http://127.0.0.1:9 doctor --e2b", "E2B_API_KEY=e2b_x")
      assert.equal(1, code, out)
      assert.matches("ok +E2B key", out)
      assert.matches("FAIL +E2B API +http://127%.0%.0%.1:9 answered", out)
      assert.matches("check the network and %-%-api%-url", out)
      code, out = warmbox(x.dir, "--api-url " .. srv.url .. " --api-key " .. srv.api_key .. " doctor --e2b")
      assert.equal(0, code, out)
      assert.matches("ok +E2B API +" .. srv.url:gsub("%p", "%%%0") .. " answers", out)
      assert.matches("ok +template +code%-interpreter%-v1", out)
      code, out = warmbox(x.dir, "--api-url " .. srv.url .. " --api-key " .. srv.api_key
        .. " --template mine doctor --e2b")
      assert.equal(0, code, out) -- a warning, not a failure
      assert.matches("template +cannot list templates %(HTTP 404%): mine not checked", out)
    end)
    srv:stop()
    x.cleanup()
    assert(ok, e)
  end)

  it("the embedded server's start-up error names the failing check", function()
    local x = private_xdg()
    local fake = x.dir .. "/warmboxd"
    local f = assert(io.open(fake, "w"))
    f:write("#!/bin/sh\necho 'warmboxd: bubblewrap cannot run here' >&2\nexit 1\n")
    f:close()
    os.execute("chmod +x " .. q(fake))
    local code, _, err = warmbox(x.dir, "--warmboxd " .. q(fake) .. " run --session d:1 1", "PATH=" .. q(pathdir))
    x.cleanup()
    assert.equal(2, code) -- warmbox failed (1 is for a cell that raised)
    assert.matches("warmboxd exited at start: warmboxd: bubblewrap cannot run here", err)
    assert.matches("failed check: bubblewrap: bwrap not found on PATH; fix: apt%-get install bubblewrap", err)
  end)
end)
