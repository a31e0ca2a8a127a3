-- One transient 502 never destroys a conversation's kernel and files (issue
-- 26, item 2): a create the client gave up on (its answer timed out) still
-- makes a tagged, empty sandbox, newer than the one the conversation then
-- created and used. The sandbox the session remembers wins while it exists,
-- and the orphan (its create was recorded before it was sent) is recognised:
-- never chosen over a sandbox in use, collected.
local sessions = require "spec.helpers.sessions"
local wbd = require "spec.helpers.warmboxd"

describe("sessions: an orphan of a create given up (warmboxd)", function()
  local env = sessions.new()
  local srv, wb

  lazy_setup(function()
    srv = env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60, request_timeout = 1 }
  end)
  lazy_teardown(function() env:stop() end)
  before_each(function()
    srv:clear_faults()
    srv:config{ create_ms = 0 }
  end)

  local function tagged(s)
    local items = assert(wb.client:list_all{ state = { "running", "paused" }, metadata = { [s.tag] = s.tag_value } })
    local ids = {}
    for _, it in ipairs(items) do ids[it.sandbox_id] = it end
    return ids
  end

  -- A conversation whose first create timed out (the orphan comes 8 s
  -- later: after the second run and the listing that follows it, even on a
  -- loaded machine) and whose second made the sandbox it uses (x = 41 in its kernel).
  -- → the session, its sandbox, the orphan's id
  local function with_orphan(key, events)
    local s = wb:session(key)
    s.on_event = function(name, info) events[#events + 1] = { name, info } end
    srv:config{ create_ms = 8000 }
    local r, _, code = s:run("x = 0")
    assert.is_nil(r)
    assert.equal("TIMEOUT", code)
    srv:config{ create_ms = 0 }
    r = assert(s:run("x = 41"))
    local real = r.sandbox_id
    local orphan
    wbd.eventually(function()
      for id in pairs(tagged(s)) do if id ~= real then orphan = id end end
      return orphan ~= nil
    end, 30)
    return s, real, orphan
  end

  it("keeps the conversation's sandbox through a 502 on the execute and collects the orphan", function()
    local events = {}
    local s, real, orphan = with_orphan("orphan:502", events)
    -- the orphan is the newest tagged sandbox: E2B lists it first
    local listed = assert(wb.client:list_all{ state = { "running", "paused" }, metadata = { [s.tag] = s.tag_value } })
    assert.equal(orphan, listed[1].sandbox_id)
    local create_id = listed[1].metadata[require("warmbox.tag").CREATE_TAG]
    srv:fault{ route = "interp POST /execute", count = 1, status = 502 }
    local r = assert(s:run("x + 1"))
    assert.equal(real, r.sandbox_id)
    assert.is_nil(r.error)
    assert.equal("42", r.results[1] and r.results[1].text)
    local left = tagged(s)
    assert.truthy(left[real])
    assert.is_nil(left[orphan], "the orphan was not collected")
    local killed = {}
    for _, e in ipairs(events) do if e[1] == "kill" then killed[e[2].sandbox_id] = e[2].reason end end
    assert.same({ [orphan] = "orphan" }, killed)
    -- recognised by its create's id, recorded before the create was sent and dropped once collected
    assert.is_string(create_id)
    assert.is_nil(s:state().creating)
  end)

  it("never chooses the orphan over the sandbox in use when it resolves again", function()
    local events = {}
    local s, real, orphan = with_orphan("orphan:resolve", events)
    -- the same conversation seen from another E2B origin's state: resolved
    -- again by listing (what the session remembers is ignored, not the creates in flight)
    local other = wb:session("orphan:resolve")
    other.origin = "elsewhere"
    local r = assert(other:run("x + 1"))
    assert.equal(real, r.sandbox_id)
    assert.equal("42", r.results[1] and r.results[1].text)
    local left = tagged(s)
    assert.truthy(left[real])
    assert.is_nil(left[orphan])
  end)

  it("keeps the remembered sandbox through a 502 before the cell, even with a newer tagged one", function()
    local s = wb:session("orphan:upload")
    local real = assert(s:run("x = 41")).sandbox_id
    -- a newer tagged sandbox nobody recorded (another process's, its state lost)
    local other = assert(wb.client:create{ template = s.template, timeout = 60,
      metadata = { [s.tag] = s.tag_value }, lifecycle = { on_timeout = "pause", auto_resume = true } })
    srv:fault{ route = "envd POST /files", count = 1, status = 502 }
    local r = assert(s:run("x + 1", { files = { ["in.txt"] = "data" } }))
    assert.equal(real, r.sandbox_id)
    assert.equal("42", r.results[1] and r.results[1].text)
    assert.truthy(tagged(s)[real])
    wb.client:kill(other.sandbox_id)
  end)
end)
