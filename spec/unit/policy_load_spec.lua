-- Loading, merging and calling policies.
local policy = require "warmbox.policy"

describe("warmbox.policy", function()
  describe(".merge()", function()
    it("merges a partial policy over the default without changing either", function()
      local lease = function() return 42 end
      local partial = { lease = lease }
      local p = policy.merge(partial)
      assert.equal(lease, p.lease)
      assert.equal(policy.default.order, p.order)
      assert.equal("custom", p.name)
      assert.same({ lease = lease }, partial)
      assert.are_not.equal(lease, policy.default.lease)
    end)

    it("raises on unknown fields and wrong types", function()
      assert.has_error(function() policy.merge{ shoud_refresh = function() end } end,
        "bad argument #1 to 'merge' (unknown option 'shoud_refresh')")
      assert.has_error(function() policy.merge{ lease = 42 } end,
        "bad argument #1 to 'merge' (option 'lease': function expected, got number)")
      assert.has_error(function() policy.merge{ schema = {} } end,
        "bad argument #1 to 'merge' (unknown option 'schema')")
      assert.has_error(function() policy.merge(nil) end, "bad argument #1 to 'merge' (table expected, got nil)")
    end)
  end)

  describe(".load()", function()
    it("loads source text and merges it over the default", function()
      local p = assert(policy.load("return { name = 'short', lease = function(ctx) return ctx.idle_timeout end }"))
      assert.equal("short", p.name)
      assert.equal(30, p.lease{ exec_timeout = 300, idle_timeout = 30 })
      assert.equal(policy.default.gc, p.gc)
    end)

    it("loads a file, named after it", function()
      local path = os.tmpname() .. ".lua"
      local f = assert(io.open(path, "w"))
      f:write("local M = {}\nfunction M.gc(item, ctx) return 'kill' end\nreturn M\n")
      f:close()
      local p = assert(policy.load(path))
      os.remove(path)
      assert.equal("kill", p.gc({}, {}))
      assert.equal(path:match("([^/]+)%.lua$"), p.name)
    end)

    it("runs in a restricted environment", function()
      for _, src in ipairs({ "return io.open('/etc/passwd')", "return os.execute('true')",
        "return require('os')", "return load('return 1')()", "return debug.traceback()" }) do
        local p, err, code = policy.load(src)
        assert.is_nil(p)
        assert.equal("POLICY", code)
        assert.matches("policy failed to load", err)
      end
      local p = assert(policy.load("return { lease = function() return math.max(1, 2) + #string.rep('x', 3) end }"))
      assert.equal(5, p.lease{})
    end)

    it("makes the shared tables read-only", function()
      local p, err, code = policy.load("string.rep = nil return {}")
      assert.is_nil(p)
      assert.equal("POLICY", code)
      assert.matches("read%-only table 'string'", err)
      assert.is_function(string.rep)
    end)

    it("reports what does not compile, does not return a table, or cannot be read", function()
      local p, err, code = policy.load("return {")
      assert.is_nil(p)
      assert.matches("^policy does not compile: policy:inline:", err)
      assert.equal("POLICY", code)
      p, err, code = policy.load("return 42")
      assert.is_nil(p)
      assert.equal("policy:inline must return a table, got number", err)
      assert.equal("POLICY", code)
      p, err, code = policy.load("/nonexistent/policy.lua")
      assert.is_nil(p)
      assert.matches("^cannot read policy", err)
      assert.equal("POLICY", code)
      p, err, code = policy.load("return { leese = function() end }")
      assert.is_nil(p)
      assert.equal("bad argument #1 to 'merge' (unknown option 'leese')", err)
      assert.equal("POLICY", code)
    end)
  end)

  describe(".call()", function()
    it("returns the hook's value", function()
      assert.equal(1, policy.call(policy.default, "lease", { exec_timeout = 600, idle_timeout = 1 })) -- the idle window
    end)

    it("turns a hook error into nil, msg, 'POLICY': the hook's file and line, no Lua traceback", function()
      local p = policy.merge{ name = "bad", lease = function() error("no lease today") end }
      local v, err, code = policy.call(p, "lease", {})
      assert.is_nil(v)
      assert.matches("^policy 'bad' hook 'lease' failed: .*policy_load_spec%.lua:%d+: no lease today$", err)
      assert.is_nil(err:find("stack traceback", 1, true))
      assert.equal("POLICY", code)
    end)
  end)
end)
