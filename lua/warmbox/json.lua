--- warmbox's private JSON instance (lua-cjson).
-- A private `cjson.safe` instance, so warmbox's settings never leak into the
-- application's `cjson`; `null` and empty arrays handled explicitly.
-- @module warmbox.json
local cjson = require "cjson.safe"

local type, pairs, next, setmetatable, getmetatable = type, pairs, next, setmetatable, getmetatable
local tostring = tostring

local codec = cjson.new()
-- Sparse arrays are an error rather than a silent object.
codec.encode_sparse_array(false)

local _M = { _VERSION = "0.1.0" }

--- The JSON `null` sentinel (what `decode` yields for `null`).
_M.null = codec.null

--- The metatable marking a table as a JSON array (so `{}` encodes as `[]`).
-- OpenResty's lua-cjson has one built in; the Debian package does not.
_M.array_mt = cjson.array_mt or { __name = "warmbox.json.array" }

local array_mt = _M.array_mt
local native_empty = cjson.empty_array_mt ~= nil and codec.encode(setmetatable({}, cjson.empty_array_mt)) == "[]"
  and cjson.array_mt ~= nil
local SENTINEL = "__warmbox_json_empty_array_5e1c0b__"
local QUOTED_SENTINEL = '"' .. SENTINEL .. '"'

--- Marks `t` (default a new table) as an array; returns it.
-- @tparam[opt] table t
-- @treturn table
function _M.array(t)
  return setmetatable(t or {}, array_mt)
end

--- An empty array value (encodes as `[]`). A fresh table each call.
function _M.empty_array()
  return setmetatable({}, array_mt)
end

--- Whether `v` is JSON `null`.
function _M.is_null(v)
  return v == codec.null
end

-- Copies v replacing empty marked arrays by the sentinel string; returns the
-- copy and whether any replacement happened. Tables without one are shared.
local function substitute(v, depth)
  if type(v) ~= "table" or depth > 100 then return v, false end
  if getmetatable(v) == array_mt and next(v) == nil then return SENTINEL, true end
  local out, changed = nil, false
  for k, x in pairs(v) do
    local nx, c = substitute(x, depth + 1)
    if c then
      if not out then
        out = {}
        for k2, x2 in pairs(v) do out[k2] = x2 end
      end
      out[k] = nx
      changed = true
    end
  end
  if changed then return out, true end
  return v, false
end

--- Encodes a Lua value as JSON.
-- @param v
-- @treturn[1] string
-- @return[2] nil
-- @treturn[2] string error message
function _M.encode(v)
  if native_empty then return codec.encode(v) end
  local sv, changed = substitute(v, 0)
  local s, err = codec.encode(sv)
  if not s then return nil, err end
  if changed then s = s:gsub(QUOTED_SENTINEL, "[]") end
  return s
end

--- Decodes JSON text. `null` becomes `json.null`.
-- @tparam string s
-- @return[1] value
-- @return[2] nil
-- @treturn[2] string error message
function _M.decode(s)
  if type(s) ~= "string" then return nil, "expected a string, got " .. type(s) end
  local v, err = codec.decode(s)
  if v == nil then return nil, tostring(err) end
  return v
end

--- `v` unless it is `json.null` (then nil).
function _M.value(v)
  if v == codec.null then return nil end
  return v
end

return _M
