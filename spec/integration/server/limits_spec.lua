-- The shared local server's limits: a developer's default (many
-- conversations at once are not refused), `warmbox server start` flags and
-- environment variables, and a refusal that names the local setting rather
-- than E2B's billing page. scripts/test gives this file its own
-- XDG_RUNTIME_DIR, so the shared server here is its own.
local wbd = require "spec.helpers.warmboxd"
local hosts = require "spec.helpers.hosts"
local server = require "warmbox.server"

local function warmbox_cli(args, env)
  local p = assert(io.popen("cd " .. wbd.sh_quote(wbd.root()) .. " && env -u E2B_API_KEY -u E2B_API_URL "
    .. (env or "") .. " " .. hosts.lua_env() .. " lua5.4 bin/warmbox " .. args .. " 2>&1; echo \"exit $?\""))
  local out = p:read("a")
  p:close()
  return out
end

describe("the shared local server's limits", function()
  local warmbox = require "warmbox"

  lazy_teardown(function() server.stop_local() end)

  it("runs 50 conversations within minutes with its default settings: none refused", function()
    server.stop_local()
    local wb = assert(warmbox.new{ retry_after_max = 0 })
    local tasks = {}
    -- five waves of 10 at once, each wave's sandboxes kept running: 50 live conversations
    -- (all 50 jails started in one instant outrun a sanitized server's start-up timeouts)
    for wave = 0, 4 do
      for i = wave * 10 + 1, wave * 10 + 10 do
        tasks[i] = wb:spawn(function()
          return wb:session("limits:many:" .. i):run("echo " .. i, { language = "bash" })
        end)
      end
      assert(wb:loop())
    end
    for i, t in ipairs(tasks) do
      local r, msg, code = t:result()
      assert.is_truthy(r, "conversation " .. i .. ": " .. tostring(msg) .. " (" .. tostring(code) .. ")")
      assert.equal(i .. "\n", r.stdout)
    end
    assert.equal(100, assert(server.local_server()).max_running)
    wb:close()
  end)

  it("refuses past --max-running with an error naming the local setting; start --max-running changes it", function()
    server.stop_local()
    assert(server.start_local{ max_running = 1 })
    local wb = assert(warmbox.new{ retries = 0, retry_after_max = 0 })
    assert.equal("1", assert(wb:session("limits:cap:1"):run("1")).text)
    local r, msg, code = wb:session("limits:cap:2"):run("2")
    assert.is_nil(r)
    assert.equal("RATE_LIMITED", code)
    assert.matches("the local server runs at most 1 sandboxes at once; its setting: `warmbox server start "
      .. "--max-running N`", msg, 1, true)
    assert.matches("WARMBOX_SERVER_MAX_RUNNING", msg, 1, true)
    assert.is_nil(msg:find("billing", 1, true))
    -- the flag given to the running server changes it at once
    local out = warmbox_cli("server start --max-running 2")
    assert.matches("already running at", out, 1, true)
    assert.matches("it runs at most 2 sandboxes at once (--max-running)", out, 1, true)
    assert.equal("2", assert(wb:session("limits:cap:2"):run("2")).text)
    wb:close()
  end)

  it("takes its settings from the environment when it starts, and refuses bad ones", function()
    server.stop_local()
    local out = warmbox_cli("server start", "WARMBOX_SERVER_MAX_RUNNING=7 WARMBOX_SERVER_IDLE_EXIT=900")
    assert.matches("it ends once no sandbox has run for 900 s", out, 1, true)
    assert.matches("it runs at most 7 sandboxes at once", out, 1, true)
    assert.equal(7, assert(server.local_server()).max_running)
    server.stop_local()
    out = warmbox_cli("server start", "WARMBOX_SERVER_MAX_RUNNING=many")
    assert.matches("WARMBOX_SERVER_MAX_RUNNING: a number >= 0 expected, got 'many'", out, 1, true)
    assert.matches("exit 2\n$", out)
    out = warmbox_cli("server start --max-running -1")
    assert.matches("--max-running needs an integer >= 0, got '-1'", out, 1, true)
    assert.matches("exit 2\n$", out)
    assert.is_nil(server.local_server())
  end)
end)
