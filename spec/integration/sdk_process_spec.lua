-- SDK conformance of warmboxd's process RPCs (issue 14): the official e2b
-- 2.51.0 JS SDK (spec/sdk/node_modules) against warmboxd. spec/sdk/process.mjs
-- runs every check and prints their results; each becomes one spec here.
local wbd = require "spec.helpers.warmboxd"
local cjson = require("cjson.safe").new()

local CHECKS = {
  "commands: connect to a running process",
  "commands: connect streams the later output and the exit",
  "commands: connect to a missing process fails",
  "commands: sendStdin reaches the process",
  "pty: create, sendInput, exit code and env",
  "pty: resize",
  "pty: connect and reconnect",
  "pty: kill",
}

local function have_node()
  local f = io.open(wbd.root() .. "/spec/sdk/node_modules/e2b/package.json", "r")
  if not f then return false, "spec/sdk/node_modules is not installed (scripts/setup runs npm ci)" end
  f:close()
  if os.execute("node --version >/dev/null 2>&1") ~= true then return false, "node is not installed" end
  return true
end

describe("official JS SDK against warmboxd's process RPCs", function()
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
      "E2B_DOMAIN=localhost", "timeout 300 env -u LD_PRELOAD node process.mjs 2>&1" }, " ")
    local p = assert(io.popen(cmd))
    output = p:read("a")
    p:close()
    local doc = cjson.decode(output:match("([^\n]*)\n?$") or "")
    results = doc and doc.results
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("runs process.mjs to the end", function()
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
