-- Behaviour 12 against a real warmboxd: policy hooks are plain Lua functions.
local wbd = require "spec.helpers.warmboxd"
local sessions = require "spec.helpers.sessions"
local http = require "spec.helpers.http"
local warmbox = require "warmbox"

local utc = sessions.utc

describe("sessions: policies (warmboxd)", function()
  local env = sessions.new()
  local srv, lockdir

  local function new_wb(o) return env:warmbox(o) end
  local function stats() return env:stats() end
  local function reset_stats() env:reset_stats() end

  lazy_setup(function()
    srv = env:start()
    lockdir = env.lockdir
  end)
  lazy_teardown(function() env:stop() end)

  it("tries candidates in the order the policy gives (here: oldest first)", function()
    local wb = new_wb{ policy = { order = function(c)
      table.sort(c, function(a, b) return a.started_at < b.started_at end)
      return c
    end } }
    local s = wb:session("pol:order")
    local ids = {}
    for i = 1, 2 do
      local res = http.api(srv, "POST", "/sandboxes", { templateID = "code-interpreter-v1", timeout = 60, secure = true,
        metadata = { warmboxSessionId = s.tag_value } })
      ids[i] = res.json.sandboxID
      wbd.sleep(0.02)
    end
    local r = assert(s:run("echo", { language = "bash" }))
    assert.equal(ids[1], r.sandbox_id)
    assert.is_nil(wb.client:info(ids[2]))
    wb:close()
  end)

  it("creates with the policy's lease and parameters, keeping the tag", function()
    local wb = new_wb{ exec_timeout = 30, idle_timeout = 30, policy = {
      lease = function(ctx) return ctx.idle_timeout * 4 end,
      create_params = function(ctx)
        return { template = "base", timeout = ctx.lease, metadata = { team = "blue" },
          lifecycle = { on_timeout = "pause", auto_resume = true } }
      end } }
    local s = wb:session("pol:create")
    local before = os.time()
    local r = assert(s:run("echo", { language = "bash" }))
    local info = assert(wb.client:info(r.sandbox_id))
    assert.same({ team = "blue", warmboxSessionId = s.tag_value, warmboxCreate = info.metadata.warmboxCreate },
      info.metadata)
    assert.equal("base", info.template_id)
    local end_at = utc(info.end_at)
    assert.is_true(end_at >= before + 120 - 2 and end_at <= os.time() + 120 + 2)
    wb:close()
  end)

  it("skips lease refreshes when should_refresh says so", function()
    local wb = new_wb{ policy = { should_refresh = function() return false end } }
    local s = wb:session("pol:refresh")
    assert(s:run("echo", { language = "bash" }))
    reset_stats()
    for _ = 1, 3 do assert(s:run("echo")) end
    local st = stats()
    assert.is_nil(st.requests["POST /sandboxes/{id}/connect"])
    -- the first python cell on the kernel is preceded by the output hooks' cell
    assert.equal(4, st.requests["interp POST /execute"])
    wb:close()
  end)

  it("returns nil, msg, 'POLICY' from a hook that errors, and the host carries on", function()
    local wb = new_wb{ policy = { lease = function() error("lease service down") end } }
    local r, err, code = wb:session("pol:error"):run("1")
    assert.is_nil(r)
    assert.matches("hook 'lease' failed: .*lease service down", err)
    assert.equal("POLICY", code)
    wb:close()
  end)

  it("loads a policy file in a restricted environment", function()
    local path = os.tmpname() .. ".lua"
    local f = assert(io.open(path, "w"))
    f:write("return { name = 'short-lease', lease = function(ctx) return 77 end }\n")
    f:close()
    local wb = new_wb{ policy = path, exec_timeout = 10, idle_timeout = 10 }
    os.remove(path)
    assert.equal("short-lease", wb.policy.name)
    local before = os.time()
    local r = assert(wb:session("pol:file"):run("echo", { language = "bash", timeout = 10 }))
    local end_at = utc(assert(wb.client:info(r.sandbox_id)).end_at)
    assert.is_true(end_at >= before + 77 - 2 and end_at <= os.time() + 77 + 2)
    wb:close()
    local bad, err, code = warmbox.new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key,
      lock = { backend = "file", dir = lockdir },
      policy = "return { lease = function() return io.open('/etc/passwd') end }" }
    assert.truthy(bad) -- loads (io is nil only when the hook runs)
    local r2, err2, code2 = bad:session("pol:io"):run("1")
    assert.is_nil(r2)
    assert.matches("attempt to index a nil value", err2)
    assert.equal("POLICY", code2)
    bad:close()
    assert.is_nil(err)
    assert.is_nil(code)
  end)
end)
