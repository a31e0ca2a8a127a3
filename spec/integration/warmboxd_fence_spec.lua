-- warmboxd's fenced executes over real HTTP: an /execute carrying
-- X-Warmbox-Fence never starts while another context of the sandbox runs a
-- cell of another fenced run: it waits (up to its timeout), then 409, the cell
-- not started. Unfenced executes keep E2B's behaviour (contexts independent).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local q = wbd.sh_quote

describe("warmboxd: fenced executes", function()
  local srv, sb

  lazy_setup(function()
    srv = wbd.start{}
    sb = http.create_interp(srv)
  end)
  lazy_teardown(function() srv:stop() end)

  local function exec(body, fence, timeout)
    local headers = fence and { ["X-Warmbox-Fence"] = fence } or nil
    return http.sandbox(srv, sb, 49999, "POST", "/execute", { json = body, headers = headers, timeout = timeout or 60 })
  end

  -- A background fenced execute; → wait() giving its body.
  local function exec_bg(body, fence)
    local tmp = os.tmpname()
    os.execute(string.format("(curl -sS -N --max-time 60 -X POST -H %s -H %s -H %s -H %s -H %s --data-binary %s %s"
      .. " > %s 2>/dev/null; echo done > %s) &", q("E2b-Sandbox-Id: " .. sb.sandboxID), q("E2b-Sandbox-Port: 49999"),
      q("X-Access-Token: " .. (sb.envdAccessToken or "")), q("Content-Type: application/json"),
      q("X-Warmbox-Fence: " .. fence), q(http.cjson.encode(body)), q(srv.url .. "/execute"), q(tmp .. ".out"),
      q(tmp .. ".done")))
    return function()
      wbd.eventually(function()
        local f = io.open(tmp .. ".done")
        if f then f:close() end
        return f ~= nil
      end, 60)
      local s = wbd.read_all(tmp .. ".out")
      os.remove(tmp .. ".out")
      os.remove(tmp .. ".done")
      os.remove(tmp)
      return s
    end
  end

  local function home(name) return srv:sandbox_home(sb.sandboxID) .. "/" .. name end
  local function exists(name)
    local f = io.open(home(name))
    if f then f:close() end
    return f ~= nil
  end

  it("waits for another run's cell in another context, refuses past its timeout, never both at once", function()
    local wait_a = exec_bg({ code = "import os, time\nopen('/home/user/a.started', 'w').close()\n"
      .. "while not os.path.exists('/home/user/go'): time.sleep(0.02)\n"
      .. "open('/home/user/ledger', 'a').write('end a\\n')" }, "5")
    wbd.eventually(function() return exists("a.started") end, 30)
    -- a later run's bash cell: refused once its timeout passed, never started
    local res = exec({ code = "echo b > /home/user/b", language = "bash", timeout = 1 }, "6")
    assert.equal(409, res.status, res.body)
    assert.matches("run 5", res.body)
    assert.is_false(exists("b"))
    -- the same run's cell, and an unfenced one, are not held
    assert.equal(200, exec({ code = "echo same > /home/user/same", language = "bash" }, "5").status)
    assert.is_true(exists("same"))
    assert.equal(200, exec({ code = "echo free > /home/user/free", language = "bash" }).status)
    assert.is_true(exists("free"))
    -- a later run's cell with time to wait runs once the older cell is over
    local wait_c = exec_bg({ code = "echo start c >> /home/user/ledger", language = "bash", timeout = 30 }, "7")
    wbd.sleep(0.5)
    assert.is_nil(wbd.read_all(home("ledger")))
    local go = assert(io.open(home("go"), "w"))
    go:close()
    wait_a()
    assert.matches("end_of_execution", wait_c())
    assert.equal("end a\nstart c\n", wbd.read_all(home("ledger")))
    local st = http.request{ url = srv.url .. "/_warmboxd/stats" }.json.counters
    assert.is_true((st.exec_fence_waited or 0) >= 2)
    assert.equal(1, st.exec_fence_refused)
  end)

  it("refuses a malformed fence (400)", function()
    local res = exec({ code = "1" }, "12x")
    assert.equal(400, res.status)
    assert.matches("X%-Warmbox%-Fence", res.body)
  end)
end)
