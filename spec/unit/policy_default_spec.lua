-- The default policy reproduces the reference behaviour.
local default = require "warmbox.policy.default"

describe("warmbox.policy.default", function()
  it("keeps the list order", function()
    local c = { { sandbox_id = "b" }, { sandbox_id = "a" } }
    assert.same(c, default.order(c, {}))
  end)

  it("leases the idle window, whatever exec_timeout is (a watched run keeps its own lease)", function()
    assert.equal(300, default.lease{ exec_timeout = 600, idle_timeout = 300 })
    assert.equal(10, default.lease{ exec_timeout = 300, idle_timeout = 10 })
  end)

  describe("should_refresh", function()
    local base = { now = 1000, lease = 300, exec_timeout = 300, idle_timeout = 300, margin = 5 }
    local function ctx(t)
      local c = {}
      for k, v in pairs(base) do c[k] = v end
      for k, v in pairs(t) do c[k] = v end
      return c
    end
    it("refreshes when nothing is remembered", function()
      assert.is_true(default.should_refresh(ctx{}))
    end)
    it("refreshes when the lease may end before the run's timeout", function()
      assert.is_true(default.should_refresh(ctx{ lease_end = 1300, run_timeout = 300 }))
      assert.is_true(default.should_refresh(ctx{ lease_end = 1064, run_timeout = 60 }))
    end)
    it("refreshes when less than half the idle window is left", function()
      assert.is_true(default.should_refresh(ctx{ lease_end = 1149, run_timeout = 10 }))
    end)
    it("skips the refresh when the lease provably covers the run and the idle window", function()
      assert.is_false(default.should_refresh(ctx{ lease_end = 1290, run_timeout = 60 }))
    end)
    it("watched: skips the refresh while half the idle window is left, whatever the run's timeout", function()
      assert.is_false(default.should_refresh(ctx{ watched = true, lease_end = 1150, run_timeout = 300 }))
      assert.is_true(default.should_refresh(ctx{ watched = true, lease_end = 1149, run_timeout = 300 }))
      -- a short idle window: at least `margin` left
      assert.is_false(default.should_refresh(ctx{ watched = true, idle_timeout = 6, lease_end = 1005 }))
      assert.is_true(default.should_refresh(ctx{ watched = true, idle_timeout = 6, lease_end = 1004 }))
      assert.is_true(default.should_refresh(ctx{ watched = true }))
    end)
  end)

  it("creates tagged, auto-pausing and auto-resuming sandboxes with the lease", function()
    assert.same({
      template = "code-interpreter-v1", timeout = 600, metadata = { tag = "v" }, env_vars = { A = "1" },
      lifecycle = { on_timeout = "pause", auto_resume = true },
    }, default.create_params{ template = "code-interpreter-v1", lease = 600, tag = "tag", tag_value = "v",
      env = { A = "1" } })
  end)

  it("kills in GC only what has been inactive for longer than max_age", function()
    assert.equal("kill", default.gc({ last_activity = 0 }, { now = 86401, max_age = 86400 }))
    assert.equal("keep", default.gc({ last_activity = 1 }, { now = 86401, max_age = 86400 }))
    assert.equal("kill", default.gc({ last_activity = 0 }, { now = 86401 }))
    assert.equal("keep", default.gc({}, { now = 86401 }))
  end)
end)
