--- `warmbox smoke`: a short self-cleaning live check of the selected
-- backend (E2B or warmboxd), warmbox.smoke's.
local _M = {}

--- The command: warmbox.smoke's status.
function _M.execute(o, args, io_)
  if args[1] then error("smoke takes no arguments", 0) end
  return require("warmbox.smoke").run(o, io_)
end

return _M
