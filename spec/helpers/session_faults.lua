-- What spec/integration/session/faults_*_spec.lua share (their requires and helpers).
local sessions = require "spec.helpers.sessions"
local sandbox_mod = require "warmbox.e2b.sandbox"

return {
  sessions = sessions,
  sandbox_mod = sandbox_mod,
}
