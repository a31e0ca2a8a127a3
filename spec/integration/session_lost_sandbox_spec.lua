-- A conversation whose sandbox is gone (killed from outside, or lost with a
-- server restart that could not keep its paused copy, e.g. a full data
-- directory) starts over in a new one, and the run says so: `sandbox_lost`
-- (the old id) and the event "sandbox_lost", not only `reused = false`.
local sessions = require "spec.helpers.sessions"
local http = require "spec.helpers.http"

describe("sessions: the conversation's sandbox lost (warmboxd)", function()
  local env = sessions.new()
  local srv, wb

  lazy_setup(function()
    srv = env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60 }
  end)
  lazy_teardown(function() env:stop() end)

  it("the run that starts over says which sandbox was lost", function()
    local s, id = env:warm(wb, "lost:sandbox")
    local events = {}
    s.on_event = function(name, info) if name == "sandbox_lost" then events[#events + 1] = info end end
    assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. id).status)
    local r = assert(s:run("1"))
    assert.are_not.equal(id, r.sandbox_id)
    assert.is_false(r.reused)
    assert.equal(id, r.sandbox_lost)
    assert.same({ { sandbox_id = id, new_sandbox_id = r.sandbox_id } }, events)
    -- the next run is in the new one, nothing lost
    local r2 = assert(s:run("2"))
    assert.is_nil(r2.sandbox_lost)
  end)
end)
