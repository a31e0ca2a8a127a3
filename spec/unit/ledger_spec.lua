-- warmbox.ledger without a server: events fed by hand (as E2B's API and
-- webhooks send them), the webhook receiver's signature check and
-- duplicates, the paged sync's resumption when the retention moves offsets.
local ledger = require "warmbox.ledger"
local webhook = require "warmbox.ledger.webhook"
local fetch = require "warmbox.ledger.fetch"
local cjson = require "cjson"

local T0 = 1767225600 -- 2026-01-01T00:00:00Z

local function iso(t)
  return os.date("!%Y-%m-%dT%H:%M:%S", math.floor(t)) .. string.format(".%03dZ", math.floor((t % 1) * 1000))
end

local n = 0
local function ev(kind, sid, t, extra)
  n = n + 1
  local e = { id = ("00000000-0000-4000-8000-%012d"):format(n), version = "v2", type = "sandbox.lifecycle." .. kind,
    timestamp = iso(t), sandboxId = sid, sandboxExecutionId = sid .. (extra and extra.exec or ""),
    sandboxTemplateId = "code-interpreter-v1", eventData = { sandbox_metadata = extra and extra.md } }
  if extra and extra.ran then
    e.eventData.execution = { started_at = iso(t - extra.ran), vcpu_count = 2, memory_mb = 2048,
      execution_time = math.floor(extra.ran * 1000) }
  end
  return e
end

local RATE = 2 * 0.000014 + 2 * 0.0000045

describe("warmbox.ledger", function()
  it("prices runs at their size, per conversation, tenant and day, a window cutting them", function()
    local L = ledger.new{}
    local md = { warmboxSessionId = "wb1.0123456789abcdef.acme:c1" }
    assert.is_true(L:add_event(ev("created", "a", T0 + 86400 - 100, { md = md })))
    L:add_event(ev("paused", "a", T0 + 86400 + 100, { md = md, ran = 200 }))      -- 100 s each side of midnight
    L:add_event(ev("resumed", "a", T0 + 90000, { md = md, exec = "2" }))
    L:add_event(ev("killed", "a", T0 + 90060, { md = md, ran = 60, exec = "2" }))
    L:add_event(ev("created", "b", T0 + 90070, { md = { warmboxSessionId = "wb1.0123456789abcdef.globex:c2" } }))
    local now = T0 + 90100
    local rows, tot = L:costs{ now = now }
    assert.are.equal(2, #rows)
    assert.are.equal("acme:c1", rows[1].key)
    assert.is_true(math.abs(rows[1].running_seconds - 260) < 1e-6)
    assert.is_true(math.abs(rows[1].usd - 260 * RATE) < 1e-12)
    assert.is_true(math.abs(rows[2].running_seconds - 30) < 1e-6)   -- still running: up to now
    assert.is_true(math.abs(tot.usd - 290 * RATE) < 1e-12)
    local days = L:costs{ by = "day", now = now }
    assert.are.same({ "2026-01-01", "2026-01-02" }, { days[1].key, days[2].key })
    assert.is_true(math.abs(days[1].running_seconds - 100) < 1e-6)
    assert.is_true(math.abs(days[2].running_seconds - 190) < 1e-6)
    local t = L:costs{ by = "tenant", since = T0 + 86400, ["until"] = T0 + 90030, now = now }
    assert.are.equal("acme", t[1].key)
    assert.is_true(math.abs(t[1].running_seconds - 130) < 1e-6)
    assert.has_error(function() L:costs{ by = "week" } end)
  end)

  it("takes an event once, whichever way it came", function()
    local L = ledger.new{}
    local e = ev("created", "c", T0)
    assert.is_true(L:add_event(e))
    assert.is_false(L:add_event(cjson.decode(cjson.encode(e))))
    local k = ev("killed", "c", T0 + 10, { ran = 10 })
    assert.is_true(L:add_event(k))
    assert.is_false(L:add_event(k))
    local _, tot = L:costs{ now = T0 + 1000 }
    assert.is_true(math.abs(tot.running_seconds - 10) < 1e-6)
  end)

  it("counts checkpoints apart, at the configured storage price", function()
    local L = ledger.new{ prices = { snapshot_gib_month = 0.05 }, snapshot_gb = 10 }
    L:add_event(ev("created", "d", T0))
    L:add_event(ev("checkpointed", "d", T0 + 10))
    L:add_event(ev("killed", "d", T0 + 20, { ran = 20 }))
    local rows = L:costs{ ["until"] = T0 + 10 + 3600, now = T0 + 10 + 3600 }
    assert.are.equal(1, rows[1].checkpoints)
    assert.is_true(math.abs(rows[1].snapshot_gib_hours - 12) < 1e-9)   -- 10 GiB + 2 GiB RAM, one hour
    assert.is_true(math.abs(rows[1].snapshot_usd - 12 / 730 * 0.05) < 1e-12)
    assert.is_true(math.abs(rows[1].total_usd - rows[1].usd - rows[1].snapshot_usd) < 1e-15)
  end)

  describe("webhook receiver", function()
    local secret = "s3cret"
    it("signs as E2B documents: SHA-256 of secret + body, URL-safe base64 without padding", function()
      -- python3 -c "import hashlib,base64;print(base64.urlsafe_b64encode(hashlib.sha256(b's3cret{}').digest()))"
      assert.are.equal("MPZVqvq5xhOOOXbtZLyuLDmZs4P5OPzRrUZjJUm1ft0", webhook.signature(secret, "{}"))
    end)

    it("checks the signature and ignores duplicates", function()
      local L = ledger.new{}
      local handle = L:webhook(secret)
      local body = cjson.encode(ev("created", "e", T0))
      local sig = webhook.signature(secret, body)
      assert.are.equal(401, (handle({ ["e2b-signature"] = "nope" }, body)))
      assert.are.equal(401, (handle({}, body)))
      assert.are.equal(401, (handle({ ["E2B-Signature"] = sig }, body .. " ")))
      local st, text = handle({ ["E2B-Signature"] = sig }, body)
      assert.are.same({ 200, "ok" }, { st, text })
      st, text = handle({ ["e2b-signature"] = sig }, body)
      assert.are.same({ 200, "duplicate" }, { st, text })
      local bad = "[1]"
      assert.are.equal(400, (handle({ ["e2b-signature"] = webhook.signature(secret, bad) }, bad)))
      assert.are.equal(1, #L.raw)
    end)
  end)

  describe("the paged sync", function()
    -- E2B's list: oldest first; `drop` events lost to the retention at the old end.
    local function server(list)
      return function(_, offset, limit)
        local out = {}
        for i = offset + 1, math.min(#list, offset + limit) do out[#out + 1] = list[i] end
        return out
      end
    end

    it("resumes where it stopped, steps back when the retention moved the offsets, takes each once", function()
      local list = {}
      for i = 1, 250 do list[i] = { id = "e" .. i } end
      local state, got = {}, {}
      local function add(e) got[#got + 1] = e.id end
      assert.are.equal(250, fetch.sync(nil, state, add, server(list)))
      assert.are.equal(0, fetch.sync(nil, state, add, server(list)))
      -- 230 old events expire, 30 new ones come
      local after = {}
      for i = 231, 280 do after[#after + 1] = { id = "e" .. i } end
      assert.are.equal(30, fetch.sync(nil, state, add, server(after)))
      assert.are.equal(280, #got)
      assert.are.equal("e280", got[280])
    end)
  end)
end)
