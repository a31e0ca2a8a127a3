-- What spec/integration/warmboxd/envd_*_spec.lua share (their requires and helpers).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local envd = require "spec.helpers.envd"
local cjson = http.cjson

local RPC = { ["Connect-Protocol-Version"] = "1" }
local UNAUTHORIZED = "unauthorized access, please provide a valid access token or method signing if supported"
local b64decode, sign, urlencode = envd.b64decode, envd.sign, envd.urlencode
local envelope, envelopes = envd.envelope, envd.envelopes

return {
  wbd = wbd,
  http = http,
  envd = envd,
  cjson = cjson,
  RPC = RPC,
  UNAUTHORIZED = UNAUTHORIZED,
  b64decode = b64decode,
  sign = sign,
  urlencode = urlencode,
  envelope = envelope,
  envelopes = envelopes,
}
