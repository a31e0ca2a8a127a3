--- `warmbox release KEY`: kill every sandbox of a session, delete its checkpoints.
local tonumber = tonumber
local string_format = string.format

local common = require "warmbox.cli.common"

local fail, FAILED = common.fail, common.FAILED

local _M = {}

--- The command: status 0 or 2.
function _M.execute(o, args, io_)
  if #args ~= 1 then error("release needs exactly one KEY", 0) end
  local wb = common.new_warmbox(o, io_)
  if not wb then return FAILED end
  local n, msg, code = wb:release(args[1])
  wb:close()
  if not n then return fail(io_.stderr, msg, code) end
  local c = tonumber(msg) or 0 -- the checkpoints deleted
  io_.stdout:write(string_format("released %s: %d sandbox%s killed, %d checkpoint%s deleted\n", args[1], n,
    n == 1 and "" or "es", c, c == 1 and "" or "s"))
  return 0
end

return _M
