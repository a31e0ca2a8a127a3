-- warmbox.new{} with no key and no URL uses the user's one
-- shared local warmboxd (the one of `warmbox server start`, through its state
-- file), started for the user when none runs: every process of the user sees
-- the same sandboxes. scripts/test gives each spec file its own
-- XDG_RUNTIME_DIR, so this file's shared server is its own.
local wbd = require "spec.helpers.warmboxd"
local server = require "warmbox.server"

local q = wbd.sh_quote
local COUNTER = "x = globals().get('x', 0) + 1\nx"

-- A lua5.4 command line running `code` with this tree's modules, no E2B key.
local function lua_cmd(code)
  local build = require("warmbox.core").module_path():match("^(.*)/warmbox/[^/]*$")
  local prelude = 'package.path = "lua/?.lua;lua/?/init.lua;" .. package.path; package.cpath = '
    .. string.format("%q", build .. "/?.so;" .. build .. "/?/?.so;") .. " .. package.cpath\n"
  return "cd " .. q(wbd.root()) .. " && env -u E2B_API_KEY -u E2B_API_URL lua5.4 -e " .. q(prelude .. code)
end

-- Another process: runs COUNTER on `key` for every line it reads on stdin,
-- appending each result to `out`.
local function counter_process(key, out)
  local code = table.concat({
    'local wb = assert(require("warmbox").new{})',
    'local s = wb:session(' .. string.format("%q", key) .. ')',
    'for _ in io.lines() do',
    '  local r = assert(s:run(' .. string.format("%q", COUNTER) .. '))',
    '  local f = assert(io.open(' .. string.format("%q", out) .. ', "a")) f:write(r.text, "\\n") f:close()',
    'end',
  }, "\n")
  return assert(io.popen(lua_cmd(code) .. " 2>>" .. q(out .. ".err"), "w"))
end

local function lines_of(path)
  local t = {}
  for l in ((wbd.read_all(path) or "")):gmatch("[^\n]+") do t[#t + 1] = l end
  return t
end

describe("warmbox.new{}: the user's shared local server", function()
  local warmbox = require "warmbox"

  lazy_teardown(function() server.stop_local() end)

  it("two processes alternating on one key see one sandbox: the counter gives 1..6", function()
    local key = "shared:counter:" .. wbd.new_key()
    local out = os.tmpname()
    os.remove(out)
    local wb = assert(warmbox.new{})
    local s = wb:session(key)
    local other = counter_process(key, out)
    local got = {}
    for turn = 1, 3 do
      got[#got + 1] = assert(s:run(COUNTER)).text
      other:write("\n")
      other:flush()
      assert.is_true(wbd.eventually(function() return #lines_of(out) >= turn end, 60),
        "the other process gave no answer: " .. tostring(wbd.read_all(out .. ".err")))
      got[#got + 1] = lines_of(out)[turn]
    end
    other:close()
    assert.same({ "1", "2", "3", "4", "5", "6" }, got)
    -- the same server as `warmbox server status` names
    local st = assert(server.local_server())
    assert.equal(st.url, wb.server.url)
    assert.matches("^warmbox.Warmbox: the shared local warmboxd at http://127%.0%.0%.1:%d+ %(pid %d+%)$",
      tostring(wb))
    -- wb:close() leaves the shared server running, for the other processes
    wb:close()
    assert.is_true(server.alive(st.pid))
    os.remove(out)
    os.remove(out .. ".err")
  end)

  it("many processes starting at once agree on one server", function()
    server.stop_local()
    assert.is_nil(server.local_server())
    local outs, cmds = {}, {}
    for i = 1, 4 do
      outs[i] = os.tmpname()
      cmds[i] = "(" .. lua_cmd('local wb = assert(require("warmbox").new{}) print(wb.server.pid, wb.server.url)')
        .. " >" .. q(outs[i]) .. " 2>&1) &"
    end
    assert.is_true(os.execute(table.concat(cmds, " ") .. " wait"))
    local seen = {}
    for i = 1, 4 do
      local pid, url = (wbd.read_all(outs[i]) or ""):match("^(%d+)%s+(%S+)")
      assert.is_truthy(pid, "process " .. i .. ": " .. tostring(wbd.read_all(outs[i])))
      seen[pid .. " " .. url] = true
      os.remove(outs[i])
    end
    local st = assert(server.local_server())
    assert.same({ [st.pid .. " " .. st.url] = true }, seen)
    -- and only that one warmboxd serves this state directory
    local ps = io.popen("ps -eo pid=,args=")
    local n = 0
    for line in ps:lines() do
      if line:find(server.state_dir() .. "/warmboxd/data", 1, true) then n = n + 1 end
    end
    ps:close()
    assert.equal(1, n)
  end)

  it("outlives the process that started it; `server stop` ends it, its paused sandboxes kept (files)", function()
    server.stop_local()
    local key = "shared:restart:" .. wbd.new_key()
    -- a process that starts the server, runs a cell, and exits
    assert.is_true(os.execute(lua_cmd('local wb = assert(require("warmbox").new{}) '
      .. 'assert(wb:session(' .. string.format("%q", key) .. '):run(' .. string.format("%q", COUNTER) .. '))')))
    local st = assert(server.local_server())
    local wb = assert(warmbox.new{})
    assert.equal(st.pid, wb.server.pid)
    local r = assert(wb:session(key):run(COUNTER .. "\nopen('/home/user/kept.txt', 'w').write('turn 2')\nx"))
    assert.equal("2", r.text)
    wb:close()
    -- stopped (as `warmbox server stop` does): the next warmbox.new{} starts a new
    -- one, in which the conversation finds its sandbox again, files kept, kernel
    -- afresh (see docs/warmboxd.md, "The shared local server")
    assert.is_truthy(server.stop_local())
    assert.is_false(server.alive(st.pid))
    local wb2 = assert(warmbox.new{})
    assert.are_not.equal(st.pid, wb2.server.pid)
    local s2 = wb2:session(key)
    local r2 = assert(s2:run(COUNTER))
    assert.equal("1", r2.text)
    -- the result says the kernel's memory was lost (its hooks were gone)
    assert.is_true(r2.memory_lost)
    assert.is_nil(assert(s2:run(COUNTER)).memory_lost)
    assert.equal(r.sandbox_id, r2.sandbox_id)
    assert.equal("turn 2", assert(s2:run("open('/home/user/kept.txt').read()")).text:gsub("'", ""))
    wb2:close()
  end)

  it("ends by itself once no sandbox ran for idle_exit seconds", function()
    server.stop_local()
    local st = assert(server.start_local{ idle_exit = 1 })
    assert.is_true(wbd.eventually(function() return not server.alive(st.pid) end, 60))
    local none, why = server.local_server()
    assert.is_nil(none)
    assert.matches("stale state file", why)
    -- the next warmbox.new{} starts another
    local wb = assert(warmbox.new{})
    assert.are_not.equal(st.pid, wb.server.pid)
    wb:close()
  end)

  it("a state file naming a live warmboxd that is not the user's shared server: a fresh one is started", function()
    server.stop_local()
    -- another warmboxd of this user (an embedded one), named by a state file
    -- in place of the shared server (its pid reused, say)
    local other = assert(server.start{})
    local sdir = server.state_dir()
    assert(os.execute("mkdir -p -m 0700 " .. q(sdir)))
    local f = assert(io.open(sdir .. "/server.json", "w"))
    f:write(require("cjson").encode({ url = other.url, pid = other.pid, api_key = "e2b_" .. string.rep("b", 40),
      admin_token = "not-its-token", dir = sdir .. "/warmboxd" }))
    f:close()
    local none, why = server.local_server()
    assert.is_nil(none)
    assert.matches("is not this user's shared warmboxd", why, 1, true)
    local wb = assert(warmbox.new{})
    assert.are_not.equal(other.pid, wb.server.pid)
    assert.equal("42", assert(wb:session("not-ours:1"):run("6 * 7")).text)
    wb:close()
    other:stop()
  end)

  it("`warmbox server status` names the same server and says how it ends", function()
    local wb = assert(warmbox.new{})
    local p = assert(io.popen("cd " .. q(wbd.root()) .. " && env -u E2B_API_KEY bin/warmbox server status 2>&1"))
    local out = p:read("a")
    p:close()
    assert.matches("running at " .. wb.server.url:gsub("%p", "%%%0") .. " %(pid " .. wb.server.pid, out)
    assert.matches("it ends once no sandbox has run for 3600 s, or on `warmbox server stop`; paused sandboxes "
      .. "are kept for its next start (files, not memory)", out, 1, true)
    wb:close()
  end)

  it("a server started by a host with a strict umask (Prosody's 027) runs cells", function()
    server.stop_local()
    local p = assert(io.popen("umask 027 && " .. lua_cmd('local wb = assert(require("warmbox").new{}) '
      .. 'local r = assert(wb:session("umask:1"):run("6 * 7")) print(r.text or r.error.name)') .. " 2>&1"))
    local out = p:read("a")
    p:close()
    assert.equal("42\n", out)
  end)

  it("a private server stays available: server = 'private', stopped by close", function()
    local wb = assert(warmbox.new{ server = "private", lock = "memory" })
    assert.matches("^warmbox.Warmbox: a private local warmboxd at ", tostring(wb))
    local pid = wb.server.pid
    local st = server.local_server()
    assert.is_true(st == nil or st.pid ~= pid)
    wb:close()
    assert.is_false(server.alive(pid))
  end)

  it("tostring names the other backends: E2B, an E2B-compatible server, the caller's client", function()
    local e2b = assert(warmbox.new{ api_key = "e2b_" .. string.rep("a", 40) })
    assert.equal("warmbox.Warmbox: E2B (https://api.e2b.app)", tostring(e2b))
    local other = assert(warmbox.new{ api_key = "e2b_" .. string.rep("a", 40), api_url = "http://10.1.2.3:3000" })
    assert.equal("warmbox.Warmbox: an E2B-compatible server at http://10.1.2.3:3000", tostring(other))
    local own = assert(warmbox.new{ client = { list_all = function() return {} end } })
    assert.equal("warmbox.Warmbox: a client of the caller's", tostring(own))
    e2b:close()
    other:close()
    assert.equal("warmbox.Warmbox (closed)", tostring(e2b))
  end)

  it("refuses a bad server mode, and warmboxd_args without a private server", function()
    assert.has_error(function() warmbox.new{ server = "mine" } end,
      "bad argument #1 to 'new' (option 'server': \"shared\" or \"private\" expected, got \"mine\")")
    assert.has_error(function() warmbox.new{ warmboxd_args = { "--rtt-ms", "1" } } end,
      "bad argument #1 to 'new' (option 'warmboxd_args': only with server = \"private\" (the shared server "
        .. "is started once, for every process of the user))")
  end)
end)
