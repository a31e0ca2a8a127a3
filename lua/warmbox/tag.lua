--- The session tag value: an injective key encoding plus a creation
-- fingerprint, `wb1.<fingerprint>.<encoded key>` (a leaf module).
-- @module warmbox.tag
local type, pairs, ipairs, tostring, tonumber, error, require =
  type, pairs, ipairs, tostring, tonumber, error, require
local string_format, string_byte, string_char, table_concat, table_sort =
  string.format, string.byte, string.char, table.concat, table.sort

local _M = {}

-- Bytes kept as they are in the encoded key; every other byte (including "~")
-- becomes "~XX" (upper-case hex), so the encoding is injective and the value
-- needs no escaping anywhere (metadata filters, file names, Redis keys).
local function encode_key(key)
  return (key:gsub("[^%w%-_%.:@]", function(ch) return string_format("~%02X", string_byte(ch)) end))
end
_M.encode_key = encode_key

local function decode_key(enc)
  if enc:find("~[^0-9A-F]") or enc:find("~.?$") then return nil end
  return (enc:gsub("~(%x%x)", function(h) return string_char(tonumber(h, 16)) end))
end

--- Longest encoded key kept verbatim; longer keys are replaced by "~h" + SHA-256(key).
_M.MAX_ENCODED_KEY = 256
--- The metadata key of a create's own id (see warmbox.session: a create in flight).
_M.CREATE_TAG = "warmboxCreate"
local TAG_PREFIX = "wb1."
local FP_LEN = 16

local function fp_field(s)
  s = tostring(s or "")
  return #s .. ":" .. s
end

--- The session tag value for a key: `wb1.<fingerprint>.<encoded key>`.
-- The fingerprint is an HMAC-SHA-256 (first 16 hex digits) of what is baked
-- into a sandbox at creation (template, env vars and their values, actor), so
-- a changed secret or actor gets a different sandbox and secrets never appear
-- in metadata. Keys are encoded injectively (`~XX` escapes); an encoded key
-- longer than `MAX_ENCODED_KEY` bytes is replaced by `~h<sha256>`.
-- @tparam string key the session key, any bytes
-- @tparam[opt] table opts `template`, `env`, `actor`, `secret` (HMAC key,
--   default "warmbox"), `hmac` (function(key, s) -> hex), `sha256`
-- @treturn string
function _M.tag_value(key, opts)
  if type(key) ~= "string" or key == "" then
    error("bad argument #1 to 'tag_value' (non-empty string expected, got "
      .. (key == "" and "empty string" or type(key)) .. ")", 2)
  end
  opts = opts or {}
  local core
  local hmac, sha256 = opts.hmac, opts.sha256
  if not hmac or not sha256 then
    core = require "warmbox.core"
    hmac, sha256 = hmac or core.hmac_sha256, sha256 or core.sha256
  end
  local env_names = {}
  for k in pairs(opts.env or {}) do env_names[#env_names + 1] = k end
  table_sort(env_names)
  local parts = { "v1", fp_field(opts.template), fp_field(opts.actor), fp_field(#env_names) }
  for _, k in ipairs(env_names) do
    parts[#parts + 1] = fp_field(k)
    parts[#parts + 1] = fp_field(opts.env[k])
  end
  local fp = hmac(opts.secret or "warmbox", table_concat(parts, "\n")):sub(1, FP_LEN)
  local enc = encode_key(key)
  if #enc > _M.MAX_ENCODED_KEY then enc = "~h" .. sha256(key) end
  return TAG_PREFIX .. fp .. "." .. enc
end

--- Split a tag value into its parts.
-- @tparam string v a tag value
-- @treturn[1] string the session key (nil when it was hashed)
-- @treturn[1] string the encoded key
-- @treturn[1] string the fingerprint
-- @return[2] nil when `v` is not a warmbox tag value
function _M.parse_tag(v)
  if type(v) ~= "string" then return nil end
  local fp, enc = v:match("^wb1%.(%x+)%.(.+)$")
  if not fp or #fp ~= FP_LEN then return nil end
  if enc:match("^~h%x+$") then return nil, enc, fp end
  local key = decode_key(enc)
  if not key then return nil end
  return key, enc, fp
end

--- Whether tag value `v` belongs to session key `key` (any fingerprint).
function _M.tag_matches_key(v, key)
  local _, enc = _M.parse_tag(v)
  if not enc then return false end
  local want = encode_key(key)
  if #want > _M.MAX_ENCODED_KEY then
    local core = require "warmbox.core"
    want = "~h" .. core.sha256(key)
  end
  return enc == want
end

return _M
