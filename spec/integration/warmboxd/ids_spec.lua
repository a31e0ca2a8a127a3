-- A sandbox's id is what its data plane asks of a sandbox without an access
-- token, so nothing warmboxd shows every local user carries one: the tmpfs
-- mount points in /proc/PID/mountinfo, the cgroups, bubblewrap's command
-- lines name the runtime (a keyed hash of the id) instead. And with
-- --secure-all (warmbox's own servers) every sandbox has a token: no
-- data-plane call runs on an id alone.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>/dev/null"))
  local out = p:read("a")
  p:close()
  return out
end

local function main_text(body)
  return body:match('"type": *"result".-"text": *"(.-)"') or body
end

describe("warmboxd shows no sandbox id to the host", function()
  local srv
  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function() if srv then srv:stop() end end)

  it("in its mountinfo, its cgroups and bubblewrap's command lines", function()
    local sb = http.create_interp(srv)
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute",
      { json = { code = "import subprocess\nsubprocess.Popen(['sleep', '600'])\n1" }, timeout = 120 })
    assert.are.equal(200, res.status, res.body)
    local id = sb.sandboxID
    -- every local user can read these
    local mountinfo = assert(wbd.read_all("/proc/" .. srv.pid .. "/mountinfo"))
    local ps = sh("ps -eo args=")
    local cgroups = sh("ls /sys/fs/cgroup/*/warmboxd-" .. srv.pid .. "/")
    assert.is_nil(mountinfo:find(id, 1, true), mountinfo)
    assert.is_nil(ps:find(id, 1, true))
    assert.is_nil(cgroups:find(id, 1, true), cgroups)
    local name = srv:runtime_name(id)
    assert.matches("^r%x+$", name)
    assert.are.equal(21, #name)
    -- where the id was, the runtime's name is (so the checks above look at the right places)
    if srv:sandbox_dir(id):find("^/") and mountinfo:find("tmpfs", 1, true) then
      assert.is_truthy(mountinfo:find(name, 1, true), mountinfo)
    end
    assert.is_truthy(ps:find(name, 1, true))
    if cgroups ~= "" then assert.is_truthy(cgroups:find(name, 1, true), cgroups) end
    -- the sandbox itself still knows its id
    res = http.sandbox(srv, sb, 49999, "POST", "/execute",
      { json = { code = "import os\nos.environ['E2B_SANDBOX_ID']" }, timeout = 120 })
    assert.is_truthy(main_text(res.body):find(id, 1, true), res.body)
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. id).status)
  end)

  it("without --secure-all, a sandbox created without secure answers on its id alone (E2B's behaviour)", function()
    local sb = http.create(srv, { templateID = "base", timeout = 600 })
    assert.is_nil(sb.envdAccessToken)
    local res = http.sandbox(srv, sb, 49983, "POST", "/process.Process/List",
      { json = {}, headers = { ["Connect-Protocol-Version"] = "1" } })
    assert.are.equal(200, res.status, res.body)
  end)
end)

describe("warmboxd --secure-all", function()
  local srv
  lazy_setup(function() srv = wbd.start{ args = { "--secure-all" } } end)
  lazy_teardown(function() if srv then srv:stop() end end)

  it("gives every sandbox an access token, and its data plane wants it", function()
    local sb = http.create(srv, { templateID = "code-interpreter-v1", timeout = 600, secure = false })
    assert.matches("^ea_%x+$", sb.envdAccessToken)
    local by_id = { sandboxID = sb.sandboxID }
    local rpc = { json = {}, headers = { ["Connect-Protocol-Version"] = "1" } }
    assert.are.equal(401, http.sandbox(srv, by_id, 49983, "POST", "/process.Process/List", rpc).status)
    assert.are.equal(401, http.sandbox(srv, by_id, 49999, "POST", "/execute", { json = { code = "1" } }).status)
    assert.are.equal(401, http.sandbox(srv, by_id, 49983, "GET", "/files?path=/etc/hostname").status)
    assert.are.equal(200, http.sandbox(srv, sb, 49983, "POST", "/process.Process/List", rpc).status)
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute", { json = { code = "40 + 2" }, timeout = 120 })
    assert.are.equal("42", main_text(res.body))
    -- /health stays open
    assert.are.equal(204, http.sandbox(srv, by_id, 49983, "GET", "/health").status)
    -- a fork has a token of its own
    local fork = http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/fork", {})
    assert.are.equal(201, fork.status, fork.body)
    local child = fork.json[1].sandbox
    assert.matches("^ea_%x+$", child.envdAccessToken)
    assert.are_not.equal(sb.envdAccessToken, child.envdAccessToken)
    assert.are.equal(401, http.sandbox(srv, { sandboxID = child.sandboxID }, 49983, "POST",
      "/process.Process/List", rpc).status)
  end)

  it("is on for warmbox's embedded servers", function()
    local server = require "warmbox.server"
    local s = assert(server.start{ bin = wbd.bin() })
    local ok, err = pcall(function()
      local res = http.request{ method = "POST", url = s.url .. "/sandboxes", headers = { ["X-API-Key"] = s.api_key },
        json = { templateID = "base", timeout = 60 } }
      assert.are.equal(201, res.status, res.body)
      assert.matches("^ea_%x+$", res.json.envdAccessToken)
      res = http.request{ method = "POST", url = s.url .. "/process.Process/List", json = {},
        headers = { ["E2b-Sandbox-Id"] = res.json.sandboxID, ["E2b-Sandbox-Port"] = "49983",
          ["Connect-Protocol-Version"] = "1" } }
      assert.are.equal(401, res.status)
    end)
    s:stop()
    assert(ok, err)
  end)
end)
