-- The warmbox command as a newcomer meets it: the per-user server (`warmbox server`),
-- the first cell's traceback, --json, output fit for a pipe, `warmbox doctor`.
-- Every spec has its own XDG_RUNTIME_DIR and stops any server it started (also on failure).
-- This file: the part 'server' of them; shared helpers in spec/helpers/cli_server.lua.
local shared = require "spec.helpers.cli_server"
local wbd = shared.wbd
local cjson = shared.cjson
local q = shared.q
local warmbox = shared.warmbox
local state_of = shared.state_of
local alive = shared.alive
local private_xdg = shared.private_xdg

describe("warmbox server", function()
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
    -- the idle window alone decides the pause (a cell may run up to the default timeout)
    local g = "--idle-timeout 2 "
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
