-- warmbox.gc listing from both ends (newest first and oldest first, meeting in
-- the middle) against a fake that follows E2B's pagination to the letter
-- (E2B's API, pagination): newest first by startedAt to the microsecond, ties
-- by sandbox id ascending, `order=asc` the exact reverse, a page starts
-- strictly after its cursor's item, a token of the other order is refused.
-- Pages change between calls (sandboxes killed, created, resumed): each
-- sandbox is decided at most once, what expired is killed exactly once.
-- luacheck: ignore 212
local gc = require "warmbox.gc"
local rules = require "warmbox.policy.rules"
local default = require "warmbox.policy.default"
local fakes = require "spec.helpers.fakes"
local tag_mod = require "warmbox.tag"

local TAG = "warmboxSessionId"
local NOW = gc.parse_time("2026-11-29T12:00:00Z")
local DAY = 86400
local RETENTION = 7 * DAY

local function iso_us(us)
  return os.date("!%Y-%m-%dT%H:%M:%S", us // 1000000) .. string.format(".%06dZ", us % 1000000)
end
local function wtag(key) return tag_mod.tag_value(key, { hmac = fakes.hmac, sha256 = fakes.hash }) end

-- A fake E2B with `batch`. `o.before_list(c, n)` runs before the n-th list
-- request is answered (to change the pages between calls); `o.fail_list(c, n,
-- op_opts)` answers it with a 503.
local function e2b_fake(o)
  o = o or {}
  local c = { alive = {}, kill_calls = {}, killed = 0, lists = 0, asc_lists = 0, desc_lists = 0, max_inflight = 0 }
  function c.put(id, started_us, state, end_us, tv)
    c.alive[id] = { sandbox_id = id, state = state, started_at = iso_us(started_us),
                    end_at = end_us and iso_us(end_us) or nil, metadata = { [TAG] = tv }, us = started_us }
  end
  local function before(a, b) -- a before b, newest first
    if a.us ~= b.us then return a.us > b.us end
    return a.sandbox_id < b.sandbox_id
  end
  local function page(lo)
    c.lists = c.lists + 1
    if o.before_list then o.before_list(c, c.lists) end
    if o.fail_list and o.fail_list(c, c.lists, lo) then
      return { false, "list sandboxes: http 503", "HTTP", lo.next_token }
    end
    local asc = lo.order == "asc"
    if asc then c.asc_lists = c.asc_lists + 1 else c.desc_lists = c.desc_lists + 1 end
    local all = {}
    for _, r in pairs(c.alive) do all[#all + 1] = r end
    table.sort(all, function(a, b)
      if asc then return before(b, a) end
      return before(a, b)
    end)
    local cur
    if lo.next_token then
      local dir, us, id = lo.next_token:match("^(%a)|(%-?%d+)|(.+)$")
      assert(dir == (asc and "a" or "d"), "a token of the other order: 400")
      cur = { us = math.tointeger(tonumber(us)), sandbox_id = id }
    end
    local out, last = {}, nil
    c.log = c.log or {}
    local entry = { n = c.lists, order = lo.order or "desc", token = lo.next_token, ids = {} }
    c.log[#c.log + 1] = entry
    for _, r in ipairs(all) do
      local after = not cur or (asc and before(r, cur)) or (not asc and before(cur, r))
      if after then
        if #out == lo.limit then
          return { out, lo.next_token or false, (asc and "a" or "d") .. "|" .. last.us .. "|" .. last.sandbox_id }
        end
        local d = {}
        for k, v in pairs(r) do if k ~= "us" then d[k] = v end end
        out[#out + 1] = d
        entry.ids[#entry.ids + 1] = r.sandbox_id
        last = r
      end
    end
    return { out, lo.next_token or false, nil }
  end
  function c:batch(ops, bo)
    local res, nk = {}, 0
    for i, op in ipairs(ops) do
      if op.op == "list" then
        res[i] = page(op.opts)
      else
        nk = nk + 1
        c.kill_calls[op.id] = (c.kill_calls[op.id] or 0) + 1
        if c.alive[op.id] then
          c.alive[op.id] = nil
          c.killed = c.killed + 1
          res[i] = { true }
        else
          res[i] = { false }
        end
      end
    end
    c.max_inflight = math.max(c.max_inflight, math.min(nk, bo.concurrency))
    return res
  end
  return c
end

-- n sandboxes with startedAt spread over 40 days (deterministic), paused an
-- hour after their start; `ties`: all started in the same microsecond.
-- Returns the fake and the set of expired ids.
local function seeded(n, o)
  o = o or {}
  local c = e2b_fake(o)
  local expired = {}
  local rnd = 12345
  local step = 40 * DAY * 1000000 // 2147483648 -- spread over 40 days
  for i = 1, n do
    rnd = (rnd * 1103515245 + 12345) % 2147483648
    local started = o.ties and (NOW - 20 * DAY) * 1000000 or (NOW - 40 * DAY) * 1000000 + rnd * step
    local end_us = o.ties and (i % 2 == 0 and (NOW - 10 * DAY) or (NOW - DAY)) * 1000000 or started + 3600 * 1000000
    local id = string.format("sb%05d", i)
    c.put(id, started, "paused", end_us, wtag(string.format("t%d:conv-%d", i % 7, i % 50)))
    if end_us // 1000000 < NOW - RETENTION then expired[id] = true end
  end
  return c, expired
end

-- The default policy, counting the decisions per sandbox (still independent of the order).
local function recording(seen)
  return { gc = rules.any_order(function(item, ctx)
    seen[item.sandbox_id] = (seen[item.sandbox_id] or 0) + 1
    return default.gc(item, ctx)
  end) }
end

local function run(c, o)
  o = o or {}
  o.client, o.clock, o.max_age = c, function() return NOW end, RETENTION
  o.lock = o.lock or require("spec.helpers.fakes").counting_lock()
  return gc.run(o)
end

local function count(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

-- Every expired sandbox killed exactly once, nothing else killed, and no
-- sandbox decided twice.
local function assert_clean(c, expired, seen, n)
  for id, k in pairs(c.kill_calls) do
    assert.equal(1, k, id .. " killed twice")
    assert.is_true(expired[id] == true, id .. " killed but not expired")
  end
  for id in pairs(expired) do assert.is_nil(c.alive[id], id .. " expired and missed") end
  if seen then
    for id, k in pairs(seen) do assert.equal(1, k, id .. " decided twice") end
    if n then assert.equal(n, count(seen)) end
  end
end

describe("warmbox.gc from both ends", function()
  it("lists newest first and oldest first at once; they meet: each sandbox decided once", function()
    local c, expired = seeded(2000)
    local seen = {}
    local rep = assert(run(c, { policy = recording(seen), concurrency = 8 }))
    assert_clean(c, expired, seen, 2000)
    assert.equal(2000, rep.listed)
    assert.equal(count(expired), rep.killed)
    assert.equal(0, rep.skipped)
    assert.is_true(c.asc_lists >= 9 and c.desc_lists >= 9, c.asc_lists .. " asc, " .. c.desc_lists .. " desc")
    assert.is_true(rep.pages <= 22, "pages: " .. rep.pages) -- 20 pages, plus one per side where they met
    assert.is_nil(rep.next_token)
    assert.is_nil(rep.resume_token)
    assert.equal(8, c.max_inflight)
  end)

  it("the default policy lists from both ends; caps keep one cursor, newest first", function()
    local c = seeded(500)
    assert(run(c))
    assert.is_true(c.asc_lists > 0)
    c = seeded(500)
    local rep = assert(run(c, { policy = { gc = rules.gc{ kill_after = "7d", tenant_cap = 1000 } } }))
    assert.equal(0, c.asc_lists)
    assert.equal(500, rep.listed)
    c = seeded(500)
    assert(run(c, { order = "both", policy = { gc = rules.gc{ kill_after = "7d", tenant_cap = 1000 } } }))
    assert.is_true(c.asc_lists > 0)
    c = seeded(500)
    assert(run(c, { order = "newest" }))
    assert.equal(0, c.asc_lists)
  end)

  it("rules say which hooks do not depend on the listing order", function()
    assert.is_true(rules.is_any_order(default.gc))
    assert.is_true(rules.is_any_order(rules.gc{ kill_after = "7d", demote_after = "1d", max_kills = 5 }))
    assert.is_true(rules.is_any_order(rules.chain(rules.orphans("kill"), rules.retention{})))
    assert.is_false(rules.is_any_order(rules.gc{ kill_after = "7d", tenant_cap = 3 }))
    assert.is_false(rules.is_any_order(rules.gc{ global_cap = 3 }))
    assert.is_false(rules.is_any_order(rules.chain(function() end, rules.retention{})))
    assert.is_false(rules.is_any_order(rules.budget(3, function() end)))
  end)

  it("meets exactly in ties (one microsecond, ids as tiebreak), at any page size and count", function()
    for _, limit in ipairs({ 1, 3, 7, 100 }) do
      for _, n in ipairs({ 0, 1, 2, 3, 99, 100, 101, 250 }) do
        local c, expired = seeded(n, { ties = true })
        local seen = {}
        local rep = assert(run(c, { policy = recording(seen), limit = limit, concurrency = 3 }))
        assert_clean(c, expired, seen, n)
        assert.equal(n, rep.listed, "n " .. n .. ", limit " .. limit)
        assert.equal(count(expired), rep.killed)
      end
    end
  end)

  it("pages that change between calls: killed, created and resumed sandboxes; nothing twice, nothing missed", function()
    local c, expired = seeded(3000)
    local seen = {}
    local start_expired = {}
    for id in pairs(expired) do start_expired[id] = true end
    local touched, created = {}, 0
    local rnd = 99
    local function pick(pred)
      local ids = {}
      for id, r in pairs(c.alive) do if pred(id, r) then ids[#ids + 1] = id end end
      if #ids == 0 then return nil end
      table.sort(ids)
      rnd = (rnd * 1103515245 + 12345) % 2147483648
      return ids[rnd % #ids + 1]
    end
    c = e2b_fake{ before_list = function(fc, n)
      if n < 3 then return end
      -- someone else kills an expired sandbox GC has not seen yet
      local id = pick(function(i) return expired[i] and not seen[i] and not touched[i] end)
      if id then
        fc.alive[id], touched[id], expired[id] = nil, true, nil
      end
      -- a new sandbox starts (the newest of all)
      created = created + 1
      fc.put("new" .. created, (NOW + created) * 1000000, "running", nil, wtag("t1:new-" .. created))
      -- a sandbox not seen yet is resumed (it moves to the newest end)
      id = pick(function(i) return not seen[i] and not touched[i] and i:match("^sb") end)
      if id then
        local tv = fc.alive[id].metadata[TAG]
        fc.put(id, (NOW + 1000 + n) * 1000000, "running", nil, tv)
        touched[id], expired[id] = true, nil
      end
      -- and one already decided and kept is resumed too
      id = pick(function(i) return seen[i] and not expired[i] and not touched[i] and i:match("^sb") end)
      if id then
        local tv = fc.alive[id].metadata[TAG]
        fc.put(id, (NOW + 2000 + n) * 1000000, "running", nil, tv)
        touched[id] = true
      end
    end }
    -- the same 3,000 sandboxes
    local src = seeded(3000)
    for id, r in pairs(src.alive) do c.alive[id] = r end
    local rep = assert(run(c, { policy = recording(seen), concurrency = 4, limit = 50 }))
    assert_clean(c, expired, seen)
    assert.is_true(count(touched) > 50, "changes: " .. count(touched))
    for id in pairs(touched) do assert.is_nil(c.kill_calls[id], id .. ": changed, yet killed") end
    local n_expired = count(expired)
    assert.equal(n_expired, rep.killed)
    assert.equal(n_expired, c.killed)
    -- skipped: only what changed after its page was listed (a page is answered in
    -- the same batch as the other side's list, before GC decides it)
    for _, a in ipairs(rep.actions) do
      if a.action == "changed" or a.action == "gone" then
        assert.is_true(touched[a.sandbox_id], a.sandbox_id .. " skipped: " .. a.reason)
      end
    end
    assert.same({}, rep.errors)
    assert.is_true(count(start_expired) > n_expired)
  end)

  it("stops after `pages` and resumes both cursors from its token, killing each once", function()
    local c, expired = seeded(1000)
    local seen = {}
    local rep = assert(run(c, { pages = 4, policy = recording(seen) }))
    assert.equal(400, rep.listed)
    assert.matches("^wbgc1%.", rep.next_token)
    assert.is_true(c.asc_lists > 0 and c.desc_lists > 0)
    local rep2 = assert(run(c, { next_token = rep.next_token, policy = recording(seen), pages = 3 }))
    local rep3 = assert(run(c, { next_token = rep2.next_token, policy = recording(seen) }))
    assert.is_nil(rep3.next_token)
    assert.equal(1000, rep.listed + rep2.listed + rep3.listed)
    assert_clean(c, expired, seen, 1000)
  end)

  it("an interrupted pass resumes from its last resume_token: nothing missed or killed twice", function()
    local c, expired = seeded(1500)
    local resume, kills = nil, 0
    local ok, err = pcall(run, c, { concurrency = 16, actions = false,
      on_page = function(p) resume = p.resume_token end,
      on_action = function(a)
        if a.action == "kill" then
          kills = kills + 1
          if kills == 123 then error("interrupted!") end
        end
      end })
    assert.is_false(ok)
    assert.matches("interrupted!", err)
    assert.matches("^wbgc1%.", resume)
    local rep = assert(run(c, { next_token = resume, concurrency = 16 }))
    assert.is_nil(rep.next_token)
    assert_clean(c, expired)
  end)

  it("a listing that fails mid-pass finishes what was listed and resumes both sides", function()
    -- the third page oldest first fails (not a re-check: a token not asked before)
    local failed, asked, pages = false, {}, 0
    local c, expired = seeded(1000, { fail_list = function(fc, n, lo)
      if failed or lo.order ~= "asc" or asked[lo.next_token or ""] then return false end
      asked[lo.next_token or ""] = true
      pages = pages + 1
      failed = pages == 3
      return failed
    end })
    local rep, err, code, partial = run(c, { concurrency = 4 })
    assert.is_nil(rep)
    assert.matches("503", err)
    assert.equal("HTTP", code)
    assert.matches("^wbgc1%.", partial.next_token)
    assert.is_true(partial.killed > 0)
    rep = assert(run(c, { next_token = partial.next_token }))
    assert.equal(1000, partial.listed + rep.listed)
    assert_clean(c, expired)
  end)

  it("a dry run lists from both ends and kills nothing", function()
    local c, expired = seeded(1000)
    local seen = {}
    local rep = assert(run(c, { dry_run = true, policy = recording(seen) }))
    assert.equal(1000, rep.listed)
    assert.equal(count(expired), rep.killed) -- would kill
    assert.equal(0, c.killed)
    assert.is_true(c.asc_lists > 0)
    for id, k in pairs(seen) do assert.equal(1, k, id) end
    assert.equal(1000, count(seen))
  end)

  it("raises on a token it did not make", function()
    local c = seeded(10)
    assert.has_error(function() run(c, { next_token = "wbgc1.!!!" }) end,
      "bad argument #1 to 'run' (option 'next_token': not a valid GC resume token)")
    assert.has_error(function() run(c, { order = "asc" }) end,
      "bad argument #1 to 'run' (option 'order': \"newest\" or \"both\" expected)")
  end)
end)
