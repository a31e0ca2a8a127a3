-- warmboxd's layers (csrc/warmboxd/<layer>/) and which layers' headers each
-- may include: the one place this is written. Files at the top of
-- csrc/warmboxd/ (main.c, routes.c: the wiring) may include every layer.
-- scripts/check-structure and spec/unit/structure_spec.lua both run check().
--
--   local layers = dofile("scripts/warmboxd_layers.lua")
--   local bad = layers.check("csrc/warmboxd")   -- {} when every include is allowed
local M = {}

-- layer -> the other layers whose header it may include (base: everyone's).
M.allowed = {
  base = {},
  server = { "base" },
  jail = { "base" },
  interp = { "base", "server", "jail" },
  state = { "base", "jail", "interp" },
  envd = { "base", "server", "jail", "state" },
  control = { "base", "server", "jail", "state" },
}

-- Every layer has one header of its own, named after it; base has two (the
-- contract between the parts, wbd.h, and the helpers, util.h).
M.headers = { base = { "wbd.h", "util.h" } }

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function list(root)
  local p = assert(io.popen("cd " .. q(root) .. " && find . -type f \\( -name '*.c' -o -name '*.h' \\) | sort"))
  local out = {}
  for line in p:lines() do out[#out + 1] = line:gsub("^%./", "") end
  p:close()
  return out
end

local function layer_of(rel)
  return rel:match("^([^/]+)/") or "."
end

-- What breaks the rules under root, one line each ({} when nothing does):
-- a file in a folder that is no layer, a layer with a header not its own,
-- an include of a header no layer has, an include of a layer not allowed.
function M.check(root)
  local files, bad = list(root), {}
  local owner = {}  -- header name -> its layer
  for _, rel in ipairs(files) do
    local layer, name = layer_of(rel), rel:match("([^/]+)$")
    if layer ~= "." and not M.allowed[layer] then
      bad[#bad + 1] = rel .. ": folder '" .. layer .. "' is not a layer (scripts/warmboxd_layers.lua)"
    elseif name:match("%.h$") then
      local own = M.headers[layer] or { layer .. ".h" }
      local ok = false
      for _, h in ipairs(own) do ok = ok or h == name end
      if not ok then
        bad[#bad + 1] = ("%s: not a header of layer '%s' (its own: %s)"):format(rel, layer, table.concat(own, ", "))
      end
      owner[name] = layer
    end
  end
  for _, rel in ipairs(files) do
    local layer = layer_of(rel)
    local may = { [layer] = true }
    for _, l in ipairs(M.allowed[layer] or {}) do may[l] = true end
    local n = 0
    for line in io.lines(root .. "/" .. rel) do
      n = n + 1
      local h = line:match('^%s*#%s*include%s*"([^"]+)"')
      if h then
        local to = owner[h:match("([^/]+)$")]
        if not to then
          bad[#bad + 1] = ("%s:%d: includes \"%s\", which no layer has"):format(rel, n, h)
        elseif layer ~= "." and not may[to] then
          bad[#bad + 1] = ("%s:%d: includes \"%s\": layer '%s' may not use layer '%s'"):format(rel, n, h, layer, to)
        end
      end
    end
  end
  return bad
end

return M
