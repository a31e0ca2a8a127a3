-- A checkpoint's snapshot request sent twice (an intermediary forwarded it
-- twice): the later snapshot takes the name from the earlier, which no
-- listing by name finds again. The checkpoint deletes it; release and the
-- conversation leave no snapshot behind.
local sessions = require "spec.helpers.sessions"
local after_proxy = require "spec.helpers.after_proxy"

describe("checkpoints: a snapshot request sent twice (warmboxd)", function()
  local env = sessions.new()
  local srv, proxy, wb

  lazy_setup(function()
    srv = env:start()
    proxy = after_proxy.start(srv.url)
    wb = env:warmbox{ api_url = proxy.url, exec_timeout = 60, idle_timeout = 300 }
  end)
  lazy_teardown(function()
    env:stop()
    if proxy then proxy:stop() end
  end)

  local function snapshots_of(id)
    return assert(wb.client:list_snapshots{ sandbox_id = id })
  end

  it("leaves no unnamed snapshot; release deletes every snapshot of the conversation", function()
    local s = wb:session("cp:twice")
    local id = assert(s:run("x = 1")).sandbox_id
    proxy:plan{ snapshot = { { mode = "twice" } } }
    local cp = assert(s:checkpoint())
    local snaps = snapshots_of(id)
    assert.equal(1, #snaps, "an unnamed snapshot was left")
    assert.equal(cp.name, (snaps[1].names[1] or ""):gsub("^.*/", ""):gsub(":[^:]*$", ""))
    assert.equal(1, wb:release("cp:twice"))
    assert.same({}, snapshots_of(id))
  end)
end)
