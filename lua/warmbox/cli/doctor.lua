--- `warmbox doctor [--embedded | --e2b]`: what the embedded server and E2B
-- need, with what to install or set (warmbox.doctor's checks).
local ipairs = ipairs
local string_format = string.format

local _M = {}

-- The Redis lock's checks, when the options (--lock redis) or the
-- environment (WARMBOX_REDIS_URL, ...) choose one: how many failed.
local function redis_checks(o, doctor, out)
  local lock = o.lock
  local env_lock = os.getenv("WARMBOX_LOCK")
  if lock ~= nil and lock ~= "redis" then return 0 end
  if lock == nil and env_lock and env_lock ~= "" and env_lock ~= "redis" then return 0 end
  local redis = require("warmbox.lock.redis_client").from_env(os.getenv)
  if not redis and (lock == "redis" or env_lock == "redis") then redis = { host = "127.0.0.1", port = 6379 } end
  if not redis then return 0 end
  out:write("\n")
  return doctor.print(out, "Redis lock:", doctor.redis(redis))
end

--- The command: status 0 or 1 (a check failed).
function _M.execute(o, args, io_)
  local which
  for _, a in ipairs(args) do
    if a == "--embedded" then which = "embedded"
    elseif a == "--e2b" then which = "e2b"
    else error("unknown argument " .. a .. " to doctor", 0) end
  end
  local doctor = require "warmbox.doctor"
  local out = io_.stdout
  local failed = 0
  local key = o.api_key or os.getenv("E2B_API_KEY")
  if key == "" then key = nil end
  -- By default: the backend the other commands would use, and the other one for information.
  local e2b_selected = key ~= nil
  if which ~= "e2b" then
    local n = doctor.print(out, "embedded server (warmboxd on this machine):", doctor.embedded{ warmboxd = o.warmboxd,
      find_bin = require("warmbox.server").find_bin, local_server = require("warmbox.server").local_server })
    if which == "embedded" or not e2b_selected then failed = failed + n end
  end
  if which ~= "embedded" then
    if which ~= "e2b" then out:write("\n") end
    local n = doctor.print(out, "E2B:", doctor.e2b{ api_key = o.api_key, api_url = o.api_url, template = o.template })
    if which == "e2b" or e2b_selected then failed = failed + n end
  end
  failed = failed + redis_checks(o, doctor, out)
  out:write(string_format("\n%s\n", failed == 0 and "ready: " .. (e2b_selected and "E2B" or "the embedded server")
    or string_format("%d check%s failed for %s", failed, failed == 1 and "" or "s",
      which or (e2b_selected and "E2B" or "the embedded server"))))
  return failed == 0 and 0 or 1
end

return _M
