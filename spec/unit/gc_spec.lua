-- warmbox.gc against a fake E2B client (list/info/kill/pause/connect recorders)
-- and the memory lock backend.
-- luacheck: ignore 212
local gc = require "warmbox.gc"
local lock = require "warmbox.lock"
local fake_e2b = require "spec.helpers.fake_e2b"

local TAG = "warmboxSessionId"
local NOW = gc.parse_time("2026-11-29T12:00:00Z")
local DAY = 86400

local function iso(t)
  return os.date("!%Y-%m-%dT%H:%M:%S", math.floor(t)) .. "Z"
end

local function fake_client(items, o)
  o = o or {}
  local c = fake_e2b.new{ clock = function() return NOW end, items = items, kill_many = o.kill_many }
  c.fail.list_at = o.list_error
  return c
end

local function sb(id, state, tv, started, ended, md)
  local metadata = md or { [TAG] = tv }
  return { sandbox_id = id, state = state, metadata = metadata, started_at = iso(started),
           end_at = iso(ended or started + 300), template_id = "base" }
end

local function calls_of(c, what) return c:calls_of(what) end

local max_age_policy = {
  gc = function(item, ctx)
    if ctx.now - item.last_activity > ctx.max_age then return "kill" end
    return "keep"
  end,
}

local memlock = { backend = "memory", timeout = 0 }

-- A real warmbox tag value for a session key (fake digests: no core needed).
local function wtag(key)
  local fakes = require "spec.helpers.fakes"
  local tag_mod = require "warmbox.tag"
  return tag_mod.tag_value(key, { hmac = fakes.hmac, sha256 = fakes.hash })
end

describe("warmbox.gc", function()
  describe(".parse_time()", function()
    it("parses RFC 3339 in UTC, with offsets and fractions", function()
      assert.equal(0, gc.parse_time("1970-01-01T00:00:00Z"))
      assert.equal(1795947600, gc.parse_time("2026-11-29T10:20:00Z"))
      assert.equal(1795947600, gc.parse_time("2026-11-29T12:20:00+02:00"))
      assert.equal(1795947600, gc.parse_time("2026-11-29T04:50:00-05:30"))
      assert.equal(1795947600.25, gc.parse_time("2026-11-29T10:20:00.250000Z"))
      assert.equal(951782400, gc.parse_time("2000-02-29T00:00:00Z"))
      assert.equal(42, gc.parse_time(42))
      assert.is_nil(gc.parse_time("yesterday"))
      assert.is_nil(gc.parse_time("2026-11-29T10:20:00"))
      assert.is_nil(gc.parse_time(nil))
    end)
  end)

  describe(".run()", function()
    local function run(c, o)
      o = o or {}
      o.client = c
      o.clock = o.clock or function() return NOW end
      o.lock = o.lock or memlock
      if o.policy == nil then o.policy = max_age_policy end
      return gc.run(o)
    end

    it("kills sandboxes inactive past max_age, measured from the pause, and keeps the rest", function()
      local c = fake_client{
        sb("old-paused", "paused", "s1", NOW - 10 * DAY, NOW - 3 * DAY),
        -- created long ago but paused an hour ago: recent activity
        sb("recent-paused", "paused", "s2", NOW - 10 * DAY, NOW - 3600),
        sb("young-running", "running", "s3", NOW - 600),
      }
      local report = assert(run(c))
      assert.equal(3, report.listed)
      assert.equal(3, report.tagged)
      assert.equal(1, report.killed)
      assert.equal(2, report.kept)
      assert.equal(0, report.busy)
      assert.same({}, report.errors)
      assert.same({ "kill old-paused" }, calls_of(c, "kill"))
      assert.same({ "info old-paused" }, calls_of(c, "info"))
      assert.equal(1, #report.actions)
      assert.same("old-paused", report.actions[1].sandbox_id)
      assert.same("s1", report.actions[1].session)
      assert.same("kill", report.actions[1].action)
      assert.matches("inactive for", report.actions[1].reason)
      assert.same({ "list running,paused " }, calls_of(c, "list"))
    end)

    it("uses the default policy and max_age when none is given; it keeps orphans", function()
      local c = fake_client{
        sb("a", "paused", wtag("ws:1"), NOW - 3 * DAY, NOW - 2 * DAY),
        sb("b", "paused", wtag("ws:2"), NOW - 3 * DAY, NOW - 2 * DAY),
        sb("o", "paused", "not-a-warmbox-tag", NOW - 30 * DAY, NOW - 29 * DAY),
      }
      local report = assert(gc.run{ client = c, clock = function() return NOW end, lock = memlock,
                                    max_age = 3 * DAY })
      assert.equal(0, report.killed)
      report = assert(gc.run{ client = c, clock = function() return NOW end, lock = memlock })
      assert.equal(2, report.killed)
      assert.equal(1, report.orphans)
      assert.equal(1, report.kept)
      assert.same({ "kill a", "kill b" }, calls_of(c, "kill"))
    end)

    it("refines a running sandbox's last activity with the session's remembered last run", function()
      local c = fake_client{ sb("busy-long", "running", "s-run", NOW - 2 * DAY) }
      local lk = lock.new{ backend = "memory" }
      assert(lk:lock("s-run"))
      lk:set_state(string.format('{"v":1,"sandbox_id":"busy-long","last_run":%d}', NOW - 60))
      lk:unlock()
      local report = assert(run(c))
      assert.equal(0, report.killed)
      assert.equal(1, report.kept)
      assert.same({}, calls_of(c, "kill"))
      -- a remembered last run of another sandbox does not count
      assert(lk:lock("s-run"))
      lk:set_state(string.format('{"v":1,"sandbox_id":"other","last_run":%d}', NOW - 60))
      lk:unlock()
      report = assert(run(c))
      assert.equal(1, report.killed)
      -- the remembered state stays (it names another sandbox)
      assert(lk:lock("s-run"))
      assert.matches('"other"', lk:get_state())
      lk:set_state(nil)
      lk:unlock()
    end)

    it("forgets the session's remembered sandbox when it kills it", function()
      local c = fake_client{ sb("gone-soon", "paused", "s-forget", NOW - 9 * DAY, NOW - 8 * DAY) }
      local lk = lock.new{ backend = "memory" }
      assert(lk:lock("s-forget"))
      lk:set_state('{"v":1,"sandbox_id":"gone-soon"}')
      lk:unlock()
      assert.equal(1, assert(run(c)).killed)
      assert(lk:lock("s-forget"))
      assert.is_nil(lk:get_state())
      lk:unlock()
    end)

    it("skips sandboxes whose session is busy", function()
      local c = fake_client{
        sb("x1", "paused", "held", NOW - 9 * DAY, NOW - 8 * DAY),
        sb("x2", "paused", "held", NOW - 9 * DAY, NOW - 8 * DAY),
        sb("y", "paused", "free", NOW - 9 * DAY, NOW - 8 * DAY),
      }
      local holder = lock.new{ backend = "memory" }
      assert(holder:lock("held"))
      local report = assert(run(c))
      holder:unlock()
      assert.equal(2, report.busy)
      assert.equal(1, report.killed)
      assert.same({ "kill y" }, calls_of(c, "kill"))
      local busy = {}
      for _, a in ipairs(report.actions) do
        if a.action == "busy" then busy[#busy + 1] = a.sandbox_id end
      end
      assert.same({ "x1", "x2" }, busy)
    end)

    it("locks a session with several sandboxes once and acts on all of them", function()
      local c = fake_client{
        sb("d1", "paused", "dup", NOW - 9 * DAY, NOW - 8 * DAY),
        sb("d2", "paused", "dup", NOW - 9 * DAY, NOW - 8 * DAY),
      }
      local report = assert(run(c, { concurrency = 1 }))
      assert.equal(2, report.killed)
      assert.equal(0, report.busy)
    end)

    it("with dry_run reports what it would do and touches nothing", function()
      local c = fake_client{
        sb("k1", "paused", "s1", NOW - 9 * DAY, NOW - 8 * DAY),
        sb("k2", "running", "s2", NOW - 9 * DAY),
        sb("keep", "paused", "s3", NOW - 9 * DAY, NOW - 60),
      }
      local holder = lock.new{ backend = "memory" }
      assert(holder:lock("s1")) -- even a busy session: dry_run does not lock
      local report = assert(run(c, { dry_run = true }))
      holder:unlock()
      assert.is_true(report.dry_run)
      assert.equal(2, report.killed)
      assert.equal(1, report.kept)
      assert.equal(2, #report.actions)
      assert.same({ "list running,paused " }, c.log)
    end)

    it("counts a policy error as POLICY and goes on", function()
      local c = fake_client{
        sb("bad", "paused", "s-bad", NOW - 9 * DAY, NOW - 8 * DAY),
        sb("good", "paused", "s-good", NOW - 9 * DAY, NOW - 8 * DAY),
        sb("weird", "paused", "s-weird", NOW - 9 * DAY, NOW - 8 * DAY),
      }
      local policy = { gc = function(item)
        if item.sandbox_id == "bad" then error("policy exploded") end
        if item.sandbox_id == "weird" then return "obliterate" end
        return "kill"
      end }
      local report = assert(run(c, { policy = policy }))
      assert.equal(1, report.killed)
      assert.equal(2, #report.errors)
      assert.equal("bad", report.errors[1].sandbox_id)
      assert.equal("POLICY", report.errors[1].code)
      assert.matches("policy exploded", report.errors[1].message)
      assert.equal("weird", report.errors[2].sandbox_id)
      assert.equal("POLICY", report.errors[2].code)
      assert.matches("obliterate", report.errors[2].message)
      assert.same({ "kill good" }, calls_of(c, "kill"))
    end)

    it("never touches untagged or other-tag sandboxes", function()
      local c = fake_client{
        sb("untagged", "paused", nil, NOW - 9 * DAY, NOW - 8 * DAY, {}),
        sb("nometa", "paused", nil, NOW - 9 * DAY, NOW - 8 * DAY, false),
        sb("other", "paused", nil, NOW - 9 * DAY, NOW - 8 * DAY, { otherTag = "x" }),
        sb("empty", "paused", nil, NOW - 9 * DAY, NOW - 8 * DAY, { [TAG] = "" }),
        sb("mine", "paused", "s", NOW - 9 * DAY, NOW - 8 * DAY),
      }
      local seen = {}
      local policy = { gc = function(item)
        seen[#seen + 1] = item.sandbox_id
        return "kill"
      end }
      local report = assert(run(c, { policy = policy }))
      assert.equal(5, report.listed)
      assert.equal(1, report.tagged)
      assert.same({ "mine" }, seen)
      assert.same({ "kill mine" }, calls_of(c, "kill"))
      assert.same({ "info mine" }, calls_of(c, "info"))
    end)

    it("demotes a running sandbox by pausing without memory, a paused one by connect + pause", function()
      local c = fake_client{
        sb("run", "running", "s1", NOW - 9 * DAY),
        sb("pz", "paused", "s2", NOW - 9 * DAY, NOW - 8 * DAY),
      }
      local report = assert(run(c, { policy = { gc = function() return "demote", "too old for memory" end } }))
      assert.equal(2, report.demoted)
      assert.same({ "pause run false", "pause pz false" }, calls_of(c, "pause"))
      assert.same({ "connect pz" }, calls_of(c, "connect"))
      assert.equal("too old for memory", report.actions[1].reason)
    end)

    it("re-checks the state before acting: changed or gone sandboxes are skipped", function()
      local c = fake_client{
        sb("resumed", "paused", "s1", NOW - 9 * DAY, NOW - 8 * DAY),
        sb("repaused", "paused", "s2", NOW - 9 * DAY, NOW - 8 * DAY),
        sb("vanished", "paused", "s3", NOW - 9 * DAY, NOW - 8 * DAY),
        sb("dead", "paused", "s4", NOW - 9 * DAY, NOW - 8 * DAY),
      }
      c.info_over.resumed = { sandbox_id = "resumed", state = "running", metadata = { [TAG] = "s1" } }
      c.info_over.repaused = sb("repaused", "paused", "s2", NOW - 9 * DAY, NOW - 10)
      c.info_over.vanished = "gone"
      local report = assert(run(c))
      assert.equal(1, report.killed)
      assert.equal(3, report.skipped)
      assert.same({ "kill dead" }, calls_of(c, "kill"))
    end)

    it("uses the client's kill_many at the pass's concurrency", function()
      local items = {}
      for i = 1, 15 do items[i] = sb("b" .. i, "paused", "s" .. i, NOW - 9 * DAY, NOW - 8 * DAY) end
      local c = fake_client(items, { kill_many = true })
      local report = assert(run(c, { concurrency = 3 }))
      assert.equal(15, report.killed)
      local sizes = {}
      for i, b in ipairs(c.batches) do
        sizes[i] = b.n
        assert.equal(3, b.concurrency)
      end
      assert.same({ 12, 3 }, sizes) -- kill_many keeps 3 in flight; 4 rounds a call once listed
    end)

    it("returns nil, msg, code when listing fails", function()
      local c = fake_client({ sb("a", "paused", "s", NOW - 9 * DAY, NOW - 8 * DAY),
                              sb("b", "paused", "s", NOW - 9 * DAY, NOW - 8 * DAY) }, { list_error = 2 })
      local ok, err, code = run(c)
      assert.is_nil(ok)
      assert.equal("list sandboxes: boom", err)
      assert.equal("HTTP", code)
      assert.same({}, calls_of(c, "kill"))
    end)

    it("raises on misuse", function()
      assert.has_error(function() gc.run() end, "bad argument #1 to 'run' (table expected, got nil)")
      assert.has_error(function() gc.run{ client = fake_client{}, bogus = 1 } end,
        "bad argument #1 to 'run' (unknown option 'bogus')")
      assert.has_error(function() gc.run{} end, "bad argument #1 to 'run' (option 'client': an e2b client expected)")
      assert.has_error(function() gc.run{ client = fake_client{}, concurrency = 0 } end,
        "bad argument #1 to 'run' (option 'concurrency': a positive integer expected)")
      assert.has_error(function() gc.run{ client = fake_client{}, policy = {} } end,
        "bad argument #1 to 'run' (option 'policy': a table with a 'gc' function expected)")
      assert.has_error(function() gc.run{ client = fake_client{}, lock = { backend = "nope" } } end,
        "bad argument #1 to 'new' (unknown backend 'nope')")
    end)
  end)

  describe(".release()", function()
    it("kills exactly the sandboxes tagged with the value and clears the state", function()
      local c = fake_client{
        sb("r1", "paused", "conv-1", NOW - 60),
        sb("r2", "running", "conv-1", NOW - 60),
        -- what a loose server-side filter could return: a longer value
        sb("r3", "running", "conv-10", NOW - 60),
      }
      c.loose = true -- the fake lists r3 for a filter on "conv-1"
      local lk = lock.new{ backend = "memory" }
      assert(lk:lock("conv-1"))
      lk:set_state('{"v":1,"sandbox_id":"r1"}')
      lk:unlock()
      local n = assert(gc.release{ client = c, tag_value = "conv-1", lock = memlock })
      assert.equal(2, n)
      assert.same({ "kill r1", "kill r2" }, calls_of(c, "kill"))
      assert.same({ "list running,paused " .. TAG }, calls_of(c, "list"))
      assert(lk:lock("conv-1"))
      assert.is_nil(lk:get_state())
      lk:unlock()
    end)

    it("kills a session's sandboxes in one bounded parallel batch when the client can", function()
      local c = fake_client({
        sb("p1", "paused", "conv-3", NOW - 60), sb("p2", "paused", "conv-3", NOW - 50),
        sb("p3", "running", "conv-3", NOW - 40), sb("q1", "paused", "conv-4", NOW - 60),
      }, { kill_many = true })
      local n = assert(gc.release{ client = c, tag_value = "conv-3", lock = memlock, concurrency = 2 })
      assert.equal(3, n)
      -- one batch of the three, at the concurrency asked for; conv-4's sandbox untouched
      assert.same({ { n = 3, concurrency = 2 } }, c.batches)
      local killed = calls_of(c, "kill")
      table.sort(killed)
      assert.same({ "kill p1", "kill p2", "kill p3" }, killed)
    end)

    it("returns nil, msg, 'BUSY' when the session stays locked", function()
      local c = fake_client{ sb("r1", "paused", "conv-2", NOW - 60) }
      local holder = lock.new{ backend = "memory" }
      assert(holder:lock("conv-2"))
      local ok, err, code = gc.release{ client = c, tag_value = "conv-2", lock = memlock }
      holder:unlock()
      assert.is_nil(ok)
      assert.equal("session 'conv-2' is busy (another run holds it)", err)
      assert.equal("BUSY", code)
      assert.same({}, calls_of(c, "kill"))
    end)

    it("raises on misuse", function()
      assert.has_error(function() gc.release{ client = fake_client{} } end,
        "bad argument #1 to 'release' (option 'tag_value': a non-empty string expected)")
    end)
  end)
end)
