-- warmbox.gc's streaming pass against a fake E2B client that has `batch`
-- (lists with stable cursors, kills) and a counting lock: the memory bound
-- (sessions locked and kills queued at once), resumption from a page token,
-- the counts a policy sees, the kill budget and the re-check.
-- luacheck: ignore 212
local gc = require "warmbox.gc"
local fakes = require "spec.helpers.fakes"
local tag_mod = require "warmbox.tag"

local TAG = "warmboxSessionId"
local NOW = gc.parse_time("2026-11-29T12:00:00Z")
local DAY = 86400

local function iso(t) return os.date("!%Y-%m-%dT%H:%M:%S", math.floor(t)) .. "Z" end
local function wtag(key) return tag_mod.tag_value(key, { hmac = fakes.hmac, sha256 = fakes.hash }) end

-- items: in list order; the cursor is an item's position, stable under kills.
local function fake_client(items, o)
  o = o or {}
  local c = { items = items, alive = {}, killed = {}, batches = 0, max_kills_in_batch = 0, lists = 0 }
  for i, it in ipairs(items) do
    it.n = i
    c.alive[it.sandbox_id] = it
  end
  local function page(token, limit)
    c.lists = c.lists + 1
    if o.fail_list and o.fail_list(c.lists, token) then return { false, "list sandboxes: http 503", "HTTP", token } end
    local start = token and tonumber(token) or 0
    local out, last = {}, nil
    for i = start + 1, #items do
      local it = items[i]
      if c.alive[it.sandbox_id] then
        if #out == limit then return { out, token or false, tostring(last) } end
        local d = {}
        for k, v in pairs(it) do d[k] = v end
        if o.changed and o.changed[it.sandbox_id] and c.lists > 1 then d.end_at = iso(NOW - 1) end
        out[#out + 1] = d
        last = i
      end
    end
    return { out, token or false, nil }
  end
  function c:batch(ops, bo)
    c.batches = c.batches + 1
    local res, nk = {}, 0
    for i, op in ipairs(ops) do
      if op.op == "list" then
        res[i] = page(op.opts.next_token, op.opts.limit)
      else
        nk = nk + 1
        if c.alive[op.id] then
          c.alive[op.id] = nil
          c.killed[#c.killed + 1] = op.id
          res[i] = { true }
        else
          res[i] = { false }
        end
      end
    end
    if nk > c.max_kills_in_batch then c.max_kills_in_batch = nk end
    -- kills that can be in flight at once in this batch
    c.max_inflight = math.max(c.max_inflight or 0, math.min(nk, bo.concurrency))
    return res
  end
  return c
end

local counting_lock = require("spec.helpers.fakes").counting_lock

local function seed(n, o)
  o = o or {}
  local items = {}
  for i = 1, n do
    local key = string.format("t%d:conv-%d", i % (o.tenants or 10), i % (o.sessions or n))
    local old = (i % 2 == 0)
    items[i] = { sandbox_id = "sb" .. i, state = "paused", metadata = { [TAG] = wtag(key) },
      started_at = iso(NOW - (old and 31 or 1) * DAY), end_at = iso(NOW - (old and 30 or 0.5) * DAY) }
  end
  return items
end

-- These cases use one cursor, newest first (the fake's cursors are positions
-- in `items`, in whatever order the case gives them); the two-ended listing has
-- its own E2B-faithful fake below.
local function run(c, lk, o)
  o = o or {}
  o.client, o.lock, o.clock = c, lk, function() return NOW end
  if o.order == nil and not (o.next_token or ""):match("^wbgc1%.") then o.order = "newest" end
  o.max_age = o.max_age or 7 * DAY
  return gc.run(o)
end

describe("warmbox.gc streaming", function()
  it("kills what is past retention, page by page, with bounded locks and kills in flight", function()
    local c, lk = fake_client(seed(5000)), counting_lock()
    local max_queue, pages = 0, 0
    collectgarbage()
    local base, peak = collectgarbage("count"), 0
    local rep = assert(run(c, lk, { concurrency = 8, actions = false, on_page = function(p)
      pages = pages + 1
      if p.queued > max_queue then max_queue = p.queued end
      collectgarbage()
      local kb = collectgarbage("count")
      if kb > peak then peak = kb end
    end }))
    assert.equal(2500, rep.killed)
    assert.equal(2500, rep.kept)
    assert.equal(5000, rep.listed)
    assert.equal(50, rep.pages)
    assert.equal(50, pages)
    assert.same({}, rep.errors)
    assert.is_nil(rep.actions)
    assert.is_nil(rep.next_token)
    -- O(page + concurrency): a bounded number of sessions locked and kills queued; never
    -- more than `concurrency` kills in flight
    assert.is_true(lk.max <= 200, "sessions locked at once: " .. lk.max)
    assert.equal(8, c.max_inflight)
    assert.equal(32, c.max_kills_in_batch) -- a kills-only batch: 4 rounds at concurrency 8
    assert.is_true(max_queue <= 200, "queued kills: " .. max_queue)
    assert.equal(0, lk.n) -- every session unlocked at the end
    -- and the Lua heap did not grow with the 5,000 items (a list of all would be MBs)
    assert.is_true(peak - base < 1024, string.format("heap grew by %.0f KB", peak - base))
  end)

  it("pipelines: the next page's list, the re-check and the kills travel in one batch", function()
    local c, lk = fake_client(seed(1000)), counting_lock()
    assert(run(c, lk, { concurrency = 100 }))
    -- 10 pages: 10 lists + 10 re-checks + 500 kills in ~12 batches, not 520 round trips
    assert.is_true(c.batches <= 13, "batches: " .. c.batches)
    assert.equal(500, #c.killed)
  end)

  it("stops after `pages` and resumes from the report's next_token, killing each once", function()
    local c, lk = fake_client(seed(1000)), counting_lock()
    local rep = assert(run(c, lk, { pages = 3 }))
    assert.equal(300, rep.listed)
    assert.equal(150, rep.killed)
    assert.equal("300", rep.next_token)
    local rep2 = assert(run(c, lk, { next_token = rep.next_token }))
    assert.equal(700, rep2.listed)
    assert.equal(350, rep2.killed)
    assert.is_nil(rep2.next_token)
    local seen = {}
    for _, id in ipairs(c.killed) do
      assert.is_nil(seen[id], "killed twice: " .. id)
      seen[id] = true
    end
    assert.equal(500, #c.killed)
  end)

  it("a listing that fails mid-pass finishes what was listed and says where to resume", function()
    local c, lk = fake_client(seed(1000), { fail_list = function(_, token) return token == "500" end }), counting_lock()
    local rep, err, code, partial = run(c, lk)
    assert.is_nil(rep)
    assert.matches("503", err)
    assert.equal("HTTP", code)
    assert.equal(250, partial.killed) -- the 5 pages before it, fully done
    assert.equal("500", partial.next_token)
    assert.equal(0, lk.n)
    local c2 = fake_client(c.items)
    for id in pairs(c.alive) do c2.alive[id] = true end
    for _, it in ipairs(c.items) do if not c.alive[it.sandbox_id] then c2.alive[it.sandbox_id] = nil end end
    for id in pairs(c2.alive) do c2.alive[id] = c.alive[id] end
    rep = assert(run(c2, lk, { next_token = partial.next_token }))
    assert.equal(250, rep.killed)
    assert.equal(500, rep.listed)
  end)

  it("an interrupted pass resumes from the last resume_token: nothing is missed or killed twice", function()
    local c, lk = fake_client(seed(1000)), counting_lock()
    local resume, kills = nil, 0
    local ok, err = pcall(run, c, lk, { concurrency = 16, actions = false,
      on_page = function(p) resume = p.resume_token end,
      on_action = function(a)
        if a.action == "kill" then
          kills = kills + 1
          if kills == 323 then error("interrupted!") end
        end
      end })
    assert.is_false(ok)
    assert.matches("interrupted!", err)
    assert.equal(0, lk.n) -- its sessions were unlocked
    assert.is_string(resume)
    local before = #c.killed
    local rep = assert(run(c, lk, { next_token = resume, concurrency = 16 }))
    assert.equal(500, before + rep.killed)
    local seen = {}
    for _, id in ipairs(c.killed) do
      assert.is_nil(seen[id], "killed twice: " .. id)
      seen[id] = true
    end
    for _, it in ipairs(c.items) do
      if it.end_at < "2026-11-20" then assert.is_nil(c.alive[it.sandbox_id], it.sandbox_id .. " missed") end
    end
  end)

  it("gives the policy key, tenant, orphan and the counts so far; honours the tenant hook", function()
    local items = seed(300, { tenants = 3 })
    items[#items + 1] = { sandbox_id = "orphan", state = "paused", metadata = { [TAG] = "x" },
      started_at = iso(NOW - 40 * DAY), end_at = iso(NOW - 40 * DAY) }
    local c, lk = fake_client(items), counting_lock()
    local seen, last_totals = {}, -1
    local rep = assert(run(c, lk, { policy = {
      tenant = function(key) return "T-" .. key:match("^(t%d+):") end,
      gc = function(item, ctx)
        seen[#seen + 1] = { key = item.key, tenant = item.tenant, orphan = item.orphan, kept = ctx.counts.kept,
          seen = ctx.totals.seen, state = item.state, last = item.last_activity, md = item.metadata[TAG] }
        assert.is_true(ctx.totals.seen > last_totals)
        last_totals = ctx.totals.seen
        return "keep"
      end } }))
    assert.equal(301, #seen)
    assert.equal(301, rep.kept)
    assert.equal(1, rep.orphans)
    assert.matches("^t%d:conv%-%d+$", seen[1].key)
    assert.equal("T-" .. seen[1].key:match("^(t%d)"), seen[1].tenant)
    assert.equal(NOW - 0.5 * DAY, seen[1].last)
    assert.equal("paused", seen[1].state)
    -- per tenant: the 100th item of a tenant sees 99 kept before it
    local per = {}
    for _, s in ipairs(seen) do
      if s.tenant then
        assert.equal(per[s.tenant] or 0, s.kept)
        per[s.tenant] = (per[s.tenant] or 0) + 1
      end
    end
    local o = seen[301]
    assert.is_true(o.orphan)
    assert.is_nil(o.key)
    assert.is_nil(o.tenant)
  end)

  it("max_kills is a budget per pass: the rest are kept and counted", function()
    local c, lk = fake_client(seed(400)), counting_lock()
    local rep = assert(run(c, lk, { max_kills = 30, concurrency = 4 }))
    assert.equal(30, rep.killed)
    assert.equal(170, rep.budget_kept)
    assert.equal(370, rep.kept)
  end)

  it("skips a sandbox that changed between the listing and the re-check, and busy sessions", function()
    local items = seed(10, { sessions = 10 })
    local c = fake_client(items, { changed = { sb2 = true } })
    local lk = counting_lock()
    lk.busy[items[4].metadata[TAG]] = true
    local rep = assert(run(c, lk))
    assert.equal(3, rep.killed) -- sb6, sb8, sb10
    assert.equal(1, rep.skipped)
    assert.equal(1, rep.busy)
    local by = {}
    for _, a in ipairs(rep.actions) do by[a.sandbox_id] = a.action end
    assert.equal("changed", by.sb2)
    assert.equal("busy", by.sb4)
    assert.equal("kill", by.sb6)
    assert.truthy(c.alive.sb2)
    assert.truthy(c.alive.sb4)
  end)

  it("a kill that did not happen (busy) counts as kept for the caps later in the pass", function()
    local rules = require "warmbox.policy.rules"
    local items = {
      { sandbox_id = "A", state = "paused", metadata = { [TAG] = wtag("t:a") }, started_at = iso(NOW - 31 * DAY),
        end_at = iso(NOW - 30 * DAY) },
      { sandbox_id = "B", state = "paused", metadata = { [TAG] = wtag("t:b") }, started_at = iso(NOW - DAY),
        end_at = iso(NOW - 3600) },
      { sandbox_id = "C", state = "paused", metadata = { [TAG] = wtag("t:c") }, started_at = iso(NOW - DAY),
        end_at = iso(NOW - 3600) },
    }
    local c, lk = fake_client(items), counting_lock()
    lk.busy[items[1].metadata[TAG]] = true
    local rep = assert(run(c, lk, { limit = 1, policy = { gc = rules.gc{ kill_after = "7d", tenant_cap = 2 } } }))
    local by = {}
    for _, a in ipairs(rep.actions) do by[a.sandbox_id] = a.action end
    assert.equal("busy", by.A) -- still there: the tenant keeps A and B, its cap
    assert.is_nil(by.B)
    assert.equal("kill", by.C)
  end)

  it("forgets the session's remembered sandbox when it kills it", function()
    local items = seed(2, { sessions = 1 })
    local c, lk = fake_client(items), counting_lock()
    local tv = items[2].metadata[TAG]
    lk.state[tv] = '{"v":1,"sandbox_id":"sb2"}'
    assert.equal(1, assert(run(c, lk)).killed)
    assert.is_nil(lk.state[tv])
  end)

  it("raises on misuse", function()
    local c = fake_client({})
    assert.has_error(function() gc.run{ client = c, max_kills = 0 } end,
      "bad argument #1 to 'run' (option 'max_kills': a positive integer expected)")
    assert.has_error(function() gc.run{ client = c, next_token = 5 } end,
      "bad argument #1 to 'run' (option 'next_token': a string expected)")
    assert.has_error(function() gc.run{ client = c, on_page = 1 } end,
      "bad argument #1 to 'run' (option 'on_page': a function expected)")
  end)
end)
