-- spec.helpers.parts: a body run for one group describes that group's parts
-- alone, and a part left out of every group (or put in two) raises, so a
-- split file can never silently drop a describe block.
local parts = require "spec.helpers.parts"

describe("spec.helpers.parts", function()
  local function body(src)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(src)
    f:close()
    return path
  end

  -- Runs `src` for `group` with a describe that records the names it got.
  local function described(src, group)
    local seen = {}
    local env = setmetatable({ describe = function(name, fn) seen[#seen + 1] = name; fn() end }, { __index = _G })
    local path = body(src)
    local ok, err = pcall(parts.run, path, group, env)
    os.remove(path)
    return ok, ok and seen or err
  end

  local SRC = [[
    local part = (...)({ a = { "one", "two" }, b = { "three" } })
    part("one", function() end)
    part("two", function() end)
    part("three", function() end)
  ]]

  it("describes the parts of the group asked for, in order, and nothing else", function()
    assert.same({ true, { "one", "two" } }, { described(SRC, "a") })
    assert.same({ true, { "three" } }, { described(SRC, "b") })
  end)

  it("raises for a part in no group, in two groups, or a group that does not exist", function()
    local ok, err = described(SRC .. 'part("four", function() end)', "a")
    assert.is_false(ok)
    assert.matches("part 'four' of .* is in no group", err)
    ok, err = described('local part = (...)({ a = { "x" }, b = { "x" } })', "a")
    assert.is_false(ok)
    assert.matches("part 'x' is in two groups", err)
    ok, err = described(SRC, "c")
    assert.is_false(ok)
    assert.matches("no group 'c'", err)
  end)
end)
