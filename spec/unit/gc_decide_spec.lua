-- warmbox.gc.decide: the pure decisions of a GC pass (the item a policy sees,
-- the tenant fallback, what a hook's answer means, the kill budget, the
-- refinement under the lock, the re-check), without a client or a lock.
local decide = require "warmbox.gc.decide"
local fakes = require "spec.helpers.fakes"
local tag = require "warmbox.tag"
local util = require "warmbox.util"

local TAG = "warmboxSessionId"
local NOW = util.parse_time("2026-11-29T12:00:00Z")

local function iso(t) return os.date("!%Y-%m-%dT%H:%M:%S", math.floor(t)) .. "Z" end
local function wtag(key) return tag.tag_value(key, { hmac = fakes.hmac, sha256 = fakes.hash }) end

local function listed(o)
  return { sandbox_id = o.id or "sb1", state = o.state or "paused",
    metadata = o.metadata or { [TAG] = wtag("acme:c1") }, started_at = o.started_at or iso(NOW - 7200),
    end_at = o.end_at or iso(NOW - 3600), template_id = "base" }
end

describe("warmbox.gc.decide", function()
  describe(".item()", function()
    it("gives a tagged sandbox its key, tenant and last activity (a paused one: its pause)", function()
      local item = decide.item(listed{}, TAG, decide.default_tenant)
      assert.equal("acme:c1", item.key)
      assert.equal("acme", item.tenant)
      assert.equal(NOW - 3600, item.last_activity)
      assert.is_false(item.orphan)
      assert.is_false(item.demoted)
      assert.equal("base", item.template_id)
    end)

    it("a running one: its start; untagged: nil; a foreign tag value: an orphan without a tenant", function()
      assert.equal(NOW - 7200, decide.item(listed{ state = "running" }, TAG, decide.default_tenant).last_activity)
      assert.is_nil(decide.item(listed{ metadata = { other = "x" } }, TAG, decide.default_tenant))
      assert.is_nil(decide.item(listed{ metadata = { [TAG] = "" } }, TAG, decide.default_tenant))
      local o = decide.item(listed{ metadata = { [TAG] = "not-a-warmbox-tag" } }, TAG, decide.default_tenant)
      assert.is_true(o.orphan)
      assert.is_nil(o.tenant)
      assert.equal("(orphans)", decide.group(o))
    end)

    it("marks a sandbox paused within seconds of its start as demoted", function()
      local d = listed{ started_at = iso(NOW - 100), end_at = iso(NOW - 98) }
      assert.is_true(decide.item(d, TAG, decide.default_tenant).demoted)
      assert.is_true(decide.demoted(NOW - 100, NOW - 98))
      assert.is_false(decide.demoted(NOW - 100, NOW - 10))
      assert.is_false(decide.demoted(nil, NOW))
    end)

    it("falls back to the default tenant when the policy's tenant hook raises or answers a non-string", function()
      assert.equal("acme", decide.item(listed{}, TAG, function() error("boom") end).tenant)
      assert.equal("acme", decide.item(listed{}, TAG, function() return 42 end).tenant)
      assert.equal("t-acme:c1", decide.item(listed{}, TAG, function(k) return "t-" .. k end).tenant)
      assert.equal("nocolon", decide.default_tenant("nocolon"))
      assert.is_nil(decide.default_tenant(nil))
    end)
  end)

  describe(".ask() and .answer()", function()
    local s = { max_age = 600, tag = TAG, max_kills = nil, dry_run = false }
    local function ctx(item) return decide.context(s, NOW, item, {}, { seen = 1, kept = 0, kill = 0, demote = 0 }) end

    it("reads an action, with a reason of inactivity when the hook gives none", function()
      local item = decide.item(listed{}, TAG, decide.default_tenant)
      assert.same({ "kill", "inactive for 3600s (max_age 600s)" },
        { decide.ask(function() return "kill" end, item, ctx(item)) })
      assert.same({ "keep" }, { decide.ask(function() return "keep" end, item, ctx(item)) })
      assert.same({ "demote", "7" }, { decide.ask(function() return "demote", 7 end, item, ctx(item)) })
    end)

    it("hands the hook a copy of the item and the counts so far", function()
      local item = decide.item(listed{}, TAG, decide.default_tenant)
      local seen
      decide.ask(function(it, c)
        it.key = "changed"
        seen = c
        return "keep"
      end, item, decide.context(s, NOW, item, { acme = { kept = 2, kill = 1, demote = 0 } },
        { seen = 4, kept = 2, kill = 1, demote = 0 }))
      assert.equal("acme:c1", item.key)
      assert.same({ kept = 2, kill = 1, demote = 0 }, seen.counts)
      assert.equal(4, seen.totals.seen)
      assert.equal(600, seen.retention)
    end)

    it("turns a failing or unknown answer into a message", function()
      local item = decide.item(listed{}, TAG, decide.default_tenant)
      local a, msg = decide.ask(function() error("bad hook") end, item, ctx(item))
      assert.is_nil(a)
      assert.matches("^gc policy failed: .*bad hook", msg)
      assert.same({ nil, 'gc policy returned nuke (expected "keep", "kill" or "demote")' },
        { decide.answer(true, "nuke", nil, item, NOW, 600) })
    end)
  end)

  it(".budget() keeps a kill once max_kills kills are decided", function()
    assert.same({ "kill", "r", false }, { decide.budget("kill", "r", 2, 1) })
    assert.same({ "keep", "max-kills budget (2) spent", true }, { decide.budget("kill", "r", 2, 2) })
    assert.same({ "demote", "r", false }, { decide.budget("demote", "r", 2, 5) })
    assert.same({ "kill", "r", false }, { decide.budget("kill", "r", nil, 99) })
  end)

  it(".count() counts per group and in total, and back", function()
    local tenants, totals = {}, { seen = 0, kept = 0, kill = 0, demote = 0 }
    local item = { tenant = "acme" }
    decide.count(tenants, totals, item, "kill", 1)
    decide.count(tenants, totals, item, "keep", 1)
    decide.count(tenants, totals, { key = nil, orphan = false }, "demote", 1)
    decide.count(tenants, totals, item, "kill", -1)
    assert.same({ acme = { kept = 1, kill = 0, demote = 0 }, ["(hashed)"] = { kept = 0, kill = 0, demote = 1 } },
      tenants)
    assert.same({ seen = 0, kept = 1, kill = 0, demote = 1 }, totals)
  end)

  it(".remembered() gives the session's later last run of that very sandbox", function()
    local item = { sandbox_id = "sb1", last_activity = NOW - 3600 }
    assert.equal(NOW - 10, decide.remembered(item, { sandbox_id = "sb1", last_run = NOW - 10 }))
    assert.is_nil(decide.remembered(item, { sandbox_id = "sb2", last_run = NOW - 10 }))
    assert.is_nil(decide.remembered(item, { sandbox_id = "sb1", last_run = NOW - 7200 }))
    assert.is_nil(decide.remembered(item, {}))
  end)

  it(".unchanged() holds only for the sandbox as it was decided on", function()
    local d = listed{}
    local item = decide.item(d, TAG, decide.default_tenant)
    assert.is_true(decide.unchanged(item, listed{}, TAG))
    assert.is_false(decide.unchanged(item, listed{ state = "running" }, TAG))
    assert.is_false(decide.unchanged(item, listed{ end_at = iso(NOW - 5) }, TAG))
    assert.is_false(decide.unchanged(item, listed{ started_at = iso(NOW - 5) }, TAG))
    assert.is_false(decide.unchanged(item, listed{ metadata = { [TAG] = wtag("acme:c2") } }, TAG))
    assert.is_false(decide.unchanged(item, { state = "paused" }, TAG))
  end)
end)
