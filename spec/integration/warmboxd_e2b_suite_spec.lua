-- Two tests of E2B's JS SDK suite, as their requests go over the wire,
-- against warmboxd with its default flags (no --resume-ms, no --max-running):
-- `fork with count lower than 1 fails` (an InvalidArgumentError: E2B's 400
-- with its error body, before the sandbox is looked up) and `pause and resume
-- a sandbox with completed long running process` (a background command
-- started just before a pause has written its file 2 s after the resume).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local envd = require "spec.helpers.envd"

local q = wbd.sh_quote

describe("warmboxd with default flags: E2B's JS SDK tests over the wire", function()
  local srv

  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("fork with count lower than 1 fails: 400 with E2B's error body, even for an unknown sandbox", function()
    local res = http.api(srv, "POST", "/sandboxes/sbx-test/fork", { count = 0, timeout = 300 })
    assert.equal(400, res.status, res.body)
    assert.equal(400, res.json.code)
    assert.is_string(res.json.message)
    assert.matches("count", res.json.message, 1, true)
  end)

  -- commands.run(cmd, { background = true }): envd's Process/Start as the SDK
  -- sends it (`/bin/bash -l -c cmd`), kept open in the background; returns
  -- once the start event came (when the SDK's run returns), and the files
  -- holding the stream.
  local function run_background(sb, cmd)
    local tmp = os.tmpname()
    local f = assert(io.open(tmp .. ".req", "wb"))
    f:write(envd.envelope(0, { process = { cmd = "/bin/bash", args = { "-l", "-c", cmd }, envs = {} } }))
    f:close()
    os.execute(string.format("(env -u LD_PRELOAD curl -sS -N --max-time 60 -X POST -H %s -H %s -H %s -H %s -H %s"
      .. " --data-binary @%s %s > %s 2>/dev/null) &",
      q("E2b-Sandbox-Id: " .. sb.sandboxID), q("E2b-Sandbox-Port: 49983"), q("X-Access-Token: " .. sb.envdAccessToken),
      q("Content-Type: application/connect+json"), q("Connect-Protocol-Version: 1"), q(tmp .. ".req"),
      q(srv.url .. "/process.Process/Start"), q(tmp .. ".out")))
    -- as soon as it came, as the SDK goes on at once
    local core = require "warmbox.core"
    local deadline = core.now() + 30
    while not (wbd.read_all(tmp .. ".out") or ""):find('"start"', 1, true) do
      assert.is_true(core.now() < deadline, "no start event")
      core.sleep(0.001)
    end
    return tmp
  end

  -- The SDK's requests go on kept-alive connections, one right after another:
  -- so do these (libcurl in this process, not a curl per request).
  local client
  local function call(method, path, body, headers)
    client = client or require("warmbox.core").http{ timeout = 30 }
    local h = { ["X-API-Key"] = srv.api_key, ["Content-Type"] = body and "application/json" or nil }
    for k, v in pairs(headers or {}) do h[k] = v end
    return assert(client:request{ method = method, url = srv.url .. path, headers = h, body = body })
  end
  local function file(sb, path)
    return call("GET", "/files?path=" .. envd.urlencode(path) .. "&username=user", nil,
      { ["E2b-Sandbox-Id"] = sb.sandboxID, ["E2b-Sandbox-Port"] = "49983", ["X-Access-Token"] = sb.envdAccessToken })
  end

  it("pause and resume a sandbox with completed long running process", function()
    for attempt = 1, 3 do
      local sb = http.create(srv, { templateID = "base", secure = true, timeout = 600 })
      local tmp = run_background(sb, 'sleep 2 && echo "done" > /home/user/test_long_running.txt')
      -- the file should not exist before 2 seconds have elapsed
      assert.equal(404, file(sb, "/home/user/test_long_running.txt").status)
      assert.equal(204, call("POST", "/sandboxes/" .. sb.sandboxID .. "/pause").status)
      -- (201: the connect resumed it)
      assert.equal(201, call("POST", "/sandboxes/" .. sb.sandboxID .. "/connect", '{"timeout":600}').status)
      -- the SDK test waits 2 s after the connect, then reads the file
      wbd.sleep(2)
      local res = file(sb, "/home/user/test_long_running.txt")
      assert.equal(200, res.status, "attempt " .. attempt .. ": " .. tostring(res.body))
      assert.equal("done\n", res.body)
      assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
      for _, s in ipairs({ "", ".req", ".out" }) do os.remove(tmp .. s) end
    end
  end)
end)
