-- SDK conformance of warmboxd's Python kernel start-up (issue 14): the official
-- @e2b/code-interpreter 2.8.0 SDK against warmboxd. spec/sdk/interp_data.mjs
-- runs every check and prints their results; each becomes one spec here.
local wbd = require "spec.helpers.warmboxd"
local cjson = require("cjson.safe").new()

local CHECKS = {
  "data: a DataFrame result has data",
  "images: a shown matplotlib figure is a png",
  "images: a PIL image shown is a png",
  "images: a PIL image saved is a png",
  "images: a PIL image as the last expression is a png",
}

local function have_node()
  local f = io.open(wbd.root() .. "/spec/sdk/node_modules/@e2b/code-interpreter/package.json", "r")
  if not f then return false, "spec/sdk/node_modules is not installed (scripts/setup runs npm ci)" end
  f:close()
  if os.execute("node --version >/dev/null 2>&1") ~= true then return false, "node is not installed" end
  return true
end

describe("official JS SDK against warmboxd's Python kernel start-up", function()
  local ok, why = have_node()
  if not ok then
    pending(why)
    return
  end

  local srv, results, output
  lazy_setup(function()
    srv = wbd.start{}
    local q = wbd.sh_quote
    local cmd = table.concat({ "cd", q(wbd.root() .. "/spec/sdk"), "&&",
      "E2B_API_URL=" .. q(srv.url), "E2B_SANDBOX_URL=" .. q(srv.url), "E2B_API_KEY=" .. q(srv.api_key),
      "E2B_DOMAIN=localhost", "timeout 300 env -u LD_PRELOAD node interp_data.mjs 2>&1" }, " ")
    local p = assert(io.popen(cmd))
    output = p:read("a")
    p:close()
    local doc = cjson.decode(output:match("([^\n]*)\n?$") or "")
    results = doc and doc.results
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("runs interp_data.mjs to the end", function()
    assert.is_table(results, output)
    assert.is_nil(results.create, results.create and results.create.error)
    assert.is_nil(results.kill, results.kill and results.kill.error)
  end)

  for _, name in ipairs(CHECKS) do
    it(name, function()
      assert.is_table(results, output)
      local r = results[name]
      assert.is_table(r, "check '" .. name .. "' did not run:\n" .. output)
      assert.is_true(r.ok, r.error)
    end)
  end
end)
