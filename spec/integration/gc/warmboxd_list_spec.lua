-- warmbox.gc against a real warmboxd: seeded tagged sandboxes are aged via
-- the policy's max_age (and the GC clock), old ones are killed through the
-- control plane, young ones, busy sessions and sandboxes without our tag
-- are left alone. Also gc.release and a demote of a real sandbox.
-- This file: the part 'list' of them; shared helpers in spec/helpers/gc_warmboxd.lua.
local shared = require "spec.helpers.gc_warmboxd"
local wbd = shared.wbd
local http = shared.http
local gc = shared.gc
local lock = shared.lock
local TAG = shared.TAG
local T = shared.T

describe("warmbox.gc against warmboxd", function()
  local srv, client, dir, e2b

  lazy_setup(function()
    e2b = require "warmbox.e2b"
    srv = wbd.start{ args = { "--rtt-ms", "0" } }
    client = e2b.new{ api_key = srv.api_key, api_url = srv.url, sandbox_url = srv.url }
    dir = os.tmpname()
    os.remove(dir)
  end)
  lazy_teardown(function()
    if client then client:close() end
    if srv then srv:stop() end
    if dir then os.execute("rm -rf '" .. dir .. "'") end
  end)

  local function seed(n, state, metadata)
    local r = http.api(srv, "POST", "/_warmboxd/seed", { count = n, state = state, metadata = metadata })
    assert.equal(200, r.status, r.body)
    assert.equal(n, r.json.created)
  end

  local function listed()
    local by_tag = {}
    for item, err in client:list{ state = { "running", "paused" }, limit = 100 } do
      assert(item, err)
      local tv = item.metadata and item.metadata[TAG] or "-"
      by_tag[tv] = by_tag[tv] or {}
      table.insert(by_tag[tv], item)
    end
    return by_tag
  end

  local function stats()
    return http.request{ url = srv.url .. "/_warmboxd/stats" }.json
  end

  it("kills what is older than max_age since its last activity, nothing else", function()
    -- old: paused first
    seed(3, "paused", { [TAG] = T.old })
    seed(2, "paused", { [TAG] = T["old-but-busy"] })
    seed(2, "paused", { otherTag = "old" })
    seed(2, "paused", {})
    local first = listed()
    local old_end = assert(gc.parse_time(first[T.old][1].end_at))
    os.execute("sleep 2.2")
    -- young: paused and running 2+ s later
    seed(2, "paused", { [TAG] = T.young })
    seed(1, "running", { [TAG] = T["young-running"] })
    -- GC "now" is one max_age after the old ones' pause, plus a second.
    local max_age = 3600
    local clock = function() return old_end + 1 + max_age end
    local lock_opts = { backend = "file", dir = dir }
    local holder = lock.new(lock_opts)
    assert(holder:lock(T["old-but-busy"]))

    local dry = assert(gc.run{ client = client, tag = TAG, lock = lock_opts, clock = clock, max_age = max_age,
                               dry_run = true, concurrency = 2 })
    assert.equal(5, dry.killed)
    assert.equal(12, dry.listed)
    assert.equal(8, dry.tagged)
    assert.equal(0, (stats().requests["DELETE /sandboxes/{id}"] or 0))

    local report = assert(gc.run{ client = client, tag = TAG, lock = lock_opts, clock = clock, max_age = max_age,
                                  concurrency = 2 })
    holder:unlock()
    assert.same({}, report.errors)
    assert.equal(12, report.listed)
    assert.equal(8, report.tagged)
    assert.equal(3, report.killed)
    assert.equal(2, report.busy)
    assert.equal(3, report.kept)
    assert.equal(3, stats().requests["DELETE /sandboxes/{id}"])

    local after = listed()
    assert.is_nil(after[T.old])
    assert.equal(2, #after[T["old-but-busy"]])
    assert.equal(2, #after[T.young])
    assert.equal(1, #after[T["young-running"]])
    assert.equal(4, #after["-"])
  end)

  it("release kills exactly one session's sandboxes", function()
    seed(2, "paused", { [TAG] = T["conv-1"] })
    seed(1, "running", { [TAG] = T["conv-10"] })
    local n = assert(gc.release{ client = client, tag = TAG, tag_value = T["conv-1"],
                                 lock = { backend = "file", dir = dir } })
    assert.equal(2, n)
    local after = listed()
    assert.is_nil(after[T["conv-1"]])
    assert.equal(1, #after[T["conv-10"]])
  end)

  it("demotes a real running sandbox to a filesystem-only snapshot", function()
    local sb, err = client:create{ template = "base", timeout = 120, metadata = { [TAG] = "demote-me" } }
    assert(sb, err)
    local report = assert(gc.run{ client = client, tag = TAG, lock = { backend = "file", dir = dir },
      policy = { gc = function(item) return item.sandbox_id == sb.sandbox_id and "demote" or "keep" end } })
    assert.same({}, report.errors)
    assert.equal(1, report.demoted)
    local info = assert(client:info(sb.sandbox_id))
    assert.equal("paused", info.state)
    client:kill(sb.sandbox_id)
  end)
end)

describe("warmbox.gc at scale, policies and scheduling, against warmboxd", function()
  local srv, client, dir
  local rules = require "warmbox.policy.rules"
  local DAY = 86400

  before_each(function()
    srv = wbd.start{ args = { "--rtt-ms", "0" } }
    client = require("warmbox.e2b").new{ api_key = srv.api_key, api_url = srv.url, sandbox_url = srv.url }
    dir = os.tmpname()
    os.remove(dir)
  end)
  after_each(function()
    client:close()
    srv:stop()
    os.execute("rm -rf '" .. dir .. "'")
  end)

  local function seed_sessions(n_sessions, per, ago)
    for i = 1, n_sessions do
      wbd.seed(srv, { count = per, state = "paused", metadata = { [TAG] = T["s" .. i] },
        started_ago_s = ago + 3600, paused_ago_s = ago })
    end
  end
  local function count_listed()
    local n = 0
    for item, err in client:list{ state = { "running", "paused" } } do
      assert(item, err)
      n = n + 1
    end
    return n
  end

  describe("listing", function()
    it("streams 6,000 sandboxes at concurrency 1 with a bounded heap (the h:batch cliff is gone)", function()
      seed_sessions(30, 100, 30 * DAY)
      seed_sessions(30, 100, 3600) -- the same sessions, young ones
      collectgarbage()
      local base, peak = collectgarbage("count"), 0
      local rep = assert(gc.run{ client = client, tag = TAG, lock = { backend = "file", dir = dir },
        max_age = 7 * DAY, concurrency = 1, actions = false, on_page = function()
          collectgarbage()
          local kb = collectgarbage("count")
          if kb > peak then peak = kb end
        end })
      assert.same({}, rep.errors)
      assert.equal(6000, rep.listed)
      assert.equal(3000, rep.killed)
      assert.equal(3000, rep.kept)
      -- listed from both ends: 60 pages, plus at most one per side where they met
      assert.is_true(rep.pages >= 60 and rep.pages <= 62, "pages: " .. rep.pages)
      assert.equal(3000, count_listed())
      assert.equal(3000, wbd.stats(srv).requests["DELETE /sandboxes/{id}"])
      assert.is_true(peak - base < 1024, string.format("heap grew by %.0f KB", peak - base))
    end)

    it("resumes a pass from its next_token", function()
      seed_sessions(10, 50, 30 * DAY) -- 500: 5 pages
      local lock_opts = { backend = "file", dir = dir }
      local rep = assert(gc.run{ client = client, tag = TAG, lock = lock_opts, max_age = DAY, pages = 2 })
      assert.equal(200, rep.killed)
      assert.is_string(rep.next_token)
      local rep2 = assert(gc.run{ client = client, tag = TAG, lock = lock_opts, max_age = DAY,
        next_token = rep.next_token })
      assert.equal(300, rep2.killed)
      assert.is_nil(rep2.next_token)
      assert.same({}, rep2.errors)
      assert.equal(0, count_listed())
      assert.equal(500, wbd.stats(srv).requests["DELETE /sandboxes/{id}"]) -- each killed once
    end)

    it("lists from both ends while the pages change between calls: nothing skipped, nothing twice", function()
      -- 40 sessions of 40, started 0.9 to 36 days ago: the newest first are kept,
      -- the oldest (what oldest-first reaches at once) expired
      for i = 1, 40 do
        wbd.seed(srv, { count = 40, state = "paused", metadata = { [TAG] = T["mix" .. i] },
          started_ago_s = math.floor(i * 0.9 * DAY) + 3600, paused_ago_s = math.floor(i * 0.9 * DAY) })
      end
      local expired, n = {}, 0
      for item, err in client:list{ state = { "running", "paused" } } do
        assert(item, err)
        n = n + 1
        if gc.parse_time(item.end_at) < os.time() - 7 * DAY then expired[item.sandbox_id] = gc.list_key(item) end
      end
      assert.equal(1600, n)
      local seen, touched, ext_kills, created = {}, {}, 0, 0
      local policy = { gc = rules.any_order(function(item, ctx)
        seen[item.sandbox_id] = (seen[item.sandbox_id] or 0) + 1
        return require("warmbox.policy.default").gc(item, ctx)
      end) }
      -- expired sandboxes not listed yet, in listing order: the middle ones are
      -- pages away from both cursors (a page just answered may not be decided yet)
      local function unseen_expired()
        local ids = {}
        for id in pairs(expired) do if not seen[id] and not touched[id] then ids[#ids + 1] = id end end
        table.sort(ids, function(a, b) return gc.before(expired[a], expired[b]) end)
        return ids
      end
      local rep = assert(gc.run{ client = client, tag = TAG, lock = { backend = "file", dir = dir }, policy = policy,
        max_age = 7 * DAY, concurrency = 4, limit = 50, on_page = function()
          -- between two calls: someone kills an expired sandbox not listed yet, a new
          -- sandbox starts, and one not listed yet is resumed (it moves to the newest end)
          local ids = unseen_expired()
          if #ids >= 300 then
            local a, b = ids[#ids // 2], ids[#ids // 2 + 1]
            assert(client:kill(a))
            touched[a], expired[a], ext_kills = true, nil, ext_kills + 1
            assert(client:connect(b, { timeout = 600 }))
            touched[b], expired[b] = true, nil
          end
          created = created + 1
          wbd.seed(srv, { count = 1, state = "running", metadata = { [TAG] = T["new" .. created] } })
        end })
      assert.same({}, rep.errors)
      assert.is_true(ext_kills >= 10, "changes: " .. ext_kills)
      for id, k in pairs(seen) do assert.equal(1, k, id .. " decided twice") end
      local n_expired = 0
      for _ in pairs(expired) do n_expired = n_expired + 1 end
      assert.equal(n_expired, rep.killed)
      assert.equal(0, rep.skipped)
      -- each DELETE: the pass's kills and the ones made "by someone else"
      assert.equal(rep.killed + ext_kills, wbd.stats(srv).requests["DELETE /sandboxes/{id}"])
      -- listed from both ends
      local asc = 0
      for item, err in client:list{ state = { "running", "paused" } } do
        assert(item, err)
        assert.is_nil(expired[item.sandbox_id], item.sandbox_id .. " expired, not killed")
        if touched[item.sandbox_id] then asc = asc + 1 end
      end
      assert.equal(ext_kills, asc) -- the resumed ones are still there
      -- the killed and resumed ones were not listed (they left before the cursors
      -- got there), the new ones neither (newer than where newest-first started)
      assert.equal(1600 - 2 * ext_kills, rep.listed)
    end)
  end)

end)
