-- Killing a sandbox under a running command over real HTTP: the command's
-- process.Process/Start stream is dropped (no end event, no end-of-stream
-- trailer), as E2B's VM going away drops it, and envd's /health of the killed
-- sandbox answers 502: what the SDK reads as "the sandbox was killed".
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local envd = require "spec.helpers.envd"
local envelope = envd.envelope

local q = wbd.sh_quote

local function read(path) return wbd.read_all(path) or "" end

describe("warmboxd kill under a running command", function()
  local srv

  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  -- Starts `cmd` in a Process/Start stream in the background: returns the
  -- files of its body and of curl's exit code.
  local function start_bg(sb, cmd)
    local tmp = os.tmpname()
    local req = tmp .. ".req"
    local f = assert(io.open(req, "wb"))
    f:write(envelope(0, { process = { cmd = "/bin/bash", args = { "-c", cmd } } }))
    f:close()
    os.execute(string.format("(env -u LD_PRELOAD curl -sS -N --max-time 60 -X POST -H %s -H %s -H %s -H %s -H %s"
      .. " --data-binary @%s %s > %s 2>/dev/null; echo $? > %s) &",
      q("E2b-Sandbox-Id: " .. sb.sandboxID), q("E2b-Sandbox-Port: 49983"), q("X-Access-Token: " .. sb.envdAccessToken),
      q("Content-Type: application/connect+json"), q("Connect-Protocol-Version: 1"), q(req),
      q(srv.url .. "/process.Process/Start"), q(tmp .. ".out"), q(tmp .. ".rc")))
    return tmp
  end

  local function wait_rc(tmp)
    for _ = 1, 400 do
      local rc = read(tmp .. ".rc"):match("%d+")
      if rc then return tonumber(rc) end
      wbd.sleep(0.05)
    end
  end

  local function cleanup(tmp)
    for _, s in ipairs({ "", ".req", ".out", ".rc" }) do os.remove(tmp .. s) end
  end

  it("drops the stream of a running command and answers 502 on /health", function()
    local sb = http.api(srv, "POST", "/sandboxes", { templateID = "base", secure = true, timeout = 600 }).json
    local tmp = start_bg(sb, "echo started; sleep 600")
    for _ = 1, 200 do
      if read(tmp .. ".out"):find("start", 1, true) then break end
      wbd.sleep(0.05)
    end
    wbd.sleep(0.3)
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
    local rc = wait_rc(tmp)
    local body = read(tmp .. ".out")
    cleanup(tmp)
    -- curl 18: the chunked body was cut off (no final chunk)
    assert.are.equal(18, rc, body)
    assert.is_truthy(body:find('"pid"', 1, true), body)
    assert.is_falsy(body:find('"end"', 1, true), body)
    assert.is_falsy(body:find("\2", 1, true), body)
    local res = http.sandbox(srv, sb, 49983, "GET", "/health")
    assert.are.equal(502, res.status)
  end)

  it("still ends normally a command that ends while the sandbox lives", function()
    local sb = http.api(srv, "POST", "/sandboxes", { templateID = "base", secure = true, timeout = 600 }).json
    local tmp = start_bg(sb, "sleep 600 & kill -9 $!; wait; exit 3")
    local rc = wait_rc(tmp)
    local body = read(tmp .. ".out")
    cleanup(tmp)
    assert.are.equal(0, rc, body)
    assert.is_truthy(body:find('"exit status 3"', 1, true), body)
  end)
end)
