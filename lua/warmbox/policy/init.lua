--- Policies: plain Lua tables of functions that decide reuse order, lease
-- length, when to refresh a lease, what to create with, and what GC does.
--
--   local policy = require "warmbox.policy"
--   local p = policy.resolve{ lease = function(ctx) return 600 end }  -- merged over the default
--   local p2 = assert(policy.load("policies/cheap.lua"))              -- restricted environment
--   local v, err, code = policy.call(p, "lease", ctx)                 -- nil, msg, "POLICY" on error
--
-- @module warmbox.policy

local default = require "warmbox.policy.default"
local errors = require "warmbox.errors"
local rules = require "warmbox.policy.rules"

local type, pairs, ipairs, error, tostring, setmetatable =
  type, pairs, ipairs, error, tostring, setmetatable
local xpcall, load, io_open, string_format, traceback =
  xpcall, load, io.open, string.format, debug.traceback

local _M = { default = default, rules = rules }

-- Fields a policy may have, and whether each is a hook (function).
local FIELDS = {
  name = "string", version = "string", description = "string",
  -- the session pauses the sandbox after every run (the pause-after-every-turn flow)
  pause_after_run = "boolean",
  order = "function", lease = "function", should_refresh = "function",
  create_params = "function", gc = "function", tenant = "function",
  -- Checkpoints (warmbox.checkpoint, warmbox.gc.checkpoints): optional, no default.
  checkpoint = "function", checkpoint_gc = "function",
  -- Budgets (warmbox.session.budget, rules.budget{...}): optional, no default.
  budget = "function",
}
_M.HOOKS = { "order", "lease", "should_refresh", "create_params", "gc", "tenant" }

--- Merge a partial policy over the default (a new table; `p` is not changed).
-- @tparam table p partial policy
-- @treturn table full policy
function _M.merge(p)
  if type(p) ~= "table" then
    error("bad argument #1 to 'merge' (table expected, got " .. type(p) .. ")", 2)
  end
  errors.check_options(p, FIELDS, "merge", 1)
  local out = {}
  for k, v in pairs(default) do out[k] = v end
  for k, v in pairs(p) do out[k] = v end
  if p.name == nil then out.name = "custom" end
  return out
end

-- A read-only view of a shared table: writes raise, reads go through.
local function readonly(t, name)
  return setmetatable({}, {
    __index = t,
    __newindex = function(_, k) error("attempt to modify read-only table '" .. name .. "' (field '"
      .. tostring(k) .. "')", 2) end,
    __metatable = false,
  })
end

-- The plain allowlist of what policy code may use (dotted names).
local ALLOW = {
  "assert", "error", "ipairs", "next", "pairs", "pcall", "select", "tonumber", "tostring",
  "type", "xpcall", "rawequal", "rawlen", "setmetatable",
  "math.abs", "math.ceil", "math.floor", "math.fmod", "math.huge", "math.max", "math.maxinteger",
  "math.min", "math.mininteger", "math.modf", "math.pi", "math.sqrt", "math.exp", "math.log",
  "math.tointeger", "math.type", "math.ult",
  "string.byte", "string.char", "string.find", "string.format", "string.gmatch", "string.gsub",
  "string.len", "string.lower", "string.match", "string.rep", "string.reverse", "string.sub",
  "string.upper",
  "table.concat", "table.insert", "table.move", "table.pack", "table.remove", "table.sort",
  "table.unpack",
  "utf8.char", "utf8.charpattern", "utf8.codepoint", "utf8.codes", "utf8.len", "utf8.offset",
  "os.time", "os.date", "os.difftime", "os.clock",
}

local function sandbox_env()
  local env, libs = {}, {}
  for _, name in ipairs(ALLOW) do
    local lib, fn = name:match("^(%w+)%.(%w+)$")
    if lib then
      libs[lib] = libs[lib] or {}
      libs[lib][fn] = _G[lib][fn]
    else
      env[name] = _G[name]
    end
  end
  for lib, t in pairs(libs) do env[lib] = readonly(t, lib) end
  env.rules = readonly(rules, "rules") -- the GC policy helpers (warmbox.policy.rules)
  env._G = env
  return env
end

local function read_file(path)
  local f, err = io_open(path, "rb")
  if not f then return nil, err end
  local s = f:read("a")
  f:close()
  return s
end

--- Load a policy from a file or from source text, in a restricted environment
-- (no `io`, `os.execute`, `require`, `load`, `debug`...). The chunk must return
-- a (partial) policy table; it is merged over the default.
-- @tparam string path_or_src a path to a `.lua` file, or Lua source
-- @treturn[1] table the policy
-- @return[2] nil
-- @treturn[2] string message
-- @treturn[2] string "POLICY"
function _M.load(path_or_src)
  if type(path_or_src) ~= "string" then
    error("bad argument #1 to 'load' (string expected, got " .. type(path_or_src) .. ")", 2)
  end
  local src, name = path_or_src, "inline"
  local one_line = not path_or_src:find("\n", 1, true)
  if one_line and (path_or_src:match("%.lua$") or not path_or_src:find("return", 1, true)) then
    local s, err = read_file(path_or_src)
    if not s then return nil, "cannot read policy: " .. tostring(err), "POLICY" end
    src, name = s, path_or_src:match("([^/]+)$"):gsub("%.lua$", "")
  end
  local chunk, err = load(src, "=policy:" .. name, "t", sandbox_env())
  if not chunk then return nil, "policy does not compile: " .. err, "POLICY" end
  local ok, p = xpcall(chunk, traceback)
  if not ok then return nil, "policy failed to load: " .. tostring(p), "POLICY" end
  if type(p) ~= "table" then
    return nil, "policy:" .. name .. " must return a table, got " .. type(p), "POLICY"
  end
  local ok2, merged = pcall(_M.merge, p)
  if not ok2 then return nil, tostring(merged):gsub("^[^:]*:%d+: ", ""), "POLICY" end
  if p.name == nil then merged.name = name end
  return merged
end

--- Turn what a user passed as `policy` into a full policy.
-- @param p nil (the default), a (partial) table, or a path / source string
-- @treturn[1] table
-- @return[2] nil, message, "POLICY" (a string that does not load)
function _M.resolve(p)
  if p == nil then return default end
  if type(p) == "table" then return _M.merge(p) end
  if type(p) == "string" then return _M.load(p) end
  error("policy must be nil, a table or a path/source string, got " .. type(p), 3)
end

--- Call a hook under `xpcall`.
-- @tparam table p policy
-- @tparam string hook name
-- @return the hook's first return value, or `nil, msg, "POLICY"` when it raised
function _M.call(p, hook, ...)
  local fn = p[hook]
  if type(fn) ~= "function" then
    return nil, string_format("policy '%s' has no hook '%s'", tostring(p.name), hook), "POLICY"
  end
  local ok, v = xpcall(fn, traceback, ...)
  if not ok then
    v = errors.reraise_interrupt(v)
    -- The hook's own error (its file and line); the traceback through warmbox's frames is left out.
    local msg = tostring(v):gsub("\nstack traceback:.*$", "")
    return nil, string_format("policy '%s' hook '%s' failed: %s", tostring(p.name), hook, msg), "POLICY"
  end
  return v
end

return _M
