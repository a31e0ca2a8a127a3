-- SDK conformance of the E2B features warmboxd adds: the official
-- @e2b/code-interpreter 2.8.0 / e2b 2.51.0 JS SDKs (spec/sdk/node_modules)
-- against warmboxd. spec/sdk/features.mjs runs every check and prints their
-- results; each becomes one spec here.
local sdk = require "spec.helpers.sdk"

local CHECKS = {
  "js: default contexts list javascript", "js: console.log to stdout", "js: esm imports",
  "js: top-level await result", "js: cwd and env vars", "js: state and errors",
  "ts: types are stripped", "js: a created context",
  "files: gzip write and read",
  "files: symlinkTarget is the resolved path",
  "commands: killing the sandbox reports it killed",
  "commands: sudo runs in the sandbox",
}

sdk.checks(_ENV, "official JS SDKs against warmboxd's E2B features", "features.mjs", CHECKS,
  { must_not_fail = { "create", "kill" } })
