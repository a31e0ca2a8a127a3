-- warmbox.server: finding, starting and stopping the embedded warmboxd (with a
-- stand-in script that behaves like warmboxd at start-up).
local server = require "warmbox.server"

local function write_script(body)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write("#!/bin/sh\n", body, "\n")
  f:close()
  os.execute("chmod +x '" .. path .. "'")
  return path
end

local alive = server.alive

describe("warmbox.server", function()
  it("starts the binary with --port 0, parses its address, and stops it", function()
    local argsfile = os.tmpname()
    local bin = write_script("echo \"$@\" > '" .. argsfile .. "'\n"
      .. "echo 'warmboxd listening on http://127.0.0.1:45678'\nexec sleep 60")
    local srv = assert(server.start{ bin = bin, args = { "--rtt-ms", "20" } })
    assert.equal("http://127.0.0.1:45678", srv.url)
    assert.equal(45678, srv.port)
    assert.matches("^e2b_%x+$", srv.api_key)
    assert.equal(44, #srv.api_key)
    local f = io.open(argsfile)
    local args = f:read("a")
    f:close()
    -- --exit-with names this process (it reads its own /proc/self/stat)
    local me = tonumber(io.open("/proc/self/stat"):read("a"):match("^(%d+)"))
    -- the token on every data-plane call (warmbox's client sends it everywhere), its one API
    -- key in a 0600 file of its directory, then the caller's arguments
    assert.matches("^%-%-port 0 %-%-data%-dir /tmp/warmboxd%.%w+/data %-%-strict%-tokens %-%-secure%-all "
      .. "%-%-exit%-with " .. me .. " %-%-api%-key%-file /tmp/warmboxd%.%w+/api%-key %-%-rtt%-ms 20\n$", args)
    assert.is_true(alive(srv.pid))
    local dir = srv.dir
    assert.is_true(srv:stop())
    assert.is_false(alive(srv.pid))
    assert.is_nil(io.open(dir))
    assert.is_true(srv:stop())
    os.remove(bin)
    os.remove(argsfile)
  end)

  it("reports a binary that exits at start with its output", function()
    local bin = write_script("echo 'warmboxd: cannot bind' >&2\nexit 3")
    local srv, err, code = server.start{ bin = bin }
    os.remove(bin)
    assert.is_nil(srv)
    assert.equal("warmboxd exited at start: warmboxd: cannot bind", err)
    assert.equal("TRANSPORT", code)
  end)

  it("reports a binary that does not print its address in time, and stops it", function()
    local pidfile = os.tmpname()
    local bin = write_script("echo $$ > '" .. pidfile .. "'\nexec sleep 60")
    local srv, err, code = server.start{ bin = bin, start_timeout = 1 }
    os.remove(bin)
    assert.is_nil(srv)
    assert.equal("warmboxd did not print its address in time", err)
    assert.equal("TIMEOUT", code)
    local f = io.open(pidfile)
    local pid = f:read("n")
    f:close()
    os.remove(pidfile)
    assert.is_false(alive(pid))
  end)

  it("does not find a binary that is not there", function()
    local p, err, code = server.find_bin("/nonexistent/warmboxd")
    assert.is_nil(p)
    assert.equal("warmboxd not found at '/nonexistent/warmboxd'", err)
    assert.equal("NOT_FOUND", code)
  end)
end)
