-- Every sandbox a create may have made is found and collected: a create an
-- intermediary forwarded and then answered 503 or 429 (the client sends it
-- again: a second sandbox with the same create id), or forwarded twice and
-- answered once (the client saw one answer), or forwarded again after the
-- conversation's run (collected by GC). The conversation keeps
-- one tagged sandbox, the one it uses.
local sessions = require "spec.helpers.sessions"
local after_proxy = require "spec.helpers.after_proxy"

describe("sessions: a create answered after forwarding, or sent twice (warmboxd)", function()
  local env = sessions.new()
  local srv, proxy, wb

  lazy_setup(function()
    srv = env:start()
    proxy = after_proxy.start(srv.url)
    wb = env:warmbox{ api_url = proxy.url, exec_timeout = 60, idle_timeout = 60 }
  end)
  lazy_teardown(function()
    env:stop()
    if proxy then proxy:stop() end
  end)

  local function tagged(s)
    local items = assert(wb.client:list_all{ state = { "running", "paused" }, metadata = { [s.tag] = s.tag_value } })
    local ids = {}
    for _, it in ipairs(items) do ids[#ids + 1] = it.sandbox_id end
    return ids
  end

  for _, step in ipairs({ { mode = "after", status = 503 }, { mode = "after", status = 429 }, { mode = "twice" } }) do
    local what = step.mode == "twice" and "sent twice" or ("answered " .. step.status .. " after forwarding")
    it("a create " .. what .. ": the other sandbox is collected, the conversation keeps its own", function()
      local s = wb:session("create-after:" .. step.mode .. ":" .. tostring(step.status))
      local before = proxy:stats().creates
      proxy:plan{ create = { { mode = step.mode, status = step.status, headers = { ["Retry-After"] = "0" } } } }
      local r = assert(s:run("x = 41"))
      assert.equal(2, proxy:stats().creates - before, "the create was not made twice")
      assert.same({ r.sandbox_id }, tagged(s))
      local r2 = assert(s:run("x + 1"))
      assert.equal(r.sandbox_id, r2.sandbox_id)
      assert.equal("42", r2.results[1].text)
    end)
  end

  it("a copy of the create forwarded after the run: one GC pass collects it, the conversation keeps its own",
    function()
      local s = wb:session("create-after:late")
      local late = proxy:stats().late_done
      proxy:plan{ create = { { mode = "late", held = true } } }
      local r = assert(s:run("x = 41"))
      proxy:release()
      require("spec.helpers.warmboxd").eventually(function() return proxy:stats().late_done > late end, 60)
      assert.equal(2, #tagged(s), "the copy made no sandbox")
      assert(wb:gc{})
      assert.same({ r.sandbox_id }, tagged(s))
      local r2 = assert(s:run("x + 1"))
      assert.equal(r.sandbox_id, r2.sandbox_id)
      assert.equal("42", r2.results[1].text)
    end)
end)
