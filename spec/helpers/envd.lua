--- Speaking envd's protocols from a spec: Connect envelopes (flag byte,
-- big-endian length, JSON), base64 as the RPCs carry bytes, and file URLs
-- signed as the SDK signs them.
local util = require "warmbox.util"
local cjson = require("cjson.safe").new()

local M = {}

--- Headers of a Connect streaming RPC (`application/connect+json`).
M.STREAM = { ["Content-Type"] = "application/connect+json", ["Connect-Protocol-Version"] = "1" }
--- The header of a unary Connect RPC (JSON body).
M.RPC = { ["Connect-Protocol-Version"] = "1" }

M.b64encode, M.b64decode = util.b64_encode, util.b64_decode

--- One envelope: `flag` (0 a message, 2 the end) and `t` (a table, or JSON text).
function M.envelope(flag, t)
  local json = type(t) == "string" and t or assert(cjson.encode(t))
  return string.pack(">I1I4", flag, #json) .. json
end

--- A stream body's envelopes, `{ flag, msg }` each (a partial last one, still
-- streaming, is left out).
function M.envelopes(body)
  local out, pos = {}, 1
  while pos + 4 <= #body do
    local flag, len = string.unpack(">I1I4", body, pos)
    if pos + 4 + len > #body then break end
    out[#out + 1] = { flag = flag, msg = cjson.decode(body:sub(pos + 5, pos + 4 + len)) }
    pos = pos + 5 + len
  end
  return out
end

--- Percent-encodes everything but RFC 3986's unreserved characters.
function M.urlencode(s)
  return (s:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

--- "v1_" .. base64-without-padding(sha256(raw)), as the SDK signs file URLs.
function M.sign(raw)
  local hex = require("warmbox.core").sha256(raw)
  local bin = hex:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end)
  return "v1_" .. (util.b64_encode(bin):gsub("=+$", ""))
end

--- The URL the SDK builds for `/files`: path, op ("read"/"write"), user (or
-- nil), the sandbox's access token, and an expiration (unix seconds, or nil).
function M.signed_url(url, path, op, user, token, exp)
  local raw = path .. ":" .. op .. ":" .. (user or "") .. ":" .. token .. (exp and (":" .. exp) or "")
  local u = url .. "/files?path=" .. M.urlencode(path)
  if user then u = u .. "&username=" .. user end
  u = u .. "&signature=" .. M.urlencode(M.sign(raw))
  if exp then u = u .. "&signature_expiration=" .. exp end
  return u
end

return M
