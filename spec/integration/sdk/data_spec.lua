-- SDK conformance of the data plane: the official e2b 2.51.0 and
-- @e2b/code-interpreter 2.8.0 JS SDKs (spec/sdk/node_modules) against
-- warmboxd, on a secure sandbox. spec/sdk/data.mjs runs every check and
-- prints their results; each becomes one spec here.
local sdk = require "spec.helpers.sdk"

local CHECKS = {
  "create", "connect secure",
  "files.write", "files.read", "files.list", "files.exists", "files.makeDir", "files.remove", "files.rename",
  "commands.run stdout", "commands.run cwd", "commands.run failing", "commands.run timeout",
  "commands.list and kill", "urls signed",
  "runCode stdout", "runCode main result", "runCode error", "runCode state survives pause and connect",
  "runCode png",
}

sdk.checks(_ENV, "official JS SDKs against warmboxd's data plane", "data.mjs", CHECKS)
