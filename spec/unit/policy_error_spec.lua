-- A policy hook that raises: the error string names the policy, the hook and
-- the hook's own file and line, without a traceback through warmbox's frames.
local policy = require "warmbox.policy"

describe("warmbox.policy.call's error string", function()
  it("is the hook's error, without warmbox's Lua traceback", function()
    local path = os.tmpname() .. ".lua"
    local f = assert(io.open(path, "w"))
    f:write('return { name = "mine", lease = function()\n  error("no lease today")\nend }\n')
    f:close()
    local p = assert(policy.resolve(path))
    os.remove(path)
    local v, msg, code = policy.call(p, "lease", {})
    assert.is_nil(v)
    assert.equal("POLICY", code)
    assert.matches("^policy 'mine' hook 'lease' failed: .*:2: no lease today$", msg)
    assert.is_nil(msg:find("stack traceback", 1, true))
    assert.is_nil(msg:find("warmbox/policy", 1, true))
  end)
end)
