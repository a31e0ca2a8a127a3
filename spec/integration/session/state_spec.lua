-- Behaviour 9 against a real warmboxd: kernel state across runs and across an
-- idle pause and resume; a changed env secret or actor gets another sandbox.
local wbd = require "spec.helpers.warmboxd"
local sessions = require "spec.helpers.sessions"
local http = require "spec.helpers.http"

describe("sessions: state (warmboxd)", function()
  local env = sessions.new()
  local srv, wb
  local offset = 0 -- the session clock runs ahead of the wall clock by this much

  lazy_setup(function()
    srv = env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60, clock = function() return os.time() + offset end }
  end)
  lazy_teardown(function() env:stop() end)

  it("keeps a variable from one run to the next", function()
    local s = wb:session("state:1")
    assert(s:run("x = 41"))
    local r = assert(s:run("x + 1"))
    assert.equal("42", r.results[1].text)
    assert.is_true(r.reused)
    assert.is_false(r.resumed)
  end)

  it("keeps it after the sandbox idled into pause and was resumed (r.resumed)", function()
    local s = wb:session("state:pause")
    local r1 = assert(s:run("import os\nx = 41\nopen('/home/user/keep.txt', 'w').write('kept')"))
    -- Let the lease run out for real: warmboxd pauses it (onTimeout = pause).
    assert.equal(204, http.api(srv, "POST", "/sandboxes/" .. r1.sandbox_id .. "/timeout", { timeout = 1 }).status)
    local state
    for _ = 1, 200 do
      state = assert(wb.client:info(r1.sandbox_id)).state
      if state == "paused" then break end
      wbd.sleep(0.05)
    end
    assert.equal("paused", state)
    offset = offset + 120 -- the remembered lease has run out for the session too
    local r2 = assert(s:run("x + 1"))
    assert.equal(r1.sandbox_id, r2.sandbox_id)
    assert.is_true(r2.resumed)
    assert.is_true(r2.reused)
    assert.equal("42", r2.results[1].text)
    local r3 = assert(s:run("print(open('/home/user/keep.txt').read())"))
    assert.equal("kept\n", r3.stdout)
    assert.is_false(r3.resumed)
  end)

  it("gets a different sandbox, never the old kernel, when an env secret or the actor changes", function()
    local a = wb:session("state:shared", { env = { TOKEN = "alice-token" }, actor = "alice:direct" })
    local ra = assert(a:run("import os\nsecret_seen = os.environ.get('TOKEN')\nsecret_seen"))
    assert.equal("alice-token", ra.results[1].text)
    local b = wb:session("state:shared", { env = { TOKEN = "bob-token" }, actor = "alice:direct" })
    local rb = assert(b:run("import os\nprint('secret_seen' in globals(), os.environ.get('TOKEN'))"))
    assert.are_not.equal(ra.sandbox_id, rb.sandbox_id)
    assert.equal("False bob-token\n", rb.stdout)
    local c = wb:session("state:shared", { env = { TOKEN = "alice-token" }, actor = "bob:direct" })
    local rc = assert(c:run("print('secret_seen' in globals())"))
    assert.are_not.equal(ra.sandbox_id, rc.sandbox_id)
    assert.are_not.equal(rb.sandbox_id, rc.sandbox_id)
    assert.equal("False\n", rc.stdout)
    -- the same settings find the first sandbox and its kernel again
    local ra2 = assert(wb:session("state:shared", { env = { TOKEN = "alice-token" }, actor = "alice:direct" })
      :run("secret_seen"))
    assert.equal(ra.sandbox_id, ra2.sandbox_id)
    assert.equal("alice-token", ra2.results[1].text)
    -- secrets never appear in metadata
    for _, it in ipairs(assert(wb.client:list_all{})) do
      for _, v in pairs(it.metadata) do
        assert.is_nil(v:find("token", 1, true))
        assert.is_nil(v:find("alice", 1, true))
      end
    end
  end)
end)
