--- warmbox's private JSON instance (lua-cjson).
-- A private `cjson.safe` instance, so warmbox's settings never leak into the
-- application's `cjson`; `null` and empty arrays handled explicitly.
-- @module warmbox.json
local cjson = require "cjson.safe"
local reraise_interrupt = require("warmbox.errors").reraise_interrupt

local type, pairs, next, setmetatable, getmetatable = type, pairs, next, setmetatable, getmetatable
local tostring = tostring

local codec = cjson.new()
-- Sparse arrays are an error rather than a silent object.
codec.encode_sparse_array(false)

local _M = {}

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
-- syntax: t = json.array(t)
function _M.array(t)
  return setmetatable(t or {}, array_mt)
end

--- An empty array value (encodes as `[]`). A fresh table each call.
-- syntax: t = json.empty_array()
function _M.empty_array()
  return setmetatable({}, array_mt)
end

--- Whether `v` is JSON `null`.
-- syntax: json.is_null(x)
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
-- syntax: s = json.encode(v)
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
-- syntax: v, err = json.decode(s)
function _M.decode(s)
  if type(s) ~= "string" then return nil, "expected a string, got " .. type(s) end
  local v, err = codec.decode(s)
  if v == nil then return nil, reraise_interrupt(tostring(err)) end
  return v
end

local string_find, string_match, string_sub = string.find, string.match, string.sub
local tonumber, utf8_len, table_concat = tonumber, utf8.len, table.concat

--- Replaces every `\uD800`..`\uDFFF` escape that is not half of a valid
-- surrogate pair by `\uFFFD`. Python's `json.dumps` writes lone surrogates
-- (surrogate-escaped bytes such as `os.listdir` names that are not UTF-8) as
-- such escapes, which lua-cjson refuses; this makes the line decodable
-- without touching anything else (escaped backslashes are respected).
-- @tparam string s JSON text
-- @treturn string
-- @treturn integer how many escapes were replaced
-- syntax: s = json.repair_surrogates(s)
function _M.repair_surrogates(s)
  local out, n, pos, last, fixed = {}, 0, 1, 1, 0
  while true do
    local a, b, bs, hex = string_find(s, "(\\+)u(%x%x%x%x)", pos)
    if not a then break end
    pos = b + 1
    if #bs % 2 == 1 then
      local cp = tonumber(hex, 16)
      if cp >= 0xD800 and cp <= 0xDBFF then
        local hex2 = string_match(s, "^\\u(%x%x%x%x)", b + 1)
        local cp2 = hex2 and tonumber(hex2, 16)
        if cp2 and cp2 >= 0xDC00 and cp2 <= 0xDFFF then
          pos = b + 7 -- a valid pair: keep both halves
          cp = nil
        end
      elseif cp < 0xDC00 or cp > 0xDFFF then
        cp = nil
      end
      if cp then
        n = n + 1
        out[n] = string_sub(s, last, b - 6) .. "\\uFFFD"
        last = b + 1
        fixed = fixed + 1
      end
    end
  end
  if fixed == 0 then return s, 0 end
  out[n + 1] = string_sub(s, last)
  return table_concat(out), fixed
end

local REPLACEMENT = "\xEF\xBF\xBD"

--- `s` with every byte that is not part of valid UTF-8 (Lua's strict
-- `utf8.len`: no surrogates, nothing above U+10FFFF) replaced by U+FFFD.
-- @tparam string s
-- @treturn string
-- syntax: s = json.utf8_clean(s)
function _M.utf8_clean(s)
  if type(s) ~= "string" then return s end
  local ok, bad = utf8_len(s)
  if ok then return s end
  local out, n, from = {}, 0, 1
  while bad do
    n = n + 1
    out[n] = string_sub(s, from, bad - 1) .. REPLACEMENT
    from = bad + 1
    ok, bad = utf8_len(s, from)
    if ok then break end
  end
  out[n + 1] = string_sub(s, from)
  return table_concat(out)
end

--- Decodes one line of a stream without losing it to a bad escape: lone
-- surrogate escapes become U+FFFD (see `repair_surrogates`), then the line is
-- decoded again. Strings are not otherwise changed (see `utf8_clean`).
-- @tparam string s
-- @return[1] value
-- @treturn[1] integer how many escapes were replaced
-- @return[2] nil
-- @treturn[2] string error message
-- syntax: v, replaced = json.decode_lossless(s)
function _M.decode_lossless(s)
  local v, err = _M.decode(s)
  if v ~= nil then return v, 0 end
  if not string_find(s, "\\u[dD][89a-fA-F]") then return nil, err end
  local fixed, n = _M.repair_surrogates(s)
  if n == 0 then return nil, err end
  local err2
  v, err2 = codec.decode(fixed)
  if v == nil then
    reraise_interrupt(tostring(err2))
    return nil, err
  end
  return v, n
end

--- `v` unless it is `json.null` (then nil).
-- syntax: json.value(x) (nil for `null`)
function _M.value(v)
  if v == codec.null then return nil end
  return v
end

return _M
