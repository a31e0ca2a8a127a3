--- Small leaf helpers shared by warmbox's modules (no warmbox requires).
-- @module warmbox.util
local type, tonumber = type, tonumber

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

return _M
