-- A rewind whose kill of the old sandbox failed says so (no `killed`, a
-- `kill_error`), and the old sandbox, still tagged with the conversation, is
-- collected by the conversation's next run. A branch's sandbox does not carry
-- its source's fencing number: its first runs are never refused.
local sessions = require "spec.helpers.sessions"
local http = require "spec.helpers.http"

describe("checkpoints: a rewind whose kill of the old sandbox failed (warmboxd)", function()
  local env = sessions.new()
  local srv, wb

  lazy_setup(function()
    srv = env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 300 }
  end)
  lazy_teardown(function() env:stop() end)

  local function state_of(id) return http.api(srv, "GET", "/sandboxes/" .. id).status end

  it("never says it killed the old sandbox; the next run kills it", function()
    local s = wb:session("cp:rewind-kill")
    assert(s:run("x = 1"))
    local cp = assert(s:checkpoint())
    assert(s:run("x = 2"))
    local old = s:state().sandbox_id
    srv:fault{ route = "DELETE /sandboxes/{id}", count = 20, status = 500 }
    local ok, r = s:rewind(cp)
    srv:clear_faults()
    assert.is_true(ok)
    assert.is_nil(r.killed, "the rewind said it killed the old sandbox")
    assert.equal("HTTP", r.kill_error[2])
    assert.equal(200, state_of(old))
    local r2 = assert(s:run("x"))
    assert.equal(r.sandbox_id, r2.sandbox_id)
    assert.equal("1", r2.text)
    assert.equal(404, state_of(old))
  end)

  it("a branch whose source's fencing number is above the branch's lock's: its runs are not refused", function()
    -- the source's sandbox has a number the branch's new lock is below (as a
    -- source first locked within the same second as the branch is made)
    local s = wb:session("cp:branch-fence")
    assert(s:run("import os\nopen(os.path.expanduser('~/.warmbox/fence'), 'w').write(str(10**15))\nx = 7"))
    local cp = assert(s:checkpoint())
    local b = assert(s:branch(cp, "cp:branch-fence/b"))
    local r, err, code = b:run("x + 1")
    assert(r, tostring(err) .. " " .. tostring(code))
    assert.equal("8", r.text)
    assert(b:run("x", { language = "python" }))
    assert(b:run("echo ok", { language = "bash" }))
  end)
end)
