-- SDK conformance of warmboxd's Python kernel start-up: the official
-- @e2b/code-interpreter 2.8.0 SDK against warmboxd. spec/sdk/interp_data.mjs
-- runs every check and prints their results; each becomes one spec here.
local sdk = require "spec.helpers.sdk"

local CHECKS = {
  "data: a DataFrame result has data",
  "images: a shown matplotlib figure is a png",
  "images: a PIL image shown is a png",
  "images: a PIL image saved is a png",
  "images: a PIL image as the last expression is a png",
}

sdk.checks(_ENV, "official JS SDK against warmboxd's Python kernel start-up", "interp_data.mjs", CHECKS,
  { must_not_fail = { "create", "kill" } })
