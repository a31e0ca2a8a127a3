-- SDK conformance of the filesystem features warmboxd adds (file metadata,
-- directory watching, signed file URLs, the sandbox's whole filesystem): the official e2b 2.51.0 JS SDK
-- (spec/sdk/node_modules) against warmboxd. spec/sdk/fs_features.mjs runs
-- every check and prints their results; each becomes one spec here.
local sdk = require "spec.helpers.sdk"

local CHECKS = {
  "metadata: write, then getInfo", "metadata: octet-stream upload", "metadata: none when not given",
  "metadata: writeFiles applies it to every file", "metadata: list and rename surface it",
  "metadata: an overwrite clears it", "metadata: xattrs set in the sandbox are surfaced",
  "watch: a write in the directory", "watch: recursive", "watch: recursive after a nested folder is added",
  "watch: entry info", "watch: network mounts allowed", "watch: a missing directory is FileNotFoundError",
  "watch: a file is a SandboxError",
  "signing: download with a valid signature", "signing: download as root", "signing: an expired signature",
  "signing: upload with a valid signature", "signing: upload with an expired signature",
  "paths: upload as root lands in /root", "paths: outside /home/user and /tmp, seen by commands",
  "paths: the read-only system is refused, not written",
}

sdk.checks(_ENV, "official JS SDK against warmboxd's filesystem features", "fs_features.mjs", CHECKS,
  { must_not_fail = { "create", "kill" } })
