-- What spec/integration/gc/warmboxd_*_spec.lua share (their requires and helpers).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local gc = require "warmbox.gc"
local lock = require "warmbox.lock"

local TAG = "warmboxSessionId"
local tag_mod = require "warmbox.tag"
-- real warmbox tag values (orphan tags are kept by the default policy)
local T = setmetatable({}, { __index = function(t, k)
  local v = tag_mod.tag_value("ws:" .. k, {})
  rawset(t, k, v)
  return v
end })

return {
  wbd = wbd,
  http = http,
  gc = gc,
  lock = lock,
  TAG = TAG,
  tag_mod = tag_mod,
  T = T,
}
