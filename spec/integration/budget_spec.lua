-- Budgets in a policy against a real warmboxd: rules.budget{...} reads what a
-- conversation and its tenant spent from the ledger (warmboxd's lifecycle
-- events) and, as the policy says, refuses a run with BUDGET, pauses the
-- sandbox at once after a run, refuses a prewarm, demotes in GC; an event
-- when a budget is near and when it is hit. The warmbox object's clock is the
-- server's, which the spec moves forward so the seconds add up.
local sessions = require "spec.helpers.sessions"
local http = require "spec.helpers.http"
local rules = require "warmbox.policy.rules"

describe("budgets (warmboxd)", function()
  local env = sessions.new()
  local srv

  lazy_setup(function() srv = env:start() end)
  lazy_teardown(function() env:stop() end)

  local function server_now() return sessions.utc(srv:admin("GET", "/clock").json.now) end

  local function new_wb(budget, events)
    return env:warmbox{ exec_timeout = 60, idle_timeout = 600, clock = server_now,
      policy = { budget = budget },
      on_event = function(name, info) if name == "budget" or name == "budget_pause" then
        events[#events + 1] = { name = name, info = info } end end }
  end

  local function state_of(id) return http.api(srv, "GET", "/sandboxes/" .. id).json.state end

  it("warns when near, then stops the conversation with BUDGET; other conversations go on", function()
    local events = {}
    -- $0.01 is about 270 s of a 2 vCPU / 2 GiB sandbox (about 330 s at 512 MiB)
    local wb = new_wb(rules.budget{ per_conversation_usd = 0.01, near = 0.5, refresh = 0 }, events)
    local s = wb:session("acme:spender")
    assert(s:run("x = 1"))
    assert.are.same({}, events)
    srv:advance(200)                         -- over half of the budget
    assert(s:run("x = 2"))
    assert.are.equal("near", events[1].info.state)
    assert.are.equal("run", events[1].info.phase)
    assert.matches("near budget: the conversation spent", events[1].info.reason)
    srv:advance(200)                         -- over it
    local r, err, code = s:run("x = 3")
    assert.is_nil(r)
    assert.are.equal("BUDGET", code)
    assert.matches("over budget: the conversation spent %$0%.0%d+ of %$0%.010000", err)
    local hit = events[#events].info
    assert.are.equal("over", hit.state)
    assert.are.equal("refuse", hit.action)
    assert.is_true(hit.spent.conversation >= 0.01)
    -- a prewarm is refused as well
    local t, perr, pcode = s:prewarm()
    assert.is_nil(t)
    assert.are.equal("BUDGET", pcode)
    assert.matches("over budget", perr)
    -- another conversation of the tenant has its own budget
    assert(wb:session("acme:other"):run("y = 1"))
  end)

  it("pauses the sandbox at once after a run, when the policy says so", function()
    local events = {}
    local wb = new_wb(rules.budget{ per_conversation_usd = 0.005, refresh = 0,
      on_over = { run = "allow", after_run = "pause" } }, events)
    local s = wb:session("globex:pauser")
    local r1 = assert(s:run("x = 1"))
    assert.are.equal("running", state_of(r1.sandbox_id))
    srv:advance(400)
    local r2 = assert(s:run("x = 2"))        -- allowed, then paused at once
    assert.are.equal("paused", state_of(r2.sandbox_id))
    assert.are.equal("budget_pause", events[#events].name)
    -- the next run resumes it, with its kernel state
    local r3 = assert(s:run("x + 1"))
    assert.are.equal("3", r3.text)
  end)

  it("caps a tenant's day, and demotes an over-budget conversation in GC", function()
    local events = {}
    local wb = new_wb(rules.budget{ per_tenant_per_day_usd = 0.004, refresh = 0,
      on_over = { run = "allow", after_run = "none", gc = "demote" } }, events)
    local a = wb:session("initech:a")
    local ra = assert(a:run("x = 1"))
    srv:advance(150)
    assert(wb:session("initech:b"):run("x = 1"))
    assert.are.equal("over", events[#events].info.state)
    assert.matches("tenant's day", events[#events].info.reason)
    local rep = assert(wb:gc{ max_age = 86400 })
    local demoted = false
    for _, act in ipairs(rep.actions or {}) do
      if act.sandbox_id == ra.sandbox_id and act.action == "demote" then demoted = true end
    end
    assert.is_true(demoted, "initech:a was not demoted")
  end)
end)
