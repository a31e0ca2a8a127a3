-- One version: CMakeLists.txt's project() is compiled into core._VERSION;
-- warmbox._VERSION (the one literal in lua/) and the rockspec must agree with it.
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

  it("is written once in lua/: warmbox._VERSION, which must match the core's", function()
    assert.equals(cmake_version, require("warmbox")._VERSION)
    local p = assert(io.popen("find lua -name '*.lua' | sort"))
    local carriers = {}
    for path in p:lines() do
      local s = read(path)
      -- _VERSION read from another module (the core) is fine; a literal is not.
      if s:find('_VERSION%s*=%s*"') or s:find('"' .. cmake_version:gsub("%.", "%%.") .. '"') then
        carriers[#carriers + 1] = path
      end
    end
    p:close()
    assert.same({ "lua/warmbox/init.lua" }, carriers)
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
