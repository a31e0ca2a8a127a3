--- `warmbox sessions`: sessions, their sandboxes, last activity and age.
local ipairs, pcall, type, tostring = ipairs, pcall, type, tostring
local string_format = string.format

local parse_args = require("warmbox.cli.args").parse_args
local common = require "warmbox.cli.common"

local fail, FAILED, utc = common.fail, common.FAILED, common.utc

local _M = {}

local function human_age(s)
  if not s then return "-" end
  s = math.max(0, math.floor(s))
  if s >= 86400 then return string_format("%dd%02dh", s // 86400, s % 86400 // 3600) end
  if s >= 3600 then return string_format("%dh%02dm", s // 3600, s % 3600 // 60) end
  if s >= 60 then return string_format("%dm%02ds", s // 60, s % 60) end
  return string_format("%ds", s)
end

-- `warmbox sessions --json`: one array, one object per session.
local function write_sessions_json(out, rows)
  local json = require "warmbox.json"
  local null = json.null
  local doc = {}
  for k, s in ipairs(rows) do
    doc[k] = { key = s.key or null, tenant = s.tenant, tag_value = s.tag_value, sandbox_id = s.sandbox_id,
      state = s.state, started_at = s.started_at or null, end_at = s.end_at or null,
      last_activity = utc(s.last_activity) or null, age_s = s.age and math.floor(s.age) or null,
      cpu_count = s.cpu_count or null, memory_mb = s.memory_mb or null }
  end
  out:write(#doc == 0 and "[]" or json.encode(doc), "\n")
end

-- `warmbox sessions`: a table, one line per session.
local function write_sessions_table(out, rows)
  if #rows == 0 then
    out:write("no sessions\n")
    return
  end
  local line = "%-36s %-16s %-24s %-8s %-20s %s\n"
  out:write(string_format(line, "SESSION", "TENANT", "SANDBOX", "STATE", "LAST ACTIVITY", "AGE"))
  for _, s in ipairs(rows) do
    out:write(string_format(line, s.key or ("(hashed) " .. s.tag_value), tostring(s.tenant), tostring(s.sandbox_id),
      tostring(s.state), utc(s.last_activity) or "-", human_age(s.age)))
  end
end

--- The command: status 0 or 2.
function _M.execute(o, args, io_)
  local tenant, state, as_json
  parse_args(args, "sessions", {
    ["--tenant"] = function(v) tenant = v end,
    ["--state"] = function(v)
      if v ~= "running" and v ~= "paused" then error("--state must be running or paused", 0) end
      state = v
    end,
    ["--json"] = { function() as_json = true end },
  })
  local wb = common.new_warmbox(o, io_)
  if not wb then return FAILED end
  local list, msg, code = wb:sessions()
  local gc = require "warmbox.gc"
  local now = wb.clock()
  local tenant_of = type(wb.policy.tenant) == "function" and wb.policy.tenant or gc.default_tenant
  wb:close()
  if not list then return fail(io_.stderr, msg, code) end
  local rows = {}
  for _, s in ipairs(list) do
    local ok, t = pcall(tenant_of, s.key or s.tag_value)
    s.tenant = ok and type(t) == "string" and t or gc.default_tenant(s.key or s.tag_value)
    -- a running sandbox is active now (its start says nothing of its last run)
    s.last_activity = s.state == "running" and now or gc.last_activity(s)
    s.age = s.last_activity and now - s.last_activity or nil
    if (not tenant or s.tenant == tenant) and (not state or s.state == state) then rows[#rows + 1] = s end
  end
  if as_json then
    write_sessions_json(io_.stdout, rows)
  else
    write_sessions_table(io_.stdout, rows)
  end
  return 0
end

return _M
