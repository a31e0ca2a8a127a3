-- warmbox.session.checkpoint against the fake E2B client (spec.helpers.fake_e2b) and
-- a memory lock: names and their parse, the order of a rewind (the new
-- sandbox first, the old one killed after), what a failure leaves, a
-- paused sandbox, a fork with the conversation's tag.
local session = require "warmbox.session"
local checkpoint = require "warmbox.session.checkpoint"
local fake_e2b = require "spec.helpers.fake_e2b"
local fakes = require "spec.helpers.fakes"

local function setup()
  local t = { now = 1000000 }
  local clock = function() return t.now end
  local client = fake_e2b.new{ clock = clock }
  local held, state = {}, {}
  local function lock()
    local lk = {}
    function lk:lock(key)
      if held[key] then return nil, "timeout" end
      held[key], self.key = true, key
      return 0
    end
    function lk:try_lock(key)
      if held[key] then return nil, "busy" end
      return self:lock(key)
    end
    function lk:unlock() held[self.key] = nil return true end
    function lk:get_state() return state[self.key] end
    function lk:set_state(s) state[self.key] = s return true end
    return lk
  end
  local events = {}
  local function mk(key)
    return session.new(key, { client = client, lock = lock, clock = clock, hmac = fakes.hmac, sha256 = fakes.hash,
      exec_timeout = 60, idle_timeout = 300, template = "code-interpreter-v1",
      on_event = function(n, i) events[#events + 1] = { n, i } end })
  end
  return { t = t, client = client, new = mk, events = events, state = state }
end

describe("warmbox.session.checkpoint", function()
  it("names carry the conversation, the key, the turn, the time and the label; others are not parsed", function()
    local e = setup()
    local s = e.new("conv:1")
    assert(s:run("x = 1"))
    local cp = assert(s:checkpoint{ label = "v-1" })
    assert.equal(1, cp.turn)
    assert.equal("v-1", cp.label)
    assert.equal(e.t.now, cp.created_at)
    assert.matches("^wbcp%-%x+%-%x+%-1%-1000000000%-%x+_v%-1$", cp.name)
    local p = checkpoint.parse{ snapshot_id = cp.id, names = { "team/" .. cp.name .. ":default" } }
    assert.same({ cp.id, 1, "v-1", e.t.now }, { p.id, p.turn, p.label, p.created_at })
    assert.is_nil(checkpoint.parse{ snapshot_id = "x", names = { "my-snapshot:default" } })
    assert.is_nil(checkpoint.parse{ snapshot_id = "wbcp-zz-1-1-1-1" })
    assert.has_error(function() s:checkpoint{ label = "Bad Label" } end)
    assert.has_error(function() s:checkpoint{ tag = "x" } end)
    local n, err, code = e.new("conv:empty"):checkpoint()
    assert.is_nil(n)
    assert.equal("NOT_FOUND", code)
    assert.equal("checkpoint of session 'conv:empty': it has no sandbox (run first)", err)
  end)

  it("a paused sandbox (E2B snapshots running ones only) is connected, then snapshotted", function()
    local e = setup()
    local s = e.new("conv:paused")
    local r = assert(s:run("x = 1"))
    e.client.sb[r.sandbox_id].state = "paused"
    assert(s:checkpoint())
    local log = e.client:calls_of("snapshot")
    assert.equal(2, #log)
    assert.same({ r.sandbox_id }, e.client:ids("connect"))
  end)

  it("rewind: the sandbox from the checkpoint is created with the tag first, the old one killed after", function()
    local e = setup()
    local s = e.new("conv:rw")
    local r = assert(s:run("x = 1"))
    local cp = assert(s:checkpoint())
    assert(s:run("x = 2"))
    local ok, info = s:rewind(cp)
    assert.is_true(ok)
    local log = {}
    for _, l in ipairs(e.client.log) do
      if l:match("^create") or l:match("^kill") then log[#log + 1] = l end
    end
    assert.same({ "create code-interpreter-v1", "create " .. cp.id, "kill " .. r.sandbox_id }, log)
    local new = e.client.sb[info.sandbox_id]
    assert.equal(s.tag_value, new.metadata.warmboxSessionId)
    assert.equal(info.sandbox_id, s:state().sandbox_id)
    assert.equal(2, assert(s:run("x")).turn) -- the turns go on from the checkpoint's
  end)

  it("a failed create leaves the conversation as it was; a fork with the tag is never killed by it", function()
    local e = setup()
    local s = e.new("conv:fail")
    local r = assert(s:run("x = 1"))
    local cp = assert(s:checkpoint())
    e.client:add("fork1", s.tag_value, "running") -- someone else's fork: same tag
    e.client.fail.create = "HTTP"
    local ok, err, code = s:rewind(cp)
    assert.is_nil(ok)
    assert.equal("HTTP", code)
    assert.matches("^rewind of session 'conv:fail' from checkpoint '", err)
    assert.equal(r.sandbox_id, s:state().sandbox_id)
    assert.equal(0, e.client:count("kill"))
    e.client.fail.create = nil
    assert.equal(r.sandbox_id, assert(s:run("x")).sandbox_id) -- the remembered sandbox wins
    assert.is_true(s:rewind(cp))
    assert.same({ r.sandbox_id }, e.client:ids("kill"))
    assert.is_nil(e.client.sb.fork1.killed)
  end)

  it("branch: a new session from the checkpoint with its own tag; the source untouched", function()
    local e = setup()
    local s = e.new("conv:src")
    local r = assert(s:run("x = 1"))
    local cp = assert(s:checkpoint())
    local b = assert(s:branch(cp, "conv:dst"))
    local id = b:state().sandbox_id
    assert.equal(b.tag_value, e.client.sb[id].metadata.warmboxSessionId)
    assert.are_not.equal(s.tag_value, b.tag_value)
    assert.equal(r.sandbox_id, s:state().sandbox_id)
    assert.equal(0, e.client:count("kill"))
    assert.equal("BAD_REQUEST", select(3, s:branch(cp, "conv:src")))
    assert.same({}, assert(b:checkpoints()))
    assert.equal(1, #assert(s:checkpoints()))
  end)
end)
