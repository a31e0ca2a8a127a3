-- scripts/check-docs: a doc or a source comment that names a function, file
-- or option the tree does not have, or cites a file outside the repository,
-- fails the check; the tree as it is passes.
local function run(...)
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = "'" .. a .. "'" end
  local p = assert(io.popen("scripts/check-docs " .. table.concat(args, " ") .. " 2>&1"))
  local out = p:read("a")
  local _, _, status = p:close()
  return status, out
end

-- The missing names are built here, so this file's own code does not name
-- them (check-docs counts a name written in code as existing).
local function missing(a, b) return a .. b end

local function write(name, text)
  local path = os.tmpname() .. name
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

describe("scripts/check-docs", function()
  local made = {}
  local function temp(name, text)
    local path = write(name, text)
    made[#made + 1] = path
    return path
  end
  teardown(function()
    for _, p in ipairs(made) do os.remove(p) end
  end)

  it("passes on the tree as it is", function()
    local status, out = run()
    assert.are.equal(0, status, out)
  end)

  it("fails on a doc naming a method that does not exist", function()
    local doc = temp(".md", "Resolve with `Session:" .. missing("_never_", "arrived") .. "(detail)` first.\n")
    local status, out = run(doc)
    assert.are.equal(1, status)
    assert.matches("names function Session:" .. missing("_never_", "arrived"), out, 1, true)
  end)

  it("fails on a doc naming a function, a file or an option that does not exist", function()
    local doc = temp(".md", table.concat({
      "Call `warmbox.lock." .. missing("no_such_", "function") .. "(opts)`.",
      "See `lua/warmbox/" .. missing("no_such_", "module") .. ".lua:12`.",
      "Start it with `warmbox gc --" .. missing("no-such-", "flag") .. "`.",
      "Set `WARMBOX_" .. missing("NO_SUCH_", "VARIABLE") .. "=1`.",
    }, "\n") .. "\n")
    local status, out = run(doc)
    assert.are.equal(1, status)
    assert.matches("function warmbox.lock." .. missing("no_such_", "function"), out, 1, true)
    assert.matches("file lua/warmbox/" .. missing("no_such_", "module") .. ".lua:12", out, 1, true)
    assert.matches("option --" .. missing("no-such-", "flag"), out, 1, true)
    assert.matches("variable WARMBOX_" .. missing("NO_SUCH_", "VARIABLE"), out, 1, true)
  end)

  it("fails on a source comment citing a file outside the repository", function()
    local src = temp(".lua",
      "-- the listing order (" .. missing("e2b-api", ".md") .. ", pagination)\nlocal x = 1\nreturn x\n")
    local status, out = run(src)
    assert.are.equal(1, status)
    assert.matches("cites e2b-api.md, which is not in the repository", out, 1, true)
  end)

  it("fails on a source comment naming a removed private method outside back quotes", function()
    local src = temp(".lua",
      "-- mirrors Session:" .. missing("_acq", "uire") .. " and " .. missing("_co", "ver") .. "\nreturn {}\n")
    local status, out = run(src)
    assert.are.equal(1, status)
    assert.matches("names Session:" .. missing("_acq", "uire"), out, 1, true)
    assert.matches("names " .. missing("_co", "ver"), out, 1, true)
  end)

  it("fails on an exported function with no syntax: line, passes with one in a source comment", function()
    local name = missing("undocumented_", "export")
    local bare = temp(".lua", "local M = {}\nfunction M." .. name .. "(x) return x end\nreturn M\n")
    local status, out = run(bare)
    assert.are.equal(1, status)
    assert.matches("." .. name .. "\n", out, 1, true)
    local commented = temp(".lua", "local M = {}\n-- syntax: y = M." .. name .. "(x)\nfunction M." .. name
      .. "(x) return x end\nreturn M\n")
    status, out = run(commented)
    assert.are.equal(0, status, out)
  end)

  it("accepts names that exist: a method, a module file, a flag, a variable", function()
    local doc = temp(".md", table.concat({
      "`s:run(code)` in `lua/warmbox/session/init.lua`, `session/execute.lua:483`,",
      "`warmbox gc --dry-run`, `WARMBOX_TEST_JOBS`, `Session:_with_lock`.",
    }, "\n") .. "\n")
    local status, out = run(doc)
    assert.are.equal(0, status, out)
  end)
end)
