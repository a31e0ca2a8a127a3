-- wb:release counts a kill whose answer was lost: an intermediary forwarded
-- the kill, then answered 503; the client's retry found the sandbox gone
-- (404). The sandbox was listed under the conversation's lock a moment
-- before: it was killed by this release, and is counted.
local sessions = require "spec.helpers.sessions"
local after_proxy = require "spec.helpers.after_proxy"
local http = require "spec.helpers.http"

describe("wb:release: a kill whose answer was lost (warmboxd)", function()
  local env = sessions.new()
  local srv, proxy, wb

  lazy_setup(function()
    srv = env:start()
    proxy = after_proxy.start(srv.url)
    wb = env:warmbox{ api_url = proxy.url, exec_timeout = 60, idle_timeout = 60 }
  end)
  lazy_teardown(function()
    env:stop()
    if proxy then proxy:stop() end
  end)

  it("counts it as killed", function()
    local id = assert(wb:session("release:lost"):run("1")).sandbox_id
    proxy:plan{ kill = { { mode = "after", status = 503 } } }
    local n, err = wb:release("release:lost")
    assert.equal(1, n, err)
    assert.equal(404, http.api(srv, "GET", "/sandboxes/" .. id).status)
  end)
end)
