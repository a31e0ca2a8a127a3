-- The warmbox command as a newcomer meets it: the per-user server (`warmbox server`),
-- the first cell's traceback, --json, output fit for a pipe, `warmbox doctor`.
-- Every spec has its own XDG_RUNTIME_DIR and stops any server it started (also on failure).

-- Run in parts (spec.helpers.parts), one spec file a group: cli_server_<group>_spec.lua.
local part = (...)({
  server = {
    "warmbox server",
  },
  run = {
    "warmbox run output",
    "warmbox doctor",
  },
})
local wbd = require "spec.helpers.warmboxd"
local cjson = require "cjson"

local ROOT = wbd.root()
local q = wbd.sh_quote

local function slurp(p)
  local f = io.open(p, "rb")
  local s = f and f:read("a") or ""
  if f then f:close() end
  return s
end

local function mkdtemp()
  local p = io.popen("mktemp -d /tmp/wb-cli-spec.XXXXXX")
  local d = p:read("l")
  p:close()
  return d
end

-- Runs bin/warmbox with the spec's build in the XDG dir `xdg`; returns exit status, stdout, stderr.
local function warmbox(xdg, args, env)
  return require("spec.helpers.cli").run(args, { xdg = xdg, env = env, clean = true })
end

local function state_of(xdg)
  local s = slurp(xdg .. "/warmbox/server.json")
  return s ~= "" and cjson.decode(s) or nil
end

local function alive(pid) return require("warmbox.server").alive(math.tointeger(pid)) end

-- A private XDG dir; on teardown whatever server it holds is stopped (by the CLI, then by its pid).
local function private_xdg()
  local x = { dir = mkdtemp() }
  function x.cleanup()
    warmbox(x.dir, "server stop")
    local st = state_of(x.dir)
    if st and st.pid and alive(st.pid) then os.execute("kill -KILL " .. math.tointeger(st.pid)) end
    if x.pid and alive(x.pid) then os.execute("kill -KILL " .. math.tointeger(x.pid)) end
    os.execute("rm -rf " .. q(x.dir))
  end
  return x
end

part("warmbox server", function()
  local x
  before_each(function() x = private_xdg() end)
  after_each(function() x.cleanup() end)

  it("start, two runs sharing state, status, stop", function()
    local code, out, err = warmbox(x.dir, "server status")
    assert.equal(3, code, err)
    assert.matches("not running", out)

    code, out, err = warmbox(x.dir, "server start")
    assert.equal(0, code, err)
    local url = out:match("started at (http://127%.0%.0%.1:%d+)")
    assert.truthy(url, out)
    local st = assert(state_of(x.dir))
    x.pid = st.pid
    assert.equal(url, st.url)
    assert.truthy(alive(st.pid))
    assert.matches("^e2b_", st.api_key)
    local p = io.popen("stat -c %a " .. q(x.dir .. "/warmbox/server.json"))
    assert.equal("600", p:read("l"))
    p:close()
    -- its one key: another local user's own key is refused
    local http = require "spec.helpers.http"
    assert.equal(200, http.api(st, "GET", "/sandboxes").status)
    assert.equal(401, http.api({ url = st.url, api_key = wbd.new_key() }, "GET", "/sandboxes").status)

    code, out, err = warmbox(x.dir, "run --session demo:1 " .. q("x = 5; print(x*2)"))
    assert.equal(0, code, err)
    assert.equal("10\n", out)
    assert.matches("using the local server at " .. url:gsub("%p", "%%%0"), err)
    local code2, out2, err2 = warmbox(x.dir, "run --session demo:1 " .. q("print(x)"))
    assert.equal(0, code2, err2)
    assert.equal("5\n", out2)

    code, out = warmbox(x.dir, "server start")
    assert.equal(0, code)
    assert.matches("already running at " .. url:gsub("%p", "%%%0"), out)
    assert.equal(st.pid, state_of(x.dir).pid)

    code, out = warmbox(x.dir, "server status")
    assert.equal(0, code)
    assert.matches("running at " .. url:gsub("%p", "%%%0"), out)
    assert.matches("1 session", out)

    code, out = warmbox(x.dir, "server stop")
    assert.equal(0, code)
    assert.matches("stopped the local server", out)
    assert.falsy(alive(st.pid))
    assert.is_nil(state_of(x.dir))
    code = warmbox(x.dir, "server status")
    assert.equal(3, code)
    code, out = warmbox(x.dir, "server stop")
    assert.equal(0, code)
    assert.matches("no local server was running", out)
  end)

  it("keeps a session's kernel through an idle pause: the next command resumes it", function()
    assert.equal(0, (warmbox(x.dir, "server start")))
    x.pid = state_of(x.dir).pid
    local g = "--exec-timeout 2 --idle-timeout 2 "
    local code, out, err = warmbox(x.dir, g .. "run --json --session p:1 " .. q("v = 'kept'"))
    assert.equal(0, code, err)
    local sid = cjson.decode(out).sandbox_id
    assert.truthy(wbd.eventually(function()
      local _, list = warmbox(x.dir, "sessions")
      return list:match(sid .. " +paused") ~= nil
    end, 30), "the sandbox did not pause")
    code, out, err = warmbox(x.dir, g .. "run --json --session p:1 " .. q("v"))
    assert.equal(0, code, err)
    local doc = cjson.decode(out)
    assert.equal(sid, doc.sandbox_id)
    assert.is_true(doc.resumed)
    assert.equal("kept", doc.results[1].text)
  end)

  it("run --start starts it; without it (no terminal) a run has its own server", function()
    local code, out, err = warmbox(x.dir, "run --session s:1 " .. q("y = 3"))
    assert.equal(0, code, err)
    assert.equal("", out)
    assert.matches("no local server", err)
    assert.is_nil(state_of(x.dir))

    code, out, err = warmbox(x.dir, "run --start --session s:1 " .. q("y = 3"))
    assert.equal(0, code, err)
    assert.equal("", out)
    assert.matches("started the local server at http://127%.0%.0%.1:%d+", err)
    local st = assert(state_of(x.dir))
    x.pid = st.pid
    code, out, err = warmbox(x.dir, "run --session s:1 " .. q("print(y + 1)"))
    assert.equal(0, code, err)
    assert.equal("4\n", out)
  end)

  it("is not used with --api-url, and a stale state file is not a server", function()
    local srv = wbd.start()
    local ok, e = pcall(function()
      assert.equal(0, (warmbox(x.dir, "server start")))
      x.pid = state_of(x.dir).pid
      local code, _, err = warmbox(x.dir, "--api-url " .. srv.url .. " --api-key " .. srv.api_key
        .. " run --session t:1 " .. q("1"))
      assert.equal(0, code, err)
      assert.no.matches("using the local server", err)
    end)
    srv:stop()
    assert(ok, e)
    os.execute("kill -KILL " .. math.tointeger(x.pid))
    assert.truthy(wbd.eventually(function() return not alive(x.pid) end, 5))
    local code, out = warmbox(x.dir, "server status")
    assert.equal(3, code)
    assert.matches("stale state file", out)
  end)

  it("asks on a terminal whether to start it", function()
    local cli = require "warmbox.cli"
    local server = require "warmbox.server"
    local saved_dir = server.state_dir
    server.state_dir = function() return x.dir .. "/warmbox" end
    local function io_(answer)
      local out, err = {}, {}
      return {
        stdout = { write = function(_, ...) for _, s in ipairs({ ... }) do out[#out + 1] = s end end,
          flush = function() end },
        stderr = { write = function(_, ...) for _, s in ipairs({ ... }) do err[#err + 1] = s end end,
          flush = function() end },
        stdin = { read = function() return answer end },
        is_tty = function() return true end,
      }, out, err
    end
    local ok, e = pcall(function()
      local t, out, err = io_("n")
      local ignored
      local code = cli.main({ "--warmboxd", wbd.bin(), "run", "--session", "ask:1", "z = 1" }, t)
      assert.equal(0, code)
      assert.same({}, out)
      assert.matches("start one, so that the session keeps its kernel between commands%? %[Y/n%]",
        table.concat(err))
      assert.is_nil(state_of(x.dir))
      t, ignored, err = io_("y")
      assert.same({}, ignored)
      code = cli.main({ "--warmboxd", wbd.bin(), "run", "--session", "ask:1", "z = 2" }, t)
      assert.equal(0, code, table.concat(err))
      assert.matches("started the local server", table.concat(err))
      x.pid = assert(state_of(x.dir)).pid
      t, out, err = io_(nil)
      code = cli.main({ "run", "--session", "ask:1", "print(z)" }, t)
      assert.equal(0, code, table.concat(err))
      assert.equal("2\n", table.concat(out))
    end)
    server.state_dir = saved_dir
    assert(ok, e)
  end)
end)

part("warmbox run output", function()
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

part("warmbox doctor", function()
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
