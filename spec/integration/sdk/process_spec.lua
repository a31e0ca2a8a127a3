-- SDK conformance of warmboxd's process RPCs: the official e2b
-- 2.51.0 JS SDK (spec/sdk/node_modules) against warmboxd. spec/sdk/process.mjs
-- runs every check and prints their results; each becomes one spec here.
local sdk = require "spec.helpers.sdk"

local CHECKS = {
  "commands: connect to a running process",
  "commands: connect streams the later output and the exit",
  "commands: connect to a missing process fails",
  "commands: sendStdin reaches the process",
  "pty: create, sendInput, exit code and env",
  "pty: resize",
  "pty: connect and reconnect",
  "pty: kill",
}

sdk.checks(_ENV, "official JS SDK against warmboxd's process RPCs", "process.mjs", CHECKS,
  { must_not_fail = { "create", "kill" } })
