-- A create made twice whose second sandbox came too late for the listing
-- after the conversation's run (an intermediary's copy that arrived later):
-- two sandboxes of the conversation carry one create id. GC kills the one
-- the conversation does not remember, whatever the policy says of it; never
-- the remembered one, never while the conversation is busy, and keeps both
-- when it remembers neither.
local sessions = require "spec.helpers.sessions"
local lock_mod = require "warmbox.lock"
local CREATE_TAG = require("warmbox.tag").CREATE_TAG

describe("GC: a create made twice (warmboxd)", function()
  local env = sessions.new()
  local wb

  lazy_setup(function()
    env:start()
    wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60 }
  end)
  lazy_teardown(function() env:stop() end)

  local function tagged(s)
    local items = assert(wb.client:list_all{ state = { "running", "paused" }, metadata = { [s.tag] = s.tag_value } })
    local ids = {}
    for _, it in ipairs(items) do ids[it.sandbox_id] = it end
    return ids
  end

  -- A conversation with its sandbox, and a late twin of its create. → session, its sandbox, the twin's id
  local function with_twin(key)
    local s = wb:session(key)
    local id = assert(s:run("x = 41")).sandbox_id
    local it = tagged(s)[id]
    assert.is_string(it.metadata[CREATE_TAG])
    local md = {}
    for k, v in pairs(it.metadata) do md[k] = v end
    local twin = assert(wb.client:create{ template = it.template_id, metadata = md, timeout = 120 })
    return s, id, twin.sandbox_id
  end

  it("kills the twin the conversation does not remember, keeps its own", function()
    local s, id, twin = with_twin("twin:1")
    local rep = assert(wb:gc{})
    local left = tagged(s)
    assert.truthy(left[id], "the remembered sandbox was killed")
    assert.is_nil(left[twin], "the twin was not collected")
    assert.equal(1, rep.killed)
    local r = assert(s:run("x + 1"))
    assert.equal(id, r.sandbox_id)
    assert.equal("42", r.results[1].text)
  end)

  it("never while the conversation is busy (its lock held)", function()
    local s, id, twin = with_twin("twin:busy")
    local lk = lock_mod.new{ backend = "file", dir = env.lockdir }
    assert(lk:lock(s.tag_value))
    local rep = assert(wb:gc{})
    lk:unlock()
    assert.equal(0, rep.killed)
    local left = tagged(s)
    assert.truthy(left[id])
    assert.truthy(left[twin])
    assert(wb:gc{})
    assert.is_nil(tagged(s)[twin])
  end)

  it("keeps both when the conversation remembers neither", function()
    local s, id, twin = with_twin("twin:forgot")
    local lk = lock_mod.new{ backend = "file", dir = env.lockdir }
    assert(lk:lock(s.tag_value))
    assert(lk:set_state(""))
    lk:unlock()
    local rep = assert(wb:gc{})
    assert.equal(0, rep.killed)
    local left = tagged(s)
    assert.truthy(left[id])
    assert.truthy(left[twin])
  end)
end)
