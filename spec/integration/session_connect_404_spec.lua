-- A 404 on connect that an intermediary gave after forwarding it is no proof
-- that the conversation's sandbox is gone: the session asks `info` before it
-- gives up a kernel. During a resolve it keeps the sandbox (never a new one,
-- the old left running); on the lease extension alongside an execute, the
-- run is not interrupted.
local sessions = require "spec.helpers.sessions"
local after_proxy = require "spec.helpers.after_proxy"

describe("sessions: a 404 after forwarding on connect (warmboxd)", function()
  local env = sessions.new()
  local srv, proxy, wb

  lazy_setup(function()
    srv = env:start()
    proxy = after_proxy.start(srv.url)
    -- A refresh before every run (as the reference flow does): with the lease
    -- following the idle window, a warm run would otherwise send no connect.
    wb = env:warmbox{ api_url = proxy.url, exec_timeout = 60, idle_timeout = 60,
      policy = { should_refresh = function() return true end } }
  end)
  lazy_teardown(function()
    env:stop()
    if proxy then proxy:stop() end
  end)

  local function tagged(s)
    local items = assert(wb.client:list_all{ state = { "running", "paused" }, metadata = { [s.tag] = s.tag_value } })
    local ids = {}
    for _, it in ipairs(items) do ids[#ids + 1] = it.sandbox_id end
    return ids
  end

  it("during a resolve: the conversation keeps its sandbox and kernel", function()
    local s, id = env:warm(wb, "connect404:resolve")
    assert(s:forget())
    proxy:plan{ connect = { { mode = "after", status = 404 } } }
    local r = assert(s:run("x + 1"))
    assert.equal(id, r.sandbox_id)
    assert.is_true(r.reused)
    assert.equal("42", r.text)
    assert.same({ id }, tagged(s))
  end)

  it("on the lease extension alongside an execute: the run is not interrupted", function()
    local s, id = env:warm(wb, "connect404:alongside")
    local along = 0
    s.on_event = function(name, info) if name == "connect" and info.alongside then along = along + 1 end end
    -- the policy refreshes on every run: the extension goes alongside the cell
    local st = s:state()
    assert.is_number(st.lease_end)
    proxy:plan{ connect = { { mode = "after", status = 404 } } }
    local r, err, code = s:run("import time\ntime.sleep(1)\nx + 1")
    assert(r, tostring(err) .. " " .. tostring(code))
    assert.is_true(along >= 1, "no connect alongside the execute")
    assert.equal(id, r.sandbox_id)
    assert.equal("42", r.text)
  end)
end)
