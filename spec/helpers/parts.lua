-- One spec body run as several spec files, so that the parallel runner
-- (scripts/test-parallel.lua) can balance a long file: the body (a file not
-- named *_spec.lua) wraps each of its describe blocks in `part(name, fn)`;
-- each spec file runs the body for one group of parts, with its own server
-- (the body's outer lazy_setup). Every part must be in exactly one group, so
-- none is left out of the run:
--
--   -- spec/integration/foo_net_spec.lua
--   require("spec.helpers.parts").run("spec/integration/foo.lua", "net", _ENV)
--
--   -- spec/integration/foo.lua
--   local part = ...({ net = { "network" }, rest = { "limits", "output" } })
--   describe("foo", function()
--     lazy_setup(...)
--     part("network", function() ... end)
--   end)
local M = {}

--- Runs body `path` in `env` (the spec file's _ENV: busted's describe, it,
-- assert...) for the parts of `group`.
function M.run(path, group, env)
  local chunk = assert(loadfile(path, "t", env))
  local function select(groups)
    local owner = {}
    for g, names in pairs(groups) do
      for _, n in ipairs(names) do
        assert(not owner[n], "part '" .. n .. "' is in two groups")
        owner[n] = g
      end
    end
    assert(groups[group], "no group '" .. tostring(group) .. "' in " .. path)
    return function(name, fn)
      assert(owner[name], "part '" .. name .. "' of " .. path .. " is in no group")
      if owner[name] == group then env.describe(name, fn) end
    end
  end
  return chunk(select)
end

return M
