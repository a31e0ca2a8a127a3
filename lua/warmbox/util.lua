--- Small leaf helpers shared by warmbox's modules (no warmbox requires).
-- @module warmbox.util
local type, tonumber, pairs = type, tonumber, pairs
local string_byte, string_char, table_concat = string.byte, string.char, table.concat

local _M = {}

local function days_from_civil(y, m, d)
  y = m <= 2 and y - 1 or y
  local era = (y >= 0 and y or y - 399) // 400
  local yoe = y - era * 400
  local doy = (153 * (m > 2 and m - 3 or m + 9) + 2) // 5 + d - 1
  local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
  return era * 146097 + doe - 719468
end

--- Parses an RFC 3339 date-time ("2026-11-29T11:03:50.123Z", "...+02:00")
-- into unix seconds (a float when there is a fraction). Numbers pass through.
-- @treturn number|nil
-- syntax: t = util.parse_time(rfc3339)
function _M.parse_time(s)
  if type(s) == "number" then return s end
  if type(s) ~= "string" then return nil end
  local Y, M, D, h, mi, sec, frac, tz =
    s:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)[Tt ](%d%d):(%d%d):(%d%d)(%.?%d*)(.*)$")
  if not Y then return nil end
  local off
  if tz == "Z" or tz == "z" then
    off = 0
  else
    local sign, oh, om = tz:match("^([+-])(%d%d):?(%d%d)$")
    if not sign then return nil end
    off = (tonumber(oh) * 3600 + tonumber(om) * 60) * (sign == "-" and -1 or 1)
  end
  Y, M, D = tonumber(Y), tonumber(M), tonumber(D)
  if M < 1 or M > 12 or D < 1 or D > 31 then return nil end
  local t = days_from_civil(Y, M, D) * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(sec) - off
  if frac ~= "" and frac ~= "." then t = t + tonumber("0" .. frac) end
  return t
end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local B64_DEC = {}
for i = 1, 64 do B64_DEC[string_byte(B64, i)] = i - 1 end
B64_DEC[string_byte("-")] = 62
B64_DEC[string_byte("_")] = 63

--- Standard (or URL-safe) base64 decoding; padding optional. The one base64
-- of warmbox (the output report, Process streams, Connect payloads).
-- @tparam string s
-- @treturn string|nil nil when `s` holds a byte outside the alphabet
-- syntax: bytes = util.b64_decode(s) (nil on a byte outside the alphabet)
function _M.b64_decode(s)
  s = s:gsub("[%s=]", "")
  local out, n = {}, 0
  local len = #s
  local i = 1
  while i <= len do
    local a, b, c, d = string_byte(s, i, i + 3)
    local va, vb = B64_DEC[a], B64_DEC[b]
    if va == nil or vb == nil then return nil end
    local vc, vd = c and B64_DEC[c], d and B64_DEC[d]
    if (c and vc == nil) or (d and vd == nil) then return nil end
    local v = va * 262144 + vb * 4096 + (vc or 0) * 64 + (vd or 0)
    n = n + 1
    if d then
      out[n] = string_char(v >> 16, (v >> 8) & 255, v & 255)
    elseif c then
      out[n] = string_char(v >> 16, (v >> 8) & 255)
    else
      out[n] = string_char(v >> 16)
    end
    i = i + 4
  end
  return table_concat(out)
end

--- Standard base64 encoding with padding.
-- @tparam string s
-- @treturn string
-- syntax: s = util.b64_encode(bytes)
function _M.b64_encode(s)
  return (s:gsub("..?.?", function(c)
    local a, b, cc = string_byte(c, 1, 3)
    local n = a * 65536 + (b or 0) * 256 + (cc or 0)
    local function at(i) return B64:sub(i + 1, i + 1) end
    return at(n >> 18) .. at((n >> 12) & 63) .. (b and at((n >> 6) & 63) or "=") .. (cc and at(n & 63) or "=")
  end))
end

--- A shallow copy of a table.
-- @tparam table t
-- @treturn table
--- `s` without terminal escape sequences (IPython colours its tracebacks).
-- syntax: plain = util.strip_ansi(s) (terminal escape sequences removed)
function _M.strip_ansi(s)
  return (s:gsub("\27%[[%d;?]*[ -/]*[@-~]", ""):gsub("\27%][^\7\27]*\7", ""))
end

-- syntax: t2 = util.copy(t)
function _M.copy(t)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  return out
end

--- A string quoted for the POSIX shell (one word, whatever it holds).
-- syntax: word = util.sh_quote(s) (one POSIX shell word)
function _M.sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

--- The whole of a file, or nil and the error.
-- syntax: s, err = util.read_file(path)
function _M.read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("a")
  f:close()
  return s
end

--- `n` random bytes from /dev/urandom in hex, or nil and why.
-- syntax: hex, err = util.random_hex(n) (n bytes from /dev/urandom: the installation secret, the local
--   server's key)
function _M.random_hex(n)
  local f, err = io.open("/dev/urandom", "rb")
  if not f then return nil, "cannot read /dev/urandom: " .. tostring(err) end
  local b = f:read(n)
  f:close()
  if not b or #b ~= n then return nil, "short read from /dev/urandom" end
  return (b:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

-- A per-process prefix of 64 random bits (random_hex, read once; else the
-- clock, the address of a fresh table and os.clock), then a count.
local id_prefix, id_count = nil, 0

--- An id unique across processes and hosts, in hex (cell ids, create ids,
-- checkpoint nonces): never from math.random, which a host may seed with a
-- constant and which processes started together (no ASLR) seed alike.
-- syntax: id = util.unique_id() (hex, unique across processes: a per-process prefix from /dev/urandom and a
--   count; cell, create and checkpoint ids, never from `math.random`)
function _M.unique_id()
  if not id_prefix then
    id_prefix = _M.random_hex(8) or string.format("%08x%08x", os.time() % 0x100000000,
      (tonumber(tostring({}):match("0x(%x+)"), 16) or 0) % 0x100000000 ~ math.floor(os.clock() * 1e6))
  end
  id_count = id_count + 1
  return string.format("%s%x", id_prefix, id_count)
end

return _M
