-- One version: CMakeLists.txt's project() is compiled into core._VERSION;
-- the Lua modules and the rockspec must agree with it.
local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

describe("the version", function()
  local cmake_version = read("CMakeLists.txt"):match("project%(warmbox%s+VERSION%s+([%d%.]+)")

  it("is declared in CMakeLists.txt", function()
    assert.truthy(cmake_version)
    assert.truthy(cmake_version:match("^%d+%.%d+%.%d+$"))
  end)

  it("is compiled into warmbox.core", function()
    assert.equals(cmake_version, require("warmbox.core")._VERSION)
  end)

  it("matches the Lua modules that carry one", function()
    for _, name in ipairs({ "warmbox.e2b", "warmbox.json", "warmbox.errors" }) do
      assert.equals(cmake_version, require(name)._VERSION, name)
    end
  end)

  it("matches require('warmbox')", function()
    assert.equals(cmake_version, require("warmbox")._VERSION)
  end)

  it("matches the rockspec", function()
    local env = {}
    local chunk = assert(load(read("warmbox-scm-1.rockspec"), "=rockspec", "t", env))
    chunk()
    assert.equals("warmbox", env.package)
    assert.equals("scm-1", env.version)
    assert.equals("3.0", env.rockspec_format)
    assert.equals("cmake", env.build.type)
    -- released rockspecs carry the version itself
    for file in (io.popen("ls rockspecs 2>/dev/null"):read("a")):gmatch("[^\n]+") do
      local v = file:match("^warmbox%-(.-)%-%d+%.rockspec$")
      if v then assert.equals(cmake_version, v, file) end
    end
    local deps = table.concat(env.dependencies, " ")
    assert.truthy(deps:find("lua >= 5.4, < 5.5", 1, true))
    assert.truthy(deps:find("lua-cjson", 1, true))
  end)
end)
