-- The layout rules a reader relies on: the lua/warmbox module graph has no
-- cycle, one JSON instance, one clock in csrc/core.
local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function find(dir, pattern)
  local out = {}
  local p = assert(io.popen(("find %s -name '%s' -type f | sort"):format(dir, pattern)))
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  assert(#out > 0, "nothing under " .. dir)
  return out
end

local function module_name(path)
  return (path:gsub("^lua/", ""):gsub("/init%.lua$", ""):gsub("%.lua$", ""):gsub("/", "."))
end

-- Every warmbox module each module requires (at load or later, plain or under pcall).
local function graph()
  local g = {}
  for _, path in ipairs(find("lua", "*.lua")) do
    local deps = {}
    local src = read(path):gsub("%-%-[^\n]*", "")
    for name in src:gmatch('require%s*%(?%s*["\'](warmbox[%w_.]*)["\']') do deps[name] = true end
    for name in src:gmatch('pcall%(%s*require%s*,%s*["\'](warmbox[%w_.]*)["\']') do deps[name] = true end
    g[module_name(path)] = deps
  end
  return g
end

describe("the lua/warmbox module graph", function()
  it("has no require cycle", function()
    local g = graph()
    assert.truthy(g["warmbox.session"]["warmbox.tag"], "the scan found no edges")
    local state, stack = {}, {}
    local function visit(m)
      if state[m] == "done" then return end
      if state[m] == "open" then
        local from
        for i, x in ipairs(stack) do if x == m then from = i end end
        error("require cycle: " .. table.concat(stack, " -> ", from) .. " -> " .. m, 0)
      end
      state[m] = "open"
      stack[#stack + 1] = m
      for d in pairs(g[m] or {}) do
        if d ~= "warmbox.core" then visit(d) end
      end
      stack[#stack] = nil
      state[m] = "done"
    end
    for m in pairs(g) do visit(m) end
  end)

  it("keeps the leaves leaves: util, tag, state, errors, e2b.wire, the session's decisions need no engine", function()
    local g = graph()
    local leaves = { ["warmbox.util"] = true, ["warmbox.errors"] = true, ["warmbox.json"] = true }
    for _, m in ipairs({ "warmbox.util", "warmbox.tag", "warmbox.state", "warmbox.errors", "warmbox.e2b.wire",
      "warmbox.outputs" }) do
      for d in pairs(g[m]) do
        assert.truthy(leaves[d] or d == "warmbox.core", m .. " requires " .. d)
      end
    end
    -- The session's pure decisions: cheap for the simulator, no client, no lock.
    assert.same({}, g["warmbox.session.decide"])
    assert.same({ ["warmbox.session.decide"] = true }, g["warmbox.session.retry"])
    for d in pairs(g["warmbox.sim.model"]) do
      assert.is_not.equal("warmbox.session", d, "the model must not depend on the engine it models")
    end
  end)

  it("uses one JSON instance: only warmbox.json requires cjson", function()
    for _, path in ipairs(find("lua", "*.lua")) do
      if path ~= "lua/warmbox/json.lua" then
        assert.falsy(read(path):find("require%s*%(?%s*[\"']cjson"), path .. " requires cjson")
      end
    end
  end)

  it("finds collaborators by require or by argument, never by reading package.loaded", function()
    for _, path in ipairs(find("lua", "*.lua")) do
      local code = read(path):gsub("%-%-[^\n]*", "")
      assert.falsy(code:find("package%.loaded"), path .. " reads package.loaded")
    end
  end)

  it("makes event engines in one place: warmbox.runner", function()
    for _, path in ipairs(find("lua", "*.lua")) do
      local code = read(path):gsub("%-%-[^\n]*", "")
      if path ~= "lua/warmbox/runner.lua" then
        assert.falsy(code:find("core%.engine%s*[%({]") or code:find("engine%.new%s*%("), path .. " makes an engine")
      end
    end
  end)
end)

describe("one owner per thing in lua/warmbox", function()
  it("writes the remembered state in one module: session/memo.lua", function()
    local files = find("lua/warmbox/session", "*.lua")
    for _, path in ipairs(find("lua/warmbox/gc", "*.lua")) do files[#files + 1] = path end
    for _, path in ipairs(files) do
      if path ~= "lua/warmbox/session/memo.lua" then
        local n = 0
        for line in (read(path):gsub("%-%-[^\n]*", "") .. "\n"):gmatch("([^\n]*)\n") do
          n = n + 1
          for _, pat in ipairs({ "%f[%w_]st%.[%w_]+%s*=[^=]", "%f[%w_]state%.[%w_]+%s*=[^=]",
            "%f[%w_]saved%.[%w_]+%s*=[^=]", "[:.]set_state%(", "[:.]get_state%(" }) do
            assert.falsy(line:find(pat), ("%s:%d writes or reads the remembered state itself: %s"):format(path, n,
              line))
          end
        end
      end
    end
  end)

  it("gives checkpoint.lua no Session internals but the four HACKING allows", function()
    local allowed = { _event = true, _ctx = true, _save = true, _with_lock = true }
    local code = read("lua/warmbox/session/checkpoint.lua"):gsub("%-%-[^\n]*", "")
    for name in code:gmatch("[:.](_[%a][%w_]*)") do
      assert.truthy(allowed[name], "checkpoint.lua uses the session internal " .. name)
    end
    local init = read("lua/warmbox/session/init.lua"):gsub("%-%-[^\n]*", "")
    assert.falsy(init:find("Session%._%a[%w_]*%s*="),
      "session/init.lua injects a field into Session for another module")
  end)

  it("decides where a call runs from the runner it is given: runner.running() only where none is", function()
    -- (runner.lua defines it; gc/pass.lua and session/prewarm.lua fall back on it for callers
    -- that give no runner: gc.run without `runner`, a bare session.new)
    local may = { ["lua/warmbox/runner.lua"] = true, ["lua/warmbox/gc/pass.lua"] = true,
      ["lua/warmbox/session/prewarm.lua"] = true }
    for _, path in ipairs(find("lua", "*.lua")) do
      local code = read(path):gsub("%-%-[^\n]*", "")
      if not may[path] then
        assert.falsy(code:find("runner\"?%)?%.running%(") or code:find("runner%.running%("),
          path .. " looks up the running runner")
        assert.falsy(code:find("private_runner"), path .. " keeps a runner of its own")
      end
    end
  end)
end)

describe("csrc/core", function()
  it("reads one monotonic clock and sleeps in one place: clock.c", function()
    local users = {}
    for _, path in ipairs(find("csrc/core", "*.c")) do
      local src = read(path)
      if src:find("clock_gettime%s*%(") or src:find("nanosleep%s*%(") then users[#users + 1] = path end
    end
    assert.same({ "csrc/core/clock.c" }, users)
  end)
end)


describe("csrc/warmboxd", function()
  -- Which file calls (or reads a global of) which, from the build's object
  -- files: an undefined symbol of one object that another defines.
  local function calls()
    local build = os.getenv("WARMBOX_BUILD_DIR") or "build"
    local objs = find(build .. "/CMakeFiles/warmboxd.dir/csrc/warmboxd", "*.c.o")
    local defs, undefs = {}, {}
    for _, o in ipairs(objs) do
      local file = o:match("([^/]+)%.c%.o$")
      defs[file], undefs[file] = {}, {}
      local p = assert(io.popen("nm " .. o))
      for line in p:lines() do
        local kind, sym = line:match("^%x+ (%a) (%S+)$")
        if kind and kind:match("[TDBRC]") then defs[file][sym] = true end
        local u = line:match("^%s+U (%S+)$")
        if u then undefs[file][u] = true end
      end
      p:close()
    end
    local owner = {}
    for file, syms in pairs(defs) do
      for sym in pairs(syms) do owner[sym] = file end
    end
    local g = {}
    for file, syms in pairs(undefs) do
      g[file] = {}
      for sym in pairs(syms) do
        local o = owner[sym]
        if o and o ~= file then g[file][o] = sym end
      end
    end
    return g
  end

  it("has no call cycle between its files: each layer calls only down", function()
    local g = calls()
    assert.truthy(g.main and g.main.server, "the scan found no edges")
    local state, stack = {}, {}
    local function visit(f)
      if state[f] == "done" then return end
      if state[f] == "open" then
        local from
        for i, x in ipairs(stack) do if x == f then from = i end end
        local path = {}
        for i = from, #stack do
          path[#path + 1] = stack[i] .. " (" .. g[stack[i]][stack[i + 1] or f] .. ")"
        end
        error("call cycle: " .. table.concat(path, " -> ") .. " -> " .. f, 0)
      end
      state[f] = "open"
      stack[#stack + 1] = f
      for d in pairs(g[f] or {}) do visit(d) end
      stack[#stack] = nil
      state[f] = "done"
    end
    for f in pairs(g) do visit(f) end
  end)

  -- The layer table is written once, in scripts/warmboxd_layers.lua.
  local layers = dofile("scripts/warmboxd_layers.lua")

  -- A scratch copy of csrc/warmboxd, changed by `edit` (rel path -> text to append).
  local function copy_with(edit)
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute(("mkdir -p '%s' && cp -r csrc/warmboxd/. '%s'"):format(dir, dir)))
    for rel, text in pairs(edit) do
      local f = assert(io.open(dir .. "/" .. rel, "ab"))
      f:write(text)
      f:close()
    end
    return dir
  end

  local function count_lines(path)
    local n = 0
    for _ in io.lines(path) do n = n + 1 end
    return n
  end

  it("keeps its layers: each file includes only the headers of layers its own may use", function()
    assert.same({}, layers.check("csrc/warmboxd"))
  end)

  it("reports an include of a layer a file's layer may not use, and a second header in a layer", function()
    local n = count_lines("csrc/warmboxd/jail/spawn.c")
    local dir = copy_with({
      ["jail/spawn.c"] = '#include "control.h"\n',
      ["envd/envd_fs.c"] = '#include "jail.h"\n',   -- allowed: envd uses jail
      ["jail/rt_priv.h"] = "/* a private header beside jail.h */\n",
    })
    local bad = layers.check(dir)
    os.execute(("rm -rf '%s'"):format(dir))
    assert.same({
      "jail/rt_priv.h: not a header of layer 'jail' (its own: jail.h)",
      ("jail/spawn.c:%d: includes \"control.h\": layer 'jail' may not use layer 'control'"):format(n + 1),
    }, bad)
  end)
end)
