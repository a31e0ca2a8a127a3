-- warmbox.policy.rules: each GC rule, their composition, and their use from a
-- policy file (the `rules` global of the restricted environment).
local rules = require "warmbox.policy.rules"
local policy = require "warmbox.policy"

local NOW = 1800000000
local DAY = 86400

local function item(o)
  local it = { sandbox_id = "sb", state = "paused", key = "acme:c1", tenant = "acme", orphan = false,
    last_activity = NOW - (o.idle or 0), demoted = o.demoted or false }
  for k, v in pairs(o) do it[k] = v end
  return it
end
local function ctx(o)
  o = o or {}
  return { now = NOW, max_age = o.max_age or 7 * DAY, counts = o.counts or { kept = 0, kill = 0, demote = 0 },
    totals = o.totals or { seen = 0, kept = 0, kill = 0, demote = 0 } }
end

describe("warmbox.policy.rules", function()
  it("duration: numbers and s/m/h/d strings; bad ones are an error", function()
    assert.equal(90, rules.duration("90"))
    assert.equal(30, rules.duration("30s"))
    assert.equal(900, rules.duration("15m"))
    assert.equal(43200, rules.duration("12h"))
    assert.equal(7 * DAY, rules.duration("7d"))
    assert.equal(1.5 * DAY, rules.duration("1.5d"))
    assert.equal(12, rules.duration(12))
    local v, err = rules.duration("7w")
    assert.is_nil(v)
    assert.matches("invalid duration '7w'", err)
    assert.is_nil(rules.duration(-1))
  end)

  it("retention: demote after X, kill after Y, by last activity", function()
    local r = rules.retention{ demote_after = "2d", kill_after = "14d" }
    assert.is_nil(r(item{ idle = DAY }, ctx()))
    local a, why = r(item{ idle = 3 * DAY }, ctx())
    assert.equal("demote", a)
    assert.matches("demote after 2d", why)
    assert.equal("demote", r(item{ idle = 3 * DAY, state = "running" }, ctx()))
    a, why = r(item{ idle = 15 * DAY }, ctx())
    assert.equal("kill", a)
    assert.matches("inactive for 15d", why)
    -- without an activity time: no opinion
    assert.is_nil(r(item{ last_activity = false }, ctx()))
  end)

  it("retention: a demoted sandbox is not demoted again, and is killed kill_after - demote_after later", function()
    local r = rules.retention{ demote_after = "2d", kill_after = "14d" }
    assert.is_nil(r(item{ idle = 3 * DAY, demoted = true }, ctx()))
    assert.is_nil(r(item{ idle = 11 * DAY, demoted = true }, ctx()))
    assert.equal("kill", r(item{ idle = 12 * DAY + 1, demoted = true }, ctx()))
  end)

  it("retention: kill_after defaults to the pass's max_age (--retention)", function()
    local r = rules.retention()
    assert.is_nil(r(item{ idle = 6 * DAY }, ctx()))
    assert.equal("kill", r(item{ idle = 8 * DAY }, ctx()))
    assert.equal("kill", r(item{ idle = 2 * DAY }, ctx{ max_age = DAY }))
    assert.has_error(function() rules.retention{ demote_after = "3d", kill_after = "2d" } end,
      "bad option 'demote_after' to 'retention' (must be shorter than kill_after)")
    assert.has_error(function() rules.retention{ kill_after = "soon" } end)
  end)

  it("orphans: keep by default, kill on request, no opinion on warmbox tags", function()
    assert.equal("keep", rules.orphans()(item{ orphan = true }, ctx()))
    assert.equal("kill", rules.orphans("kill")(item{ orphan = true }, ctx()))
    assert.is_nil(rules.orphans("kill")(item{}, ctx()))
    assert.has_error(function() rules.orphans("demote") end)
  end)

  it("tenant_cap and global_cap kill what is over the cap, from the counts so far", function()
    local t = rules.tenant_cap(2)
    assert.is_nil(t(item{}, ctx{ counts = { kept = 1, kill = 0, demote = 0 } }))
    local a, why = t(item{}, ctx{ counts = { kept = 2, kill = 5, demote = 0 } })
    assert.equal("kill", a)
    assert.matches("tenant 'acme' over its cap of 2", why)
    assert.is_nil(t(item{ tenant = false, orphan = true }, ctx{ counts = { kept = 9, kill = 0, demote = 0 } }))
    local g = rules.global_cap(10)
    assert.is_nil(g(item{}, ctx{ totals = { seen = 50, kept = 9, kill = 40, demote = 0 } }))
    assert.equal("kill", g(item{}, ctx{ totals = { seen = 50, kept = 10, kill = 0, demote = 0 } }))
  end)

  it("chain: the first opinion wins, else keep; budget turns kills past n into keeps", function()
    local seen = {}
    local function spy(name, answer)
      return function() seen[#seen + 1] = name return answer end
    end
    local r = rules.chain(spy("a", nil), spy("b", "kill"), spy("c", "demote"))
    assert.equal("kill", r(item{}, ctx()))
    assert.same({ "a", "b" }, seen)
    assert.equal("keep", rules.chain(spy("x", nil))(item{}, ctx()))
    local b = rules.budget(3, function() return "kill", "old" end)
    assert.equal("kill", b(item{}, ctx{ totals = { seen = 0, kept = 0, kill = 2, demote = 0 } }))
    local a, why = b(item{}, ctx{ totals = { seen = 0, kept = 0, kill = 3, demote = 0 } })
    assert.equal("keep", a)
    assert.matches("budget %(3%) spent", why)
    assert.has_error(function() rules.chain(1) end, "bad argument #1 to 'chain' (function expected, got number)")
  end)

  it("gc{}: orphans kept, then retention, tenant cap, global cap, budget", function()
    local r = rules.gc{ kill_after = "7d", tenant_cap = 1, global_cap = 100, max_kills = 10 }
    assert.equal("keep", r(item{ orphan = true, idle = 100 * DAY }, ctx()))
    assert.equal("kill", r(item{ idle = 8 * DAY }, ctx()))
    assert.equal("keep", r(item{ idle = DAY }, ctx()))
    assert.equal("kill", r(item{ idle = DAY }, ctx{ counts = { kept = 1, kill = 0, demote = 0 } }))
    assert.equal("kill", r(item{ idle = DAY }, ctx{ totals = { seen = 0, kept = 100, kill = 0, demote = 0 } }))
    assert.equal("keep", r(item{ idle = 8 * DAY }, ctx{ totals = { seen = 0, kept = 0, kill = 10, demote = 0 } }))
    assert.has_error(function() rules.gc{ tenant_cap = -1 } end)
    assert.has_error(function() rules.gc{ retention = "7d" } end,
      "bad argument #1 to 'gc' (unknown option 'retention')")
  end)

  it("is the `rules` global of a policy file, read-only", function()
    local p = assert(policy.load('return { name = "tiered", tenant = function(k) return k:sub(1, 2) end,\n'
      .. 'gc = rules.gc{ demote_after = "1d", kill_after = "3d", tenant_cap = 5 } }'))
    assert.equal("tiered", p.name)
    assert.equal("ac", p.tenant("acme:c1"))
    assert.equal("kill", p.gc(item{ idle = 4 * DAY }, ctx()))
    assert.equal("demote", p.gc(item{ idle = 2 * DAY }, ctx()))
    local bad, err = policy.load('rules.gc = nil\nreturn {}')
    assert.is_nil(bad)
    assert.matches("read%-only", err)
  end)

  it("the default policy keeps orphans and derives the tenant from the key", function()
    local d = policy.default
    assert.equal("keep", d.gc(item{ orphan = true, idle = 100 * DAY }, ctx()))
    assert.equal("kill", d.gc(item{ idle = 8 * DAY }, ctx()))
    assert.equal("acme", d.tenant("acme:c1:x"))
    assert.equal("solo", d.tenant("solo"))
  end)
end)

describe("the GC page's example policy file", function()
  it("loads and does what it says", function()
    local f = assert(io.open("docs/gc.md"))
    local page = f:read("a")
    f:close()
    local src = assert(page:match("```lua\n(%-%- gc%-policy%.lua.-)```"), "example not found in docs/gc.md")
    local p = assert(policy.load(src))
    assert.equal("tiered", p.name)
    assert.equal("ws1", p.tenant("ws1/thread-9"))
    assert.equal("keep", p.gc(item{ tenant = "oncall", idle = 100 * DAY }, ctx()))
    assert.equal("kill", p.gc(item{ tenant = "ws1", idle = 15 * DAY }, ctx()))
    assert.equal("demote", p.gc(item{ tenant = "ws1", idle = 3 * DAY }, ctx()))
    assert.equal("keep", p.gc(item{ tenant = "ws1", idle = DAY }, ctx()))
    assert.equal("kill", p.gc(item{ tenant = "ws1", idle = DAY }, ctx{ counts = { kept = 50, kill = 0, demote = 0 } }))
    assert.equal("keep", p.gc(item{ orphan = true, tenant = false, idle = 100 * DAY }, ctx()))
    assert.equal("keep", p.gc(item{ tenant = "ws1", idle = 15 * DAY },
      ctx{ totals = { seen = 0, kept = 0, kill = 1000, demote = 0 } }))
  end)
end)

describe("checkpoint rules", function()
  local T = 1000000
  local function cp(age) return { id = "c", created_at = T - age } end
  local function cx(rank, has_sandbox) return { now = T, rank = rank, has_sandbox = has_sandbox } end

  it("max_checkpoints deletes past the cap, newest kept (rank 1 = newest)", function()
    local r = rules.max_checkpoints(2)
    assert.is_nil(r(cp(0), cx(2, true)))
    local action, reason = r(cp(0), cx(3, true))
    assert.equal("delete", action)
    assert.equal("over the cap of 2 checkpoints per conversation", reason)
    assert.has_error(function() rules.max_checkpoints(-1) end)
  end)

  it("checkpoint_after deletes by age; checkpoint_orphans by a conversation without sandbox", function()
    local r = rules.checkpoint_after("2d")
    assert.is_nil(r(cp(86400), cx(1, true)))
    local action, reason = r(cp(3 * 86400), cx(1, true))
    assert.equal("delete", action)
    assert.equal("taken 3d ago (delete after 2d)", reason)
    assert.has_error(function() rules.checkpoint_after("soon") end)
    local o = rules.checkpoint_orphans()
    assert.equal("delete", (o(cp(0), cx(1, false))))
    assert.is_nil(o(cp(0), cx(1, true)))
    assert.equal("keep", (rules.checkpoint_orphans("keep")(cp(0), cx(1, false))))
    assert.has_error(function() rules.checkpoint_orphans("kill") end)
  end)

  it("checkpoints{} composes them: orphans first, then age, then the cap, else keep", function()
    local r = rules.checkpoints{ max_checkpoints = 3, checkpoint_after = "7d", orphans = "keep" }
    assert.equal("keep", (r(cp(30 * 86400), cx(9, false))))
    assert.equal("delete", (r(cp(30 * 86400), cx(1, true))))
    assert.equal("delete", (r(cp(0), cx(4, true))))
    assert.equal("keep", (r(cp(0), cx(3, true))))
    assert.has_error(function() rules.checkpoints{ max = 3 } end)
  end)

  it("policy files may have the checkpoint hooks", function()
    local p = assert(policy.load("return { checkpoint = function(info) return info.turn == 1 end, "
      .. "checkpoint_gc = rules.checkpoints{ max_checkpoints = 1 } }"))
    assert.is_true(p.checkpoint({ turn = 1 }))
    assert.equal("delete", (p.checkpoint_gc(cp(0), cx(2, true))))
  end)
end)
