-- Checkpoints of a conversation against a real warmboxd:
-- s:checkpoint, s:checkpoints, s:branch, s:rewind, wb:release, the policy
-- hook, a fork made by someone else, faults on the snapshot and on the
-- create from it. warmboxd's snapshots hold the files and the python
-- kernel's user namespace (serialised with dill; docs/checkpoints.md).
local wbd = require "spec.helpers.warmboxd"
local sessions = require "spec.helpers.sessions"
local http = require "spec.helpers.http"

describe("checkpoints (warmboxd)", function()
  local env = sessions.new()
  local srv, wb

  lazy_setup(function()
    srv = env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 300 }
  end)
  lazy_teardown(function() env:stop() end)

  local function text(s, code)
    local r, err, ecode = s:run(code)
    assert(r, tostring(err) .. " " .. tostring(ecode))
    if r.error then return "error:" .. r.error.name end
    return r.text or r.stdout
  end

  local function state_of(id) return http.api(srv, "GET", "/sandboxes/" .. id).status end

  -- A Lua program in another process against the same warmboxd and lock dir.
  local function other_process(body)
    local script = string.format([[
      package.path = %q
      package.cpath = %q
      local warmbox = require "warmbox"
      local wb = assert(warmbox.new{ api_url = %q, sandbox_url = %q, api_key = %q,
        lock = { backend = "file", dir = %q }, exec_timeout = 60, idle_timeout = 300 })
      %s
      wb:close()
    ]], package.path, package.cpath, srv.url, srv.url, srv.api_key, env.lockdir, body)
    return "lua5.4 -e " .. wbd.sh_quote(script)
  end

  local function turn1_turn2(s)
    assert.equal("1", text(s, "x = 1\nopen('f.txt', 'w').write('turn1')\nx"))
    local cp = assert(s:checkpoint{ label = "after-1" })
    assert.equal("2", text(s, "x = 2\nopen('f.txt', 'w').write('turn2')\nx"))
    return cp
  end

  it("checkpoints after turn 1; a branch starts from it, the original goes on with turn 2", function()
    local s = wb:session("cp:branch")
    local cp = turn1_turn2(s)
    assert.equal(1, cp.turn)
    assert.equal("after-1", cp.label)
    assert.is_string(cp.id)
    assert.equal(s:state().sandbox_id, cp.sandbox_id)
    local list = assert(s:checkpoints())
    assert.equal(1, #list)
    assert.equal(cp.id, list[1].id)
    assert.equal(1, list[1].turn)
    assert.equal("after-1", list[1].label)

    local b = assert(s:branch(cp, "cp:branch/b"))
    assert.equal("turn1", text(b, "open('f.txt').read()"))
    -- the kernel's namespace is carried too: the branch has turn 1's x
    assert.equal("1", text(b, "x"))
    assert.are_not.equal(b:state().sandbox_id, s:state().sandbox_id)
    -- the original conversation is untouched
    assert.equal("2", text(s, "x"))
    assert.equal("turn2", text(s, "open('f.txt').read()"))
    -- a branch into a session that has a sandbox is refused
    local n, err, code = s:branch(cp, "cp:branch/b")
    assert.is_nil(n)
    assert.equal("CONFLICT", code)
    assert.matches("has a sandbox already", err)
  end)

  it("rewinds the conversation itself: a new sandbox from the checkpoint, the old one killed after", function()
    local s = wb:session("cp:rewind")
    local cp = turn1_turn2(s)
    local old = s:state().sandbox_id
    local ok, r = s:rewind(cp)
    assert.is_true(ok)
    assert.equal(old, r.killed)
    assert.are_not.equal(old, r.sandbox_id)
    assert.equal(r.sandbox_id, s:state().sandbox_id)
    assert.equal(404, state_of(old))
    -- the files and the kernel's x as turn 1 left them
    assert.equal("('turn1', 1)", text(s, "open('f.txt').read(), x"))
    -- the turns go on from the checkpoint's
    local c2 = assert(s:checkpoint())
    assert.equal(2, c2.turn)
    local list = assert(s:checkpoints())
    assert.equal(2, #list)
    assert.equal(cp.id, list[1].id) -- oldest first
    assert.equal(c2.id, list[2].id)
  end)

  it("a checkpoint requested during a run (another process) waits for the run", function()
    local s = wb:session("cp:wait")
    assert(s:run("x = 0"))
    local p
    local r = assert(s:run("import time\nprint('started', flush=True)\ntime.sleep(1)\n"
      .. "open('g.txt', 'w').write('end of run')", {
      on_stdout = function(t)
        if not p and t:find("started", 1, true) then
          p = io.popen(other_process([[
            local cp = assert(wb:session("cp:wait"):checkpoint{ label = "from-b" })
            io.write(cp.id, " ", cp.turn)
          ]]))
        end
      end }))
    assert.is_nil(r.error)
    local out = p:read("a")
    assert(p:close())
    local id, turn = out:match("^(%S+) (%d+)$")
    assert(id, out)
    assert.equal("2", turn)
    local b = assert(s:branch({ id = id, turn = 2 }, "cp:wait/b"))
    assert.equal("end of run", text(b, "open('g.txt').read()"))
  end)

  it("two processes see the same list; wb:release deletes the conversation's checkpoints", function()
    local s = wb:session("cp:list")
    assert(s:run("x = 1"))
    local a = assert(s:checkpoint())
    assert(s:run("x = 2"))
    local c = assert(s:checkpoint{ label = "two" })
    local p = io.popen(other_process([[
      for _, cp in ipairs(assert(wb:session("cp:list"):checkpoints())) do io.write(cp.id, " ", cp.turn, "\n") end
    ]]))
    local out = p:read("a")
    assert(p:close())
    assert.equal(a.id .. " 1\n" .. c.id .. " 2\n", out)
    -- another conversation's checkpoints are not in the list
    local other = wb:session("cp:list-other")
    assert(other:run("1"))
    assert(other:checkpoint())
    assert.equal(2, #assert(s:checkpoints()))

    assert(wb:release("cp:list"))
    assert.same({}, assert(s:checkpoints()))
    assert.equal(1, #assert(other:checkpoints()))
    local listed = http.api(srv, "GET", "/snapshots").json
    for _, snap in ipairs(listed) do
      assert.are_not.equal(a.id, snap.snapshotID)
      assert.are_not.equal(c.id, snap.snapshotID)
    end
  end)

  it("a sandbox forked by someone else with the conversation's tag never makes the session kill its own", function()
    local s = wb:session("cp:fork")
    assert.equal("1", text(s, "x = 1\nx"))
    local own = s:state().sandbox_id
    local res = http.api(srv, "POST", "/sandboxes/" .. own .. "/fork", { count = 1 })
    assert.equal(201, res.status, res.body)
    local fork = res.json[1].sandbox.sandboxID
    assert.equal(200, state_of(fork))
    -- the session goes on with the sandbox it remembers, its kernel intact
    assert.equal("2", text(s, "x += 1\nx"))
    assert.equal(own, s:state().sandbox_id)
    assert.equal(200, state_of(own))
    -- a rewind replaces only the sandbox the session remembers
    local cp = assert(s:checkpoint())
    local ok, r = s:rewind(cp)
    assert.is_true(ok)
    assert.equal(own, r.killed)
    assert.equal(200, state_of(fork))
  end)

  describe("faults leave the conversation as it was, with a clear error", function()
    after_each(function() srv:clear_faults() end)

    for _, f in ipairs({ { status = 500 }, { drop = true } }) do
      local what = f.drop and "a dropped connection" or "a 500"
      it(what .. " on the snapshot", function()
        local s = wb:session("cp:fault-snap-" .. (f.drop and "drop" or "500"))
        assert.equal("1", text(s, "x = 1\nx"))
        local id = s:state().sandbox_id
        srv:fault{ route = "POST /sandboxes/{id}/snapshots", count = 1, status = f.status, drop = f.drop }
        local cp, err, code = s:checkpoint()
        assert.is_nil(cp)
        assert.matches("^checkpoint of session 'cp:fault%-snap%-%w+': snapshot sandbox '", err)
        assert.equal(f.drop and "TRANSPORT" or "HTTP", code)
        assert.equal(id, s:state().sandbox_id)
        assert.equal("2", text(s, "x += 1\nx")) -- no state lost, no cell re-run
      end)

      it(what .. " on the create from the checkpoint (rewind and branch)", function()
        local s = wb:session("cp:fault-create-" .. (f.drop and "drop" or "500"))
        local cp = turn1_turn2(s)
        local id = s:state().sandbox_id
        srv:fault{ route = "POST /sandboxes", count = 1, status = f.status, drop = f.drop }
        local ok, err, code = s:rewind(cp)
        assert.is_nil(ok)
        assert.matches("^rewind of session 'cp:fault%-create%-%w+' from checkpoint '", err)
        assert.is_string(code)
        assert.equal(id, s:state().sandbox_id)
        assert.equal(200, state_of(id))
        assert.equal("2", text(s, "x"))
        assert.equal("turn2", text(s, "open('f.txt').read()"))
        srv:fault{ route = "POST /sandboxes", count = 1, status = f.status, drop = f.drop }
        local b, berr = s:branch(cp, "cp:fault-create/b-" .. (f.drop and "drop" or "500"))
        assert.is_nil(b)
        assert.matches("^branch to session ", berr)
        assert.equal("3", text(s, "x += 1\nx"))
      end)
    end
  end)
end)
