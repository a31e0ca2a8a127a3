-- The ledger against a real warmboxd: s:cost() and wb:costs{} read
-- warmboxd's lifecycle events (E2B's API) and price each conversation's
-- running seconds at its sandboxes' size and E2B's rates, across a rewind
-- (the replaced sandbox still counts) and a branch (its own conversation,
-- linked to where it came from), per tenant and per day; the server's clock
-- is moved so the seconds are many.
local sessions = require "spec.helpers.sessions"
local http = require "spec.helpers.http"


describe("ledger (warmboxd)", function()
  local env = sessions.new()
  local srv, wb

  lazy_setup(function()
    srv = env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 300 }
  end)
  lazy_teardown(function() env:stop() end)

  local function server_now()
    return sessions.utc(srv:admin("GET", "/clock").json.now)
  end

  local function run(s, code)
    local r, err, code2 = s:run(code)
    assert(r, tostring(err) .. " " .. tostring(code2))
    return r
  end

  it("prices a conversation across a rewind and a branch, by conversation, tenant, day and sandbox", function()
    local t0 = os.time()
    local s = wb:session("acme:conv-1")
    run(s, "x = 1")
    srv:advance(100)
    local cp = assert(s:checkpoint())
    run(s, "x = 2")
    local first = s:state().sandbox_id
    assert(s:rewind(cp))
    local second = s:state().sandbox_id
    assert.are_not.equal(first, second)
    srv:advance(50)
    local b = assert(s:branch(cp, "acme:conv-1-b"))
    run(b, "x")
    srv:advance(30)
    local other = wb:session("globex:conv-9")
    run(other, "y = 1")
    srv:advance(20)
    local now = server_now()

    local c = assert(s:cost{ now = now })
    assert.are.equal("acme:conv-1", c.key)
    assert.are.equal(2, c.sandboxes)                      -- the rewound one and the one it replaced
    assert.is_true(c.checkpoints >= 1)
    -- the first sandbox ran from its create to the rewind's kill (over 100 s of moved clock),
    -- the second from the rewind to now (100 s)
    -- (plus the real seconds the spec took: the server's clock runs on)
    local real = os.time() - t0 + 2
    assert.is_true(c.running_seconds > 200 and c.running_seconds < 200 + 2 * real, tostring(c.running_seconds))
    assert.are.same({ "acme:conv-1-b" }, c.branches)

    local rows = assert(wb:costs{ by = "conversation", now = now })
    local by = {}
    for _, r in ipairs(rows) do by[r.key] = r end
    local br = by["acme:conv-1-b"]
    assert.are.equal("acme:conv-1", br.branch_of)
    assert.are.equal(1, br.sandboxes)
    assert.is_true(br.running_seconds > 50 and br.running_seconds < 50 + real, tostring(br.running_seconds))
    assert.is_true(math.abs(by["acme:conv-1"].usd_with_branches - (c.usd + br.usd + c.snapshot_usd)) < 1e-9)
    assert.is_true(by["globex:conv-9"].running_seconds >= 20)

    -- per sandbox: the conversation is the sum of its own sandboxes
    local per_sb = {}
    for _, r in ipairs(assert(wb:costs{ by = "sandbox", now = now })) do per_sb[r.key] = r end
    assert.is_true(math.abs(per_sb[first].usd + per_sb[second].usd - c.usd) < 1e-9)
    -- each at its own size, at $0.000014 per vCPU-second and $0.0000045 per GiB-second: the killed
    -- one's from its kill event's execution, the running one's from the listing
    local function rate(cpu, mb) return cpu * 0.000014 + mb / 1024 * 0.0000045 end
    local d = http.api(srv, "GET", "/sandboxes/" .. second).json
    assert.is_true(math.abs(per_sb[second].usd - per_sb[second].running_seconds * rate(d.cpuCount, d.memoryMB)) < 1e-9)
    local killed = http.api(srv, "GET", "/events/sandboxes/" .. first .. "?types=sandbox.lifecycle.killed").json[1]
    local x = killed.eventData.execution
    assert.is_true(math.abs(per_sb[first].running_seconds - x.execution_time / 1000) < 1e-6)
    assert.is_true(math.abs(per_sb[first].usd - x.execution_time / 1000 * rate(x.vcpu_count, x.memory_mb)) < 1e-9)

    -- per tenant (the key's prefix): acme's two conversations, globex's one
    local tenants, totals = assert(wb:costs{ by = "tenant", now = now })
    local tb = {}
    for _, r in ipairs(tenants) do tb[r.key] = r end
    assert.is_true(math.abs(tb.acme.usd - (c.usd + br.usd)) < 1e-9)
    assert.is_true(math.abs(tb.globex.usd - by["globex:conv-9"].usd) < 1e-9)
    assert.is_true(math.abs(totals.usd - (tb.acme.usd + tb.globex.usd)) < 1e-9)

    -- per day: the same total; a window cuts it
    local days, dtot = assert(wb:costs{ by = "day", now = now })
    assert.is_true(#days >= 1)
    assert.is_true(math.abs(dtot.usd - totals.usd) < 1e-9)
    local half = assert(wb:costs{ by = "tenant", since = now - 10, now = now })
    local hsum = 0
    for _, r in ipairs(half) do hsum = hsum + r.running_seconds end
    assert.is_true(hsum > 0 and hsum <= 4 * 10 + 1e-6, tostring(hsum))  -- at most the four sandboxes' last 10 s
  end)

  it("reads the events once however often it syncs, and resumes from where it stopped", function()
    local ledger = require "warmbox.ledger"
    -- a team of its own (the first spec's sandboxes go on pausing in the background)
    local team = { url = srv.url, api_key = require("spec.helpers.warmboxd").new_key() }
    local client = require("warmbox.e2b").new{ api_url = srv.url, sandbox_url = srv.url, api_key = team.api_key }
    local L = ledger.new{ client = client }
    assert.are.equal(0, assert(L:sync()))
    http.create(team, { templateID = "base", timeout = 600 })
    assert.are.equal(1, assert(L:sync()))
    assert.are.equal(0, assert(L:sync()))
    -- more than a page of new events
    for _ = 1, 60 do
      local sb = http.create(team, { templateID = "base", timeout = 600 })
      assert.are.equal(204, http.api(team, "DELETE", "/sandboxes/" .. sb.sandboxID).status)
    end
    assert.are.equal(120, assert(L:sync()))
    assert.are.equal(0, assert(L:sync()))
    -- a new ledger on the same state file resumes without counting anything twice
    local file = os.tmpname()
    finally(function() os.remove(file) end)
    local A = ledger.new{ client = client, state_file = file }
    assert(A:sync())
    local _, ta = A:costs{ now = server_now() }
    local B = ledger.new{ client = client, state_file = file }
    assert.are.equal(0, assert(B:sync()))
    local _, tb = B:costs{ now = server_now() }
    assert.are.equal(ta.sandboxes, tb.sandboxes)
  end)
end)
