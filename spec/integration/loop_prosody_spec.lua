-- warmbox.loop.prosody and examples/prosody/mod_warmbox.lua,
-- in a real Prosody (Debian's prosody, Lua 5.4) on loopback: a conversation
-- through its HTTP server, and a run that does not block Prosody (a ping and
-- another conversation's run are answered while a long cell is in flight).
local wbd = require "spec.helpers.warmboxd"
local hosts = require "spec.helpers.hosts"

local q = wbd.sh_quote

-- A Prosody configuration in dir: HTTP only, on port, with mod_warmbox.
local function write_config(dir, port)
  local cfg = dir .. "/prosody.cfg.lua"
  local f = assert(io.open(cfg, "w"))
  f:write(table.concat({
    string.format("plugin_paths = { %q }", hosts.root() .. "/examples/prosody"),
    string.format("data_path = %q", dir),
    string.format("pidfile = %q", dir .. "/prosody.pid"),
    string.format("log = { debug = %q }", dir .. "/prosody.log"),
    'run_as_root = true',
    'modules_enabled = { "http", "warmbox" }',
    'c2s_ports = {} s2s_ports = {} component_ports = {} https_ports = {}',
    string.format("http_ports = { %d }", port),
    'http_interfaces = { "127.0.0.1" }',
    'http_default_host = "localhost"',
    'VirtualHost "localhost"',
  }, "\n"), "\n")
  f:close()
  return cfg
end

describe("examples/prosody/mod_warmbox.lua in Prosody", function()
  local host, dir, base
  lazy_setup(function()
    local p = assert(io.popen("mktemp -d /tmp/wb-prosody.XXXXXX"))
    dir = p:read("l")
    p:close()
    local port = hosts.free_port()
    local cfg = write_config(dir, port)
    base = "http://127.0.0.1:" .. port .. "/warmbox"
    host = hosts.start("prosody -F --config " .. q(cfg), "()", 5)
    assert.is_true(wbd.eventually(function() return hosts.http("GET", base .. "/ping", nil, 5) == 200 end, 60),
      "prosody did not serve: " .. tostring(wbd.read_all(host.log)) .. tostring(wbd.read_all(dir .. "/prosody.log")))
  end)
  lazy_teardown(function()
    hosts.stop(host)
    if dir then os.execute("rm -rf " .. q(dir)) end
    require("warmbox.server").stop_local()
  end)

  it("serves one conversation: the counter cell gives 1, 2, 3", function()
    local got = {}
    for i = 1, 3 do
      local status, body = hosts.http("POST", base .. "/run/prosody:1", hosts.COUNTER)
      assert.equal(200, status, body)
      got[i] = body:gsub("\n$", "")
    end
    assert.same({ "1", "2", "3" }, got)
    local status, body = hosts.http("POST", base .. "/run/prosody:1", "1/0")
    assert.equal(422, status)
    assert.matches("ZeroDivisionError", body)
  end)

  it("answers a ping and another conversation's run while a long cell runs", function()
    assert.equal(200, (hosts.http("POST", base .. "/run/prosody:other", "0")))
    local out = os.tmpname()
    -- the long cell, from another process: it is in flight once its first line printed
    assert.is_true(os.execute("(curl -s -X POST --data-binary " .. q("print('started', flush=True)\nimport time\n"
      .. "time.sleep(5)\n'slow'") .. " " .. q(base .. "/run/prosody:slow") .. " >" .. q(out) .. " 2>&1 &)"))
    assert.is_true(wbd.eventually(function()
      return (wbd.read_all(dir .. "/prosody.log") or ""):find("POST /warmbox/run/prosody:slow", 1, true) ~= nil
    end, 30), "the long run did not reach Prosody")
    local s1, b1 = hosts.http("GET", base .. "/ping")
    local s2, b2 = hosts.http("POST", base .. "/run/prosody:other", "6 * 7")
    -- both answered while the slow cell still ran (its answer not in yet)
    assert.equal("", wbd.read_all(out) or "")
    assert.equal(200, s1)
    assert.equal("pong", b1)
    assert.equal(200, s2, b2)
    assert.equal("42\n", b2)
    assert.is_true(wbd.eventually(function() return (wbd.read_all(out) or "") ~= "" end, 60))
    assert.equal("slow\n", wbd.read_all(out))
    os.remove(out)
  end)
end)

describe("examples/prosody/mod_warmbox.lua in a daemonized Prosody (prosody -D, as Debian's service)", function()
  local dir, base, pid
  lazy_setup(function()
    local p = assert(io.popen("mktemp -d /tmp/wb-prosody.XXXXXX"))
    dir = p:read("l")
    p:close()
    local port = hosts.free_port()
    local cfg = write_config(dir, port)
    base = "http://127.0.0.1:" .. port .. "/warmbox"
    -- -D: Prosody loads its modules, then forks (mod_posix) and the parent exits
    assert.is_true(os.execute("cd " .. q(hosts.root()) .. " && env -u E2B_API_KEY -u E2B_API_URL " .. hosts.lua_env()
      .. " prosody -D --config " .. q(cfg) .. " >" .. q(dir .. "/stdout.log") .. " 2>&1"))
    assert.is_true(wbd.eventually(function() return hosts.http("GET", base .. "/ping", nil, 5) == 200 end, 60),
      "prosody did not serve: " .. tostring(wbd.read_all(dir .. "/prosody.log")))
    pid = tonumber(wbd.read_all(dir .. "/prosody.pid"))
  end)
  lazy_teardown(function()
    if pid then require("warmbox.server").kill(pid, 20) end
    if dir then os.execute("rm -rf " .. q(dir)) end
    require("warmbox.server").stop_local()
  end)

  it("runs a conversation in the forked child: the counter cell gives 1, 2", function()
    local log = wbd.read_all(dir .. "/prosody.log") or ""
    assert.matches("Successfully daemonized to PID " .. pid, log, 1, true)
    local got = {}
    for i = 1, 2 do
      local status, body = hosts.http("POST", base .. "/run/prosody-daemon:1", hosts.COUNTER)
      assert.equal(200, status, body)
      got[i] = body:gsub("\n$", "")
    end
    assert.same({ "1", "2" }, got)
  end)
end)
