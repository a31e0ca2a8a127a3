-- Checkpoints and policy against a real warmboxd: the automatic
-- checkpoint hook (off the run's path, in and outside tasks), GC's checkpoint
-- pass by the policy's rules (cap per conversation, orphans, dry run), and a
-- checkpoint a rewind in flight creates from is never deleted.
local sessions = require "spec.helpers.sessions"
local http = require "spec.helpers.http"
local rules = require "warmbox.policy.rules"

describe("checkpoints: policy and GC (warmboxd)", function()
  local env = sessions.new()
  local srv

  lazy_setup(function() srv = env:start() end)
  lazy_teardown(function() env:stop() end)

  local function ids(list)
    local out = {}
    for i, cp in ipairs(list) do out[i] = cp.id end
    return out
  end

  it("the checkpoint hook: after each successful run, off its path, with the label it returns", function()
    local asked = {}
    local wb = env:warmbox{ exec_timeout = 60, policy = { checkpoint = function(info)
      asked[#asked + 1] = info.turn
      if info.turn % 2 == 1 then return "odd-" .. info.turn end
      return false
    end } }
    local s = wb:session("hook:1")
    local r = assert(s:run("x = 1"))
    assert.equal(1, r.turn)
    local cp = assert(s:await_checkpoint())
    assert.equal(1, cp.turn)
    assert.equal("odd-1", cp.label)
    assert(s:run("x = 2"))
    assert.is_nil(s:await_checkpoint()) -- turn 2: the hook said no
    local r3 = assert(s:run("1/0"))
    assert.is_table(r3.error) -- a cell that raised is still a successful run
    -- inside tasks: the run's result comes back first, the checkpoint follows in the background
    local t = wb:spawn(function() return assert(s:run("x = 4")).turn end)
    assert(wb:loop())
    assert.equal(4, t:result())
    local list = assert(s:checkpoints())
    assert.same({ 1, 3 }, { list[1].turn, list[2].turn })
    assert.same({ "odd-1", "odd-3" }, { list[1].label, list[2].label })
    assert.same({ 1, 2, 3, 4 }, asked)
  end)

  it("prunes by the policy (cap per conversation, orphans), lists first with a dry run", function()
    local wb = env:warmbox{ exec_timeout = 60 }
    local a = wb:session("gc:a")
    local made = {}
    for i = 1, 3 do
      assert(a:run("x = " .. i))
      made[i] = assert(a:checkpoint()).id
    end
    local o = wb:session("gc:orphan")
    assert(o:run("1"))
    local ocp = assert(o:checkpoint())
    assert.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. o:state().sandbox_id).status)
    local policy = { checkpoint_gc = rules.checkpoints{ max_checkpoints = 2, orphans = "delete" } }

    local seen = {}
    local rep = assert(wb:gc{ dry_run = true, policy = policy, on_checkpoint = function(x)
      if x.action ~= "keep" then seen[#seen + 1] = x.checkpoint_id .. " " .. x.action end
    end })
    assert.equal(2, rep.checkpoints.deleted)
    assert.is_true(rep.checkpoints.dry_run)
    table.sort(seen)
    local want = { made[1] .. " delete", ocp.id .. " delete" }
    table.sort(want)
    assert.same(want, seen)
    assert.equal(3, #assert(a:checkpoints()))

    rep = assert(wb:gc{ policy = policy })
    assert.equal(2, rep.checkpoints.deleted)
    assert.same({ made[2], made[3] }, ids(assert(a:checkpoints())))
    assert.same({}, assert(o:checkpoints()))
    -- idempotent: nothing more to do
    assert.equal(0, assert(wb:gc{ policy = policy }).checkpoints.deleted)
    -- scheduled GC runs the checkpoint pass too
    assert(a:run("x = 4"))
    assert(a:checkpoint())
    local every = assert(wb:gc_every(3600, { policy = policy }))
    assert.equal(1, every.checkpoints.deleted)
    assert.same({ made[3] }, { ids(assert(a:checkpoints()))[1] })
  end)

  it("never deletes a checkpoint that a rewind in flight creates from", function()
    local gc_wb = env:warmbox{ exec_timeout = 60 }
    local during, actions = nil, {}
    local wb = env:warmbox{ exec_timeout = 60, policy = { create_params = function()
      -- called by the rewind's create, while it holds the session and uses the checkpoint
      if during == false then
        during = assert(gc_wb:gc{ policy = { checkpoint_gc = rules.max_checkpoints(1) },
          on_checkpoint = function(x) actions[x.checkpoint_id] = x.action end })
      end
      return {}
    end } }
    local s = wb:session("gc:inflight")
    assert(s:run("open('f.txt', 'w').write('one')"))
    local old = assert(s:checkpoint())
    assert(s:run("open('f.txt', 'w').write('two')"))
    assert(s:checkpoint())
    during = false
    assert(s:rewind(old))
    assert.equal(1, during.checkpoints.busy)
    assert.equal("busy", actions[old.id])
    assert.equal("one", assert(s:run("open('f.txt').read()")).text)
    assert.equal(2, #assert(s:checkpoints()))
  end)
end)
