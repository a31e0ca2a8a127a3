-- `warmbox smoke` against a real warmboxd started with --resume-ms 1000
-- --rtt-ms 20: every step passes and nothing is left behind (the idle pause
-- in real time: the lease really ends); with the resume route failing, it
-- exits 1 naming that step and still cleans up (warmboxd's clock is moved
-- past the lease for the idle pause).
local wbd = require "spec.helpers.warmboxd"
local sessions = require "spec.helpers.sessions"
local core = require "warmbox.core"

local ROOT = wbd.root()
local STEPS = require("warmbox.smoke").STEPS

describe("warmbox smoke (warmboxd)", function()
  local env = sessions.new()
  local srv

  lazy_setup(function() srv = env:start{ args = { "--resume-ms", "1000", "--rtt-ms", "20" } } end)
  lazy_teardown(function() env:stop() end)

  -- Starts `warmbox smoke` against srv in the background; returns a handle
  -- with :output() (stdout and stderr so far) and :wait() -> exit status, output.
  local function smoke()
    local tmp = os.tmpname()
    local build = core.module_path():match("^(.*)/warmbox/[^/]*$")
    local cmd = string.format("cd %s && (WARMBOX_BUILD_DIR=%s lua5.4 bin/warmbox --api-url %s --api-key %s "
      .. "--exec-timeout 4 --idle-timeout 2 smoke >%s 2>&1; echo $? >%s.rc) & echo $!",
      wbd.sh_quote(ROOT), wbd.sh_quote(build), wbd.sh_quote(srv.url), wbd.sh_quote(srv.api_key), tmp, tmp)
    local p = assert(io.popen(cmd))
    p:read("l")
    p:close()
    local h = {}
    function h.output() return wbd.read_all(tmp) or "" end
    function h.wait()
      -- The shell creates the file before echo writes to it: wait for the digits.
      local rc = wbd.eventually(function() return (wbd.read_all(tmp .. ".rc") or ""):match("%d+") end, 120)
      local out = h.output()
      os.remove(tmp)
      os.remove(tmp .. ".rc")
      return tonumber(rc), out
    end
    return h
  end

  local function left_behind()
    local client = require("warmbox.e2b").new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key }
    local items = assert(client:list_all{ state = { "running", "paused" } })
    client:close()
    return #items
  end

  it("takes no arguments (status 2) and prints its usage with --help", function()
    local function cli(args)
      local out = {}
      local sink = { flush = function() end }
      function sink.write(_, ...)
        for _, v in ipairs{ ... } do out[#out + 1] = v end
      end
      return require("warmbox.cli").main(args, { stdout = sink, stderr = sink }), table.concat(out)
    end
    local status, out = cli{ "smoke", "extra" }
    assert.equal(2, status)
    assert.matches("smoke takes no arguments", out, 1, true)
    status, out = cli{ "smoke", "--help" }
    assert.equal(0, status)
    assert.matches("usage: warmbox [options] smoke", out, 1, true)
    status, out = cli{ "--help" }
    assert.equal(0, status)
    assert.matches("\n  smoke ", out)
  end)

  it("passes every step in order, exits 0 and leaves no sandbox", function()
    local status, out = smoke().wait()
    assert.equal(0, status, out)
    local pos = 1
    for i, name in ipairs(STEPS) do
      local s, e = out:find(i .. ". " .. name .. "%s+%d+ ms  ok", pos)
      assert.truthy(s, "step " .. i .. " (" .. name .. ") missing or failed:\n" .. out)
      pos = e
    end
    assert.matches("\nsmoke ok\n$", out)
    assert.equal(0, left_behind())
  end)

  it("exits 1 naming the step that failed (the resume is refused) and still cleans up", function()
    local h = smoke()
    -- once the sandbox is warm and checked, every resume of it fails
    assert.truthy(wbd.eventually(function() return h.output():find("3. output isolation", 1, true) end, 60),
      h.output())
    env:fault("POST /sandboxes/{id}/connect", { count = 100, status = 500 })
    srv:advance(10) -- past the lease (the 4 s exec timeout + LEASE_MARGIN): warmboxd pauses the sandbox
    local status, out = h.wait()
    assert.equal(1, status, out)
    assert.matches("4. idle pause%s+%d+ ms  ok", out)
    assert.matches("5. resume with state%s+%d+ ms  FAILED", out)
    assert.is_nil(out:find("6. gc", 1, true), out)
    assert.matches("cleaned up: %d+ sandbox", out)
    assert.matches("smoke FAILED at step 'resume with state'\n$", out)
    assert.equal(0, left_behind())
  end)
end)
