-- The official E2B JS SDK (e2b 2.51.0, spec/sdk/node_modules) against
-- warmboxd's control plane: spec/sdk/control.mjs does the calls and checks.
local wbd = require "spec.helpers.warmboxd"
local sdk = require "spec.helpers.sdk"

describe("the official E2B JS SDK against warmboxd's control plane", function()
  local why = sdk.missing()
  if why then
    pending(why)
    return
  end

  local srv
  lazy_setup(function() srv = wbd.start() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  it("creates, lists, pages, pauses, connects and kills as E2B does", function()
    local out = sdk.run(srv, "control.mjs", 120)
    assert.is_nil(out:match("FAIL[^\n]*"), out)
    assert.matches("all checks passed", out)
    -- a sample of the checks, so a silently shortened script fails here
    for _, name in ipairs({ "list metadata \"a&b\"", "list metadata \"héllo ✓ 日本\"", "list pages with a small limit",
      "pause again returns false", "connect resumes", "kill again returns false" }) do
      assert.is_truthy(out:find("ok " .. name, 1, true), name)
    end
  end)
end)
