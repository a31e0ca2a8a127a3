-- A long-running host outlives the user's shared local server: the luv
-- example (examples/luv/server.lua), its `wb` made once at start, keeps
-- answering across `warmbox server stop`, an idle exit and a `kill -9` of the
-- shared server; its requests find or start the server again when a
-- connection is refused (nothing of the request left), and a cell that may
-- have left is never sent again. scripts/test gives this file its own
-- XDG_RUNTIME_DIR, so the shared server here is its own.
local hosts = require "spec.helpers.hosts"
local wbd = require "spec.helpers.warmboxd"
local server = require "warmbox.server"
local cjson = require "cjson"

-- Appends a line to a file of the sandbox and returns how many it has: each
-- run of the cell adds exactly one (files outlive a graceful restart).
local TALLY = "open('/home/user/tally', 'a').write('x\\n')\nlen(open('/home/user/tally').read().splitlines())"

local function warmbox_cli(args)
  local p = assert(io.popen("cd " .. wbd.sh_quote(wbd.root()) .. " && env -u E2B_API_KEY -u E2B_API_URL "
    .. hosts.lua_env() .. " lua5.4 bin/warmbox " .. args .. " 2>&1"))
  local out = p:read("a")
  p:close()
  return out
end

-- How many executes the server `st` has received (its admin API's counters).
local function executes(st)
  local http = require("warmbox.core").http{ timeout = 10 }
  local res = http:request{ method = "GET", url = st.url .. "/_warmboxd/stats",
    headers = { ["X-Warmboxd-Token"] = st.admin_token } }
  http:close()
  local stats = res and res.status == 200 and cjson.decode(res.body) or {}
  return (stats.requests or {})["interp POST /execute"] or 0
end

describe("a luv host outlives its shared server", function()
  local host, conn

  local function ask(code)
    assert(conn:send(cjson.encode({ key = "outlive:1", code = code }) .. "\n"))
    local line = assert(conn:receive("*l"))
    return cjson.decode(line), line
  end

  lazy_setup(function()
    server.stop_local()
    -- The shared server the host starts ends after 2 s with no running sandbox.
    host = hosts.start("env WARMBOX_SERVER_IDLE_EXIT=2 lua5.4 examples/luv/server.lua 0",
      "listening on 127%.0%.0%.1:(%d+)")
    conn = require("socket").connect("127.0.0.1", host.port)
    conn:settimeout(120)
  end)
  lazy_teardown(function()
    if conn then conn:close() end
    hosts.stop(host)
    server.stop_local()
  end)

  it("keeps answering across `warmbox server stop`, an idle exit and kill -9, each cell run once", function()
    local a, line = ask(TALLY)
    assert.is_true(a.ok, line)
    assert.equal("1", a.text)
    local first = assert(server.local_server())

    -- `warmbox server stop`: the running sandbox is paused (files kept), the
    -- state file removed; the host's next run starts a server and resumes it.
    assert.matches("stopped the local server", warmbox_cli("server stop"))
    assert.is_false(server.alive(first.pid))
    a, line = ask(TALLY)
    assert.is_true(a.ok, line)
    assert.equal("2", a.text)
    local second = assert(server.local_server())
    assert.are_not.equal(first.pid, second.pid)

    -- An idle exit: once the conversation's sandbox is paused, nothing runs
    -- and the server ends by itself (WARMBOX_SERVER_IDLE_EXIT=2).
    local http = require("warmbox.core").http{ timeout = 30 }
    local list = assert(http:request{ method = "GET", url = second.url .. "/sandboxes",
      headers = { ["X-API-Key"] = second.api_key } })
    for _, sb in ipairs(cjson.decode(list.body)) do
      local res = assert(http:request{ method = "POST", url = second.url .. "/sandboxes/" .. sb.sandboxID .. "/pause",
        headers = { ["X-API-Key"] = second.api_key } })
      assert.equal(204, res.status)
    end
    http:close()
    assert.is_true(wbd.eventually(function() return not server.alive(second.pid) end, 60),
      "the shared server did not exit when idle")
    a, line = ask(TALLY)
    assert.is_true(a.ok, line)
    assert.equal("3", a.text)
    local third = assert(server.local_server())
    assert.are_not.equal(second.pid, third.pid)

    -- kill -9: the running sandbox dies with the server (only paused ones are
    -- kept); the next run gets a new one, and the cell runs once in it.
    assert.is_true(os.execute("kill -9 " .. third.pid))
    assert.is_true(wbd.eventually(function() return not server.alive(third.pid) end, 30))
    a, line = ask(TALLY)
    assert.is_true(a.ok, line)
    assert.equal("1", a.text)
    local fourth = assert(server.local_server())
    assert.are_not.equal(third.pid, fourth.pid)
  end)

  it("never sends again a cell that may have left: a kill -9 during the cell fails that run only", function()
    local st = assert(server.local_server())
    local before = executes(st)
    -- once the cell's execute reached the server, the server dies under it
    assert(conn:send(cjson.encode({ key = "outlive:1",
      code = "import time\ntime.sleep(30)\n'slept'" }) .. "\n"))
    assert.is_true(wbd.eventually(function() return executes(st) >= before + 1 end, 60),
      "the cell's execute never reached the server")
    assert.is_true(os.execute("kill -9 " .. st.pid))
    local line = assert(conn:receive("*l"))
    local a = cjson.decode(line)
    -- the cell may have run: the run is reported, never re-sent (a re-sent cell
    -- would answer 'slept' 30 s later from a new sandbox)
    assert.is_false(a.ok, line)
    -- and the host goes on: the next run works on a server started again
    a, line = ask("6 * 7")
    assert.is_true(a.ok, line)
    assert.equal("42", a.text)
  end)
end)
