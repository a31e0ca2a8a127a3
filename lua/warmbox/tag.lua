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

-- ------------------------------------------------------------------
-- The installation's fingerprint secret
-- ------------------------------------------------------------------

local function nonempty(v) return v ~= nil and v ~= "" and v or nil end

--- Where the installation's secret lives: `$XDG_STATE_HOME/warmbox/secret`, else
-- `~/.local/state/warmbox/secret` (persistent: a secret that changed would give every
-- session a new fingerprint, so a new sandbox).
-- @treturn[1] string
-- @return[2] nil when neither `XDG_STATE_HOME` nor `HOME` is set
function _M.secret_path()
  local st, home = nonempty(os.getenv("XDG_STATE_HOME")), nonempty(os.getenv("HOME"))
  if not st and not home then return nil end
  local dir = st and st .. "/warmbox" or home .. "/.local/state/warmbox"
  return dir .. "/secret", dir, st or home
end

local installation = {} -- path -> secret, read once per process

-- Reads the secret under the file's lock, writing a new one when the file is
-- empty: every process of the user gets the one that was written first.
local function read_or_make(core, path)
  local fl, err, code = core.flock_open(path)
  if not fl then return nil, err, code end
  local ok, lerr = fl:lock(30)
  if not ok then
    fl:close()
    return nil, "cannot lock " .. path .. ": " .. tostring(lerr), "IO"
  end
  local s, rerr = fl:read()
  if s and not (#s >= 32 and s:match("^%x+$")) then s = nil end
  if not s and not rerr then
    s, rerr = require("warmbox.util").random_hex(32)
    if s then
      local w, werr = fl:write(s)
      if not w then s, rerr = nil, werr end
    end
  end
  fl:unlock()
  fl:close()
  if not s then return nil, "session secret " .. path .. ": " .. tostring(rerr), "IO" end
  return s
end

--- The installation's fingerprint secret (the default of `secret`): 32 random bytes
-- (hex), made once per user in `secret_path()` (mode 0600, in a directory of
-- this user that no one else may write to, created 0700), shared by every
-- process of the user, read once per process.
-- @treturn[1] string
-- @return[2] nil, msg, "IO"
function _M.installation_secret()
  local path, dir, base = _M.secret_path()
  if not path then return nil, "session secret: neither XDG_STATE_HOME nor HOME is set", "IO" end
  if installation[path] then return installation[path] end
  local core = require "warmbox.core"
  local q = require("warmbox.util").sh_quote
  if not core.private_dir(dir) and os.execute("test -d " .. q(base)) then
    -- made below an existing XDG_STATE_HOME or HOME only (never a HOME that is not there)
    os.execute("mkdir -p -m 0700 " .. q(dir) .. " 2>/dev/null")
  end
  local ok, err, code = core.private_dir(dir)
  if not ok then return nil, "session secret: " .. err, code end
  local s, serr, scode = read_or_make(core, path)
  if not s then return nil, serr, scode end
  installation[path] = s
  return s
end

--- The session tag value for a key: `wb1.<fingerprint>.<encoded key>`.
-- The fingerprint is an HMAC-SHA-256 (first 16 hex digits) of what is baked
-- into a sandbox at creation (template, env vars and their values, actor), so
-- a changed secret or actor gets a different sandbox and secrets never appear
-- in metadata. Keys are encoded injectively (`~XX` escapes); an encoded key
-- longer than `MAX_ENCODED_KEY` bytes is replaced by `~h<sha256>`.
-- @tparam string key the session key, any bytes
-- @tparam[opt] table opts `template`, `env`, `actor`, `secret` (HMAC key,
--   default `installation_secret()`; raises when that cannot be had),
--   `hmac` (function(key, s) -> hex), `sha256`
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
  local secret = opts.secret
  if not secret then
    local err
    secret, err = _M.installation_secret()
    if not secret then error(err .. " (or configure `secret`)", 2) end
  end
  local fp = hmac(secret, table_concat(parts, "\n")):sub(1, FP_LEN)
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
