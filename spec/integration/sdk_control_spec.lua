-- The official E2B JS SDK (e2b 2.51.0, spec/sdk/node_modules) against
-- warmboxd's control plane: spec/sdk/control.mjs does the calls and checks.
local wbd = require "spec.helpers.warmboxd"

local root = wbd.root()

local function have_node()
  local ok = os.execute("command -v node >/dev/null 2>&1")
  local f = io.open(root .. "/spec/sdk/node_modules/e2b/package.json")
  if f then f:close() end
  return ok == true and f ~= nil
end

describe("the official E2B JS SDK against warmboxd's control plane", function()
  if not have_node() then
    pending("node or spec/sdk/node_modules missing (run scripts/setup)")
    return
  end

  local srv
  lazy_setup(function() srv = wbd.start() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  it("creates, lists, pages, pauses, connects and kills as E2B does", function()
    local cmd = string.format(
      "cd %s && E2B_API_URL=%s E2B_SANDBOX_URL=%s E2B_API_KEY=%s timeout 120 node control.mjs 2>&1",
      wbd.sh_quote(root .. "/spec/sdk"), wbd.sh_quote(srv.url), wbd.sh_quote(srv.url), wbd.sh_quote(srv.api_key))
    local p = assert(io.popen(cmd))
    local out = p:read("a")
    local ok, _, code = p:close()
    assert.is_nil(out:match("FAIL[^\n]*"), out)
    assert.matches("all checks passed", out)
    assert.is_true(ok, "node exited with " .. tostring(code) .. ":\n" .. out)
    -- a sample of the checks, so a silently shortened script fails here
    for _, name in ipairs({ "list metadata \"a&b\"", "list metadata \"héllo ✓ 日本\"", "list pages with a small limit",
      "pause again returns false", "connect resumes", "kill again returns false" }) do
      assert.is_truthy(out:find("ok " .. name, 1, true), name)
    end
  end)
end)
