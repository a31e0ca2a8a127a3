--- Small leaf helpers shared by warmbox's modules (no warmbox requires).
-- @module warmbox.util
local type, tonumber = type, tonumber
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
for i = 1, 64 do B64_DEC[B64:sub(i, i)] = i - 1 end

--- Standard base64 (RFC 4648, with padding).
-- @tparam string s
-- @treturn string
local function b64_encode(s)
  local out, n = {}, 0
  for i = 1, #s, 3 do
    local a, b, c = string_byte(s, i, i + 2)
    local v = a * 65536 + (b or 0) * 256 + (c or 0)
    local c1, c2 = (v >> 18) & 63, (v >> 12) & 63
    local c3, c4 = (v >> 6) & 63, v & 63
    n = n + 1
    out[n] = B64:sub(c1 + 1, c1 + 1) .. B64:sub(c2 + 1, c2 + 1)
      .. (b and B64:sub(c3 + 1, c3 + 1) or "=") .. (c and B64:sub(c4 + 1, c4 + 1) or "=")
  end
  return table_concat(out)
end
_M.b64_encode = b64_encode

--- Decodes base64, skipping characters outside the alphabet.
-- @tparam string s
-- @treturn string
local function b64_decode(s)
  s = s:gsub("[^%w%+/]", "")
  local out, n = {}, 0
  for i = 1, #s, 4 do
    local a, b = B64_DEC[s:sub(i, i)], B64_DEC[s:sub(i + 1, i + 1)]
    local c, d = B64_DEC[s:sub(i + 2, i + 2)], B64_DEC[s:sub(i + 3, i + 3)]
    if not (a and b) then break end
    local v = (a << 18) | (b << 12) | ((c or 0) << 6) | (d or 0)
    n = n + 1
    if d then
      out[n] = string_char((v >> 16) & 255, (v >> 8) & 255, v & 255)
    elseif c then
      out[n] = string_char((v >> 16) & 255, (v >> 8) & 255)
    else
      out[n] = string_char((v >> 16) & 255)
    end
  end
  return table_concat(out)
end
_M.b64_decode = b64_decode

return _M
