-- Sessions on a Redis lock whose Redis fails over (one Redis standing in
-- for what a failover loses, then Sentinel and Cluster for real): the
-- fence never goes backwards from the sandbox's point of view, a holder
-- whose lock was lost learns it before it collects its outputs, and a lost
-- remembered state makes the session list again and pick the same sandbox.
local sessions = require "spec.helpers.sessions"
local redis_ha = require "spec.helpers.redis_ha"

for _, kind in ipairs(redis_ha.kinds()) do
  describe("sessions on a Redis lock that fails over (" .. kind .. ")", function()
    local env = sessions.new()
    local t

    lazy_setup(function()
      env:start()
      t = redis_ha.start(kind)
    end)
    lazy_teardown(function()
      env:stop()
      if t then t:stop() end
    end)

    local function warm(key)
      local wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60,
        lock = { backend = "redis", redis = t:opts("fo:"), timeout = 60 } }
      local s, id = env:warm(wb, key)
      return wb, s, id
    end

    it("the fence counter lost its last increments (a new primary): the next run is not refused", function()
      local key = "fo:fence-" .. kind
      local wb, s, id = warm(key)
      local code1, mark1 = env:cell_in("python")
      assert(s:run(code1))
      local lkey = s.tag_value
      local fname = t:name("fo:", "fence", lkey)
      local f = assert(tonumber(t:call(lkey, "GET", fname)))
      -- what a replica that missed the last increments holds after the failover
      assert.equal("OK", t:call(lkey, "SET", fname, f - 100))
      local code2, mark2 = env:cell_in("python")
      local r = assert(s:run(code2))
      assert.equal(id, r.sandbox_id)
      assert.equal(1, env:executions(id, mark1))
      assert.equal(1, env:executions(id, mark2))
      wb:close()
    end)

    it("a run whose lock was lost during its cell says so before it collects its outputs", function()
      local key = "fo:lost-" .. kind
      local wb, s = warm(key)
      local lkey = s.tag_value
      local lname = t:name("fo:", "lock", lkey)
      local r = assert(s:run("print('x', flush=True)\nimport time; time.sleep(0.3)\n", {
        -- the key gone as when a failover's new primary never got it
        on_stdout = function() t:call(lkey, "DEL", lname) end,
      }))
      assert.same({ "expired", "LOCK" }, r.lock_error)
      wb:close()
    end)

    it("the remembered state lost: the session lists again and picks the same sandbox", function()
      local key = "fo:state-" .. kind
      local wb, s, id = warm(key)
      local lkey = s.tag_value
      assert.equal(1, t:call(lkey, "DEL", t:name("fo:", "state", lkey)))
      local listed = env:route("GET /v2/sandboxes")
      local code, mark = env:cell_in("python")
      local r = assert(s:run(code))
      assert.equal(id, r.sandbox_id)
      assert.equal(1, env:executions(id, mark))
      assert.is_true(env:route("GET /v2/sandboxes") > listed)
      wb:close()
    end)

    if kind ~= "single" then
      it("a failover between two runs: the next run waits for the new primary and uses the same sandbox", function()
        local key = "fo:between-" .. kind
        local wb, s, id = warm(key)
        local lkey = s.tag_value
        local _, old = t:signal_primary("KILL", lkey)
        local code, mark = env:cell_in("python")
        local r = assert(s:run(code))
        assert.equal(id, r.sandbox_id)
        assert.equal(1, env:executions(id, mark))
        t:wait_primary(old, lkey)
        t:restart(old)
        wb:close()
      end)
    end
  end)
end

