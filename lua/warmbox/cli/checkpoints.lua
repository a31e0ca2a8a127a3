--- `warmbox checkpoints --session KEY`: a session's checkpoints (list, or --delete ID).
local ipairs = ipairs
local string_format = string.format

local args_ = require "warmbox.cli.args"
local common = require "warmbox.cli.common"

local parse_args, env_arg = args_.parse_args, args_.env_arg
local fail, FAILED, utc = common.fail, common.FAILED, common.utc

local _M = {}

--- The command: status 0 or 2.
function _M.execute(o, args, io_)
  local key, actor, env, as_json, delete
  local function session(v) key = v end
  parse_args(args, "checkpoints", {
    ["--session"] = session, ["-s"] = session,
    ["--actor"] = function(v) actor = v end,
    ["--env"] = function(v) env = env_arg(env, v) end,
    ["--json"] = { function() as_json = true end },
    ["--delete"] = function(v) delete = v end,
  })
  if not key then error("checkpoints needs --session KEY", 0) end
  local wb = common.new_warmbox(o, io_)
  if not wb then return FAILED end
  local list, msg, code = wb:session(key, { env = env, actor = actor }):checkpoints()
  local found
  for _, cp in ipairs(list or {}) do
    if cp.id == delete then found = cp end
  end
  local ok, dmsg, dcode = true, nil, nil
  if delete and found then ok, dmsg, dcode = wb.client:delete_snapshot(found.id) end
  wb:close()
  if not list then return fail(io_.stderr, msg, code) end
  if delete then
    if not found then return fail(io_.stderr, "no checkpoint '" .. delete .. "' in session '" .. key .. "'",
      "NOT_FOUND") end
    if ok == nil then return fail(io_.stderr, dmsg, dcode) end
    io_.stdout:write("deleted ", delete, "\n")
    return 0
  end
  if as_json then
    local json = require "warmbox.json"
    local doc = {}
    for i, cp in ipairs(list) do
      doc[i] = { id = cp.id, turn = cp.turn, label = cp.label or json.null, created_at = utc(cp.created_at) }
    end
    io_.stdout:write(#doc == 0 and "[]" or json.encode(doc), "\n")
  else
    for _, cp in ipairs(list) do
      io_.stdout:write(string_format("%-20s turn %-4d %-16s %s\n", utc(cp.created_at), cp.turn,
        cp.label or "-", cp.id))
    end
    if #list == 0 then io_.stdout:write("no checkpoints\n") end
  end
  return 0
end

return _M
