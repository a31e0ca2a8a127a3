-- SDK conformance of the filesystem features of issue 14 (file metadata,
-- directory watching, signed file URLs): the official e2b 2.51.0 JS SDK
-- (spec/sdk/node_modules) against warmboxd. spec/sdk/fs_features.mjs runs
-- every check and prints their results; each becomes one spec here.
local wbd = require "spec.helpers.warmboxd"
local cjson = require("cjson.safe").new()

local CHECKS = {
  "metadata: write, then getInfo", "metadata: octet-stream upload", "metadata: none when not given",
  "metadata: writeFiles applies it to every file", "metadata: list and rename surface it",
  "metadata: an overwrite clears it", "metadata: xattrs set in the sandbox are surfaced",
  "watch: a write in the directory", "watch: recursive", "watch: recursive after a nested folder is added",
  "watch: entry info", "watch: network mounts allowed", "watch: a missing directory is FileNotFoundError",
  "watch: a file is a SandboxError",
  "signing: download with a valid signature", "signing: download as root", "signing: an expired signature",
  "signing: upload with a valid signature", "signing: upload with an expired signature",
}

local function have_node()
  local f = io.open(wbd.root() .. "/spec/sdk/node_modules/@e2b/code-interpreter/package.json", "r")
  if not f then return false, "spec/sdk/node_modules is not installed (scripts/setup runs npm ci)" end
  f:close()
  if os.execute("node --version >/dev/null 2>&1") ~= true then return false, "node is not installed" end
  return true
end

describe("official JS SDK against warmboxd's filesystem features", function()
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
      "E2B_DOMAIN=localhost", "timeout 300 env -u LD_PRELOAD node fs_features.mjs 2>&1" }, " ")
    local p = assert(io.popen(cmd))
    output = p:read("a")
    p:close()
    local doc = cjson.decode(output:match("([^\n]*)\n?$") or "")
    results = doc and doc.results
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("runs features.mjs to the end", function()
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
