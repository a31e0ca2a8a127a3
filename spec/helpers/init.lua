-- Loaded by busted before every spec file (see .busted).
if os.getenv("WARMBOX_GC_STRESS") == "1" then
  -- In 5.4 a pause <= 100 restarts a cycle at once: every allocation works the GC.
  collectgarbage("incremental", 100, 1000)
end
math.randomseed(os.time() + math.floor(os.clock() * 1e6))

-- os.tmpname() creates an empty file, and specs often use the name only as a
-- prefix or replace it with a directory. Remember every name and remove what
-- is left of it (a file, or a directory the spec emptied) when busted closes
-- the state (it exits with os.exit(code, true), which runs finalizers), so a
-- run leaves nothing in /tmp.
do
  local tmpname, remove = os.tmpname, os.remove
  local names = {}
  os.tmpname = function() -- luacheck: ignore 122 (deliberate: specs-only wrapper)
    local name = tmpname()
    names[#names + 1] = name
    return name
  end
  local sentinel = setmetatable({}, { __gc = function()
    for _, name in ipairs(names) do remove(name) end
  end })
  package.loaded["spec.helpers.tmp_sentinel"] = sentinel
end
