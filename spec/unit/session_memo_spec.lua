-- warmbox.session.memo: the named operations on a session's remembered state
-- (the one module that writes it; structure_spec checks nobody else does).
local memo = require "warmbox.session.memo"
local state_codec = require "warmbox.state"

-- A lock object holding one state string.
local function fake_lock(s)
  local lk = { s = s }
  function lk.get_state(self) return self.s end
  function lk.set_state(self, v) self.s = v return true end
  return lk
end

local S = { tag_value = "tv", origin = "o", max_run_length = 3600 }

describe("warmbox.session.memo", function()
  it("loads its own state, forgets a foreign one (creates, turns and replaced kept), saves and clears", function()
    local own = fake_lock(state_codec.encode{ tag = "tv", origin = "o", sandbox_id = "a", turns = 2, lease_end = 9 })
    local st = memo.load(own, S)
    assert.equal("a", st.sandbox_id)
    assert.equal(2, math.tointeger(st.turns))
    local foreign = fake_lock(state_codec.encode{ tag = "other", origin = "o", sandbox_id = "b", turns = 3,
      creating = { { id = "c1", at = 1 } }, replaced = { "r" } })
    st = memo.load(foreign, S)
    assert.is_nil(st.sandbox_id)
    assert.equal(3, math.tointeger(st.turns))
    assert.same({ "r" }, st.replaced)
    assert.same({}, memo.load_own(foreign, S))
    memo.remember(S, st, { sandbox_id = "n", envd_access_token = "tok" }, 100, 10)
    assert(memo.save(foreign, st))
    local back = memo.read(foreign)
    assert.equal("n", back.sandbox_id)
    assert.equal("tok", back.access_token)
    assert.equal("tv", back.tag)
    memo.clear(foreign)
    assert.is_nil(foreign.s)
  end)

  it("caps a remembered lease at the run's start + max_run_length and never shortens it on an extension", function()
    local st = {}
    memo.remember(S, st, { sandbox_id = "a" }, 5000, 100)
    assert.equal(3700, st.lease_end)
    memo.extend_lease(S, st, 1000)
    assert.equal(3700, st.lease_end)
    memo.remember(S, st, { sandbox_id = "b" }, 50) -- another sandbox: its run start unknown
    assert.is_nil(st.run_started)
    assert.equal(50, st.lease_end)
    memo.lease_over(st, 40)
    assert.equal(40, st.lease_end)
    memo.lease_over(st, 45)
    assert.equal(40, st.lease_end)
    memo.lease_unknown(st)
    assert.is_nil(st.lease_end)
    memo.resumed_at(S, st, 200)
    assert.equal(200, st.run_started)
  end)

  it("counts turns from the JSON float, and keeps a create's record until it is settled", function()
    local st = { turns = 2.0, memory_lost = "a" }
    assert.equal(3, memo.ran(st, 77))
    assert.equal(77, st.last_run)
    assert.is_nil(st.memory_lost)
    memo.record_create(S, st, "c1", 10)
    memo.record_create(S, st, "c2", 11)
    assert.same({ "c1", "c2" }, { st.creating[1].id, st.creating[2].id })
    memo.answered_create(st, "c2", "sb")
    assert.equal("sb", st.creating[2].kept)
    memo.settle_create(st, "c1")
    memo.settle_create(st, "c2")
    assert.is_nil(st.creating)
    memo.replaced(st, "old")
    assert.same({ "old" }, st.replaced)
    memo.keep_replaced(st, {})
    assert.is_nil(st.replaced)
  end)
end)
