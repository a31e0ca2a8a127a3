--- Running the official E2B JS SDKs (spec/sdk/node_modules) against a
-- warmboxd: a script in spec/sdk/ does the calls and prints, as its last line,
-- `{"results": {NAME: {"ok": bool, "error": msg, "skipped": why}}}`; each
-- named check becomes one spec.
local wbd = require "spec.helpers.warmboxd"
local cjson = require("cjson.safe").new()

local M = {}

--- Why the SDK specs cannot run here (nil when they can).
function M.missing()
  local f = io.open(wbd.root() .. "/spec/sdk/node_modules/@e2b/code-interpreter/package.json", "r")
  if not f then return "spec/sdk/node_modules is not installed (scripts/setup runs npm ci)" end
  f:close()
  if os.execute("node --version >/dev/null 2>&1") ~= true then return "node is not installed" end
  return nil
end

--- Runs `script` (a file in spec/sdk/) against `srv`; returns its output and
-- the decoded results of its last line (nil when it printed none).
function M.run(srv, script, timeout_s)
  local q = wbd.sh_quote
  local cmd = table.concat({ "cd", q(wbd.root() .. "/spec/sdk"), "&&",
    "E2B_API_URL=" .. q(srv.url), "E2B_SANDBOX_URL=" .. q(srv.url), "E2B_API_KEY=" .. q(srv.api_key),
    "E2B_DOMAIN=localhost", "timeout " .. (timeout_s or 300) .. " env -u LD_PRELOAD node " .. q(script) .. " 2>&1" },
    " ")
  local p = assert(io.popen(cmd))
  local output = p:read("a")
  p:close()
  local doc = cjson.decode(output:match("([^\n]*)\n?$") or "")
  return output, doc and doc.results
end

--- A describe block in the spec file whose environment is `env` (busted's
-- describe/it/pending live there, not in modules: pass `_ENV`): starts a
-- warmboxd (`opts.server`, for wbd.start), runs `script` once, then one spec
-- per name in `checks`; `opts.must_not_fail` lists results (e.g. "create",
-- "kill") that must not be there as failures.
function M.checks(env, title, script, checks, opts)
  opts = opts or {}
  local describe, it, pending, assert = env.describe, env.it, env.pending, env.assert
  local lazy_setup, lazy_teardown = env.lazy_setup, env.lazy_teardown
  describe(title, function()
    local why = M.missing()
    if why then
      pending(why)
      return
    end
    local srv, results, output
    lazy_setup(function()
      srv = wbd.start(opts.server or {})
      output, results = M.run(srv, script, opts.timeout)
    end)
    lazy_teardown(function() if srv then srv:stop() end end)

    it("runs " .. script .. " to the end", function()
      assert.is_table(results, output)
      for _, name in ipairs(opts.must_not_fail or { "kill" }) do
        assert.is_nil(results[name], results[name] and results[name].error)
      end
    end)

    for _, name in ipairs(checks) do
      it(name, function()
        assert.is_table(results, output)
        local r = results[name]
        assert.is_table(r, "check '" .. name .. "' did not run:\n" .. output)
        if r.skipped then
          pending(r.skipped)
          return
        end
        assert.is_true(r.ok, r.error)
      end)
    end
  end)
end

return M
