-- The control plane with code running in the sandbox: pause/connect keeps
-- kernel memory unless v2 connect asks for memory:false; pausing or killing a
-- sandbox while an /execute stream runs in it adds to pause_during_run /
-- kill_during_run (warmbox's session specs use them to prove warmbox never
-- does that).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local q = wbd.sh_quote

local function eventually(fn, seconds) return wbd.eventually(fn, seconds or 30) end

local function read(path) return wbd.read_all(path) or "" end

describe("warmboxd control plane with code running", function()
  local srv
  lazy_setup(function() srv = wbd.start() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  local function counters()
    return http.request{ url = srv.url .. "/_warmboxd/stats" }.json.counters
  end

  -- Starts a long /execute in the background; returns once it has printed.
  local function start_run(sb)
    local out = os.tmpname()
    local body = '{"code":"print(\\"started\\", flush=True)\\nimport time\\ntime.sleep(30)"}'
    os.execute(string.format("curl -sS -N --max-time 60 -X POST -H %s -H %s -H %s -H %s --data-binary %s %s >%s 2>&1 &",
      q("E2b-Sandbox-Id: " .. sb.sandboxID), q("E2b-Sandbox-Port: 49999"),
      q("X-Access-Token: " .. (sb.envdAccessToken or "")), q("Content-Type: application/json"),
      q(body), q(srv.url .. "/execute"), q(out)))
    assert.is_truthy(eventually(function() return read(out):find("started", 1, true) end), read(out))
    return out
  end

  local function create() return http.create(srv, { templateID = "code-interpreter-v1", timeout = 600 }) end

  it("keeps kernel memory across pause/connect, and reboots on v2 connect with memory:false", function()
    local sb = create()
    local function value_of(code)
      local res = http.sandbox(srv, sb, 49999, "POST", "/execute", { json = { code = code } })
      assert.are.equal(200, res.status, res.body)
      for line in res.body:gmatch("[^\n]+") do
        local l = http.cjson.decode(line)
        if l and l.type == "result" then return l.text end
        if l and l.type == "error" then return l.name end
      end
    end
    local path = "/sandboxes/" .. sb.sandboxID
    assert.is_nil(value_of("x = 41"))
    assert.are.equal(204, http.api(srv, "POST", path .. "/pause", {}).status)
    assert.are.equal(201, http.api(srv, "POST", "/v2" .. path .. "/connect", { timeout = 60 }).status)
    assert.are.equal("42", value_of("x + 1"))
    assert.are.equal(204, http.api(srv, "POST", path .. "/pause", {}).status)
    assert.are.equal(201, http.api(srv, "POST", "/v2" .. path .. "/connect", { timeout = 60, memory = false }).status)
    assert.are.equal("NameError", value_of("x + 1"))
    assert.are.equal(204, http.api(srv, "DELETE", path).status)
  end)

  it("counts nothing for pause and kill between runs", function()
    local sb = create()
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute", { json = { code = "1 + 1" } })
    assert.are.equal(200, res.status, res.body)
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {}).status)
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
    local c = counters()
    assert.are.equal(0, c.pause_during_run)
    assert.are.equal(0, c.kill_during_run)
  end)

  it("counts a pause during a run", function()
    local sb = create()
    local out = start_run(sb)
    assert.are.equal(204, http.api(srv, "POST", "/sandboxes/" .. sb.sandboxID .. "/pause", {}).status)
    assert.are.equal(1, counters().pause_during_run)
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
    os.remove(out)
  end)

  it("counts a kill during a run", function()
    local sb = create()
    local out = start_run(sb)
    local before = counters().kill_during_run
    assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
    assert.are.equal(before + 1, counters().kill_during_run)
    os.remove(out)
  end)
end)
