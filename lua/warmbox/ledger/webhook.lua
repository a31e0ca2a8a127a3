--- warmbox.ledger.webhook: a receiver of E2B's lifecycle webhooks that a Lua
-- host mounts on a route of its own HTTP server: it checks `e2b-signature`
-- as E2B documents it (SHA-256 of the signature secret followed by the raw
-- body, base64 URL-safe without padding), feeds the event to a ledger, and
-- ignores an event it already has (E2B may deliver one twice, and retries a
-- delivery that was not answered 2xx).
--
--   local handle = ledger.webhook(L, secret)
--   -- in the host's handler: local status, text = handle(headers, raw_body)
-- @module warmbox.ledger.webhook
local json = require "warmbox.json"
local util = require "warmbox.util"

local type, pairs, string_char, tonumber = type, pairs, string.char, tonumber

local _M = {}

--- E2B's signature of a body.
-- @tparam string secret
-- @tparam string body the raw body
-- @treturn string
function _M.signature(secret, body)
  local hex = require("warmbox.core").sha256(secret .. body)
  local raw = hex:gsub("%x%x", function(h) return string_char(tonumber(h, 16)) end)
  return (util.b64_encode(raw):gsub("[+/=]", { ["+"] = "-", ["/"] = "_", ["="] = "" }))
end

local function header(headers, name)
  for k, v in pairs(headers or {}) do
    if type(k) == "string" and k:lower() == name then return v end
  end
  return nil
end

-- Equal strings, comparing every byte whatever differs first.
local function same(a, b)
  if type(a) ~= "string" or #a ~= #b then return false end
  local d = 0
  for i = 1, #a do d = d | (a:byte(i) ~ b:byte(i)) end
  return d == 0
end

--- A handler for a ledger.
-- @tparam warmbox.ledger.Ledger ledger
-- @tparam string secret the webhook's `signatureSecret`
-- @treturn function `handle(headers, body) -> status, text, code`: 200 "ok" (a new event),
--   200 "duplicate" (one it had), 401 (bad or missing signature: "AUTH"), 400 (not an
--   event: "BAD_REQUEST")
function _M.handler(ledger, secret)
  if type(secret) ~= "string" then error("bad argument #2 to 'webhook' (string expected)", 2) end
  return function(headers, body)
    if type(body) ~= "string" or not same(header(headers, "e2b-signature"), _M.signature(secret, body)) then
      return 401, "bad e2b-signature", "AUTH"
    end
    local e = json.decode(body)
    if type(e) ~= "table" or type(json.value(e.id)) ~= "string" or type(json.value(e.type)) ~= "string" then
      return 400, "not a lifecycle event", "BAD_REQUEST"
    end
    if ledger:add_event(e) then return 200, "ok" end
    return 200, "duplicate"
  end
end

return _M
