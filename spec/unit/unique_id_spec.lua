-- Cell ids, create ids and checkpoint nonces must differ across processes
-- whatever math.random does: two processes started together without ASLR (as
-- under ASan), or a host that seeds math.random with a constant, once gave
-- four processes the same cell ids, and each refused the others' cells as
-- "given up" (spec/integration/session/serial_spec.lua under ASan).
local util = require "warmbox.util"

describe("warmbox.util.unique_id", function()
  it("differs between processes that seed math.random alike, and between calls", function()
    local cmd = "lua5.4 -e " .. util.sh_quote("package.path = " .. string.format("%q", package.path)
      .. " math.randomseed(42) local u = require('warmbox.util') print(u.unique_id(), u.unique_id())")
    local seen = {}
    for _ = 1, 4 do
      local p = assert(io.popen(cmd))
      local a, b = p:read("a"):match("^(%x+)%s+(%x+)\n$")
      p:close()
      assert.is_truthy(a, "an id in hex")
      assert.are_not.equal(a, b)
      assert.is_nil(seen[a], "the same id in two processes: " .. a)
      seen[a], seen[b] = true, true
    end
  end)
end)
