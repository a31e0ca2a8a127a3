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

  local function rockspec(file)
    local env = {}
    assert(load(read(file), "=" .. file, "t", env))()
    return env
  end

  it("has a released rockspec, the scm one's twin but for its version and source tag", function()
    local file = "warmbox-" .. cmake_version .. "-1.rockspec"
    local rel, scm = rockspec(file), rockspec("warmbox-scm-1.rockspec")
    assert.equals(cmake_version .. "-1", rel.version)
    assert.equals("v" .. cmake_version, rel.source.tag)
    assert.equals(scm.source.url, rel.source.url)
    -- the same text once the version, the tag and the make line's rockspec are set aside
    local function body(f)
      return (read(f):gsub('local package_version = "[^"]*"', ""):gsub('\n  tag = [^\n]*', "")
        :gsub("make %-%-deps%-mode=none[^\n]*", "make --deps-mode=none"))
    end
    assert.equals(body("warmbox-scm-1.rockspec"), body(file))
  end)

  it("declares what an installed tree needs: the command, every C library, a test step", function()
    local env = rockspec("warmbox-scm-1.rockspec")
    assert.same({ warmbox = "bin/warmbox" }, env.build.install.bin)
    local libs = {}
    for _, d in pairs(env.external_dependencies) do libs[#libs + 1] = d.library end
    table.sort(libs)
    -- libcurl, libcrypto (warmbox.core); libmicrohttpd, jansson, zlib (warmboxd); hiredis is optional
    assert.same({ "crypto", "curl", "jansson", "microhttpd", "z" }, libs)
    assert.equals("command", env.test.type)
    assert.is_true(os.execute("test -x " .. env.test.command))
    assert.is_nil(env.test_dependencies) -- apt's busted is not in a rocks tree
    for _, f in ipairs({ "LICENSE", "CHANGELOG.md" }) do assert.truthy(io.open(f, "rb"), f) end
    assert.matches("^MIT License", read("LICENSE"))
    assert.truthy(read("CHANGELOG.md"):find("## " .. cmake_version, 1, true))
    assert.truthy(read(".gitignore"):find("/build.luarocks/", 1, true))
  end)

  it("refuses a Lua other than 5.4 with a clear message, before loading the C part", function()
    assert.is_true(os.execute("command -v lua5.3 >/dev/null"), "lua5.3 is not installed (scripts/setup installs it)")
    for _, mod in ipairs({ "warmbox", "warmbox.e2b" }) do
      -- without the sanitizer runtime CI preloads: lua5.3 is not built with it
      local p = assert(io.popen(string.format("env -u LD_PRELOAD lua5.3 -e %q -e %q 2>&1",
        "package.path = 'lua/?.lua;lua/?/init.lua;' .. package.path; package.cpath = '" .. package.cpath .. "'",
        "require '" .. mod .. "'")))
      local out = p:read("a")
      p:close()
      assert.matches("warmbox needs Lua 5.4, this is Lua 5.3", out, 1, true)
      assert.is_nil(out:find("undefined symbol", 1, true), out)
    end
  end)

  it("matches the rockspec", function()
    local env = rockspec("warmbox-scm-1.rockspec")
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
