--- Shared error helpers: `nil, message, CODE, detail`.
-- Runtime failures return `nil, message, code` (plus a detail table where
-- useful); misuse raises. Codes are stable upper-case tokens.
-- @module warmbox.errors
local type, tostring, setmetatable, error = type, tostring, setmetatable, error
local pairs, ipairs, table_concat, table_sort = pairs, ipairs, table.concat, table.sort

local _M = { _VERSION = "0.1.0" }

--- The codes returned across warmbox.
_M.codes = {
  AUTH = "AUTH", NOT_FOUND = "NOT_FOUND", CONFLICT = "CONFLICT", RATE_LIMITED = "RATE_LIMITED",
  BAD_REQUEST = "BAD_REQUEST", SANDBOX_GONE = "SANDBOX_GONE", TIMEOUT = "TIMEOUT",
  TRANSPORT = "TRANSPORT", ABORTED = "ABORTED", HTTP = "HTTP", STREAM_BROKEN = "STREAM_BROKEN",
  POLICY = "POLICY", BUSY = "BUSY",
}

--- Builds a failure: returns `nil, msg, code, detail`.
-- @tparam string msg human-readable, lower case
-- @tparam string code a stable upper-case token
-- @tparam[opt] table detail e.g. `{ status = 404, message = "..." }`
function _M.new(msg, code, detail)
  return nil, msg, code, detail
end

--- The code for an HTTP status.
-- @tparam integer status
-- @tparam[opt] boolean data_plane a 502 from the sandbox proxy means SANDBOX_GONE
-- @treturn string
function _M.code_for_status(status, data_plane)
  if status == 401 or status == 403 then return "AUTH" end
  if status == 404 then return "NOT_FOUND" end
  if status == 409 then return "CONFLICT" end
  if status == 429 then return "RATE_LIMITED" end
  if status == 400 or status == 422 then return "BAD_REQUEST" end
  if status == 502 and data_plane then return "SANDBOX_GONE" end
  return "HTTP"
end

--- Raises a misuse error at the caller's caller (`error(msg, level)`).
function _M.raise(msg, level)
  error(msg, (level or 1) + 1)
end

--- Raises `bad argument #n to 'fname' (msg)` at the caller's caller unless `cond`.
function _M.argcheck(cond, n, fname, msg)
  if not cond then error(("bad argument #%d to '%s' (%s)"):format(n, fname, msg), 3) end
end

--- The option table argument #n of `fname`: `{}` for nil; raises for a non-table.
function _M.opt_table(v, n, fname)
  if v == nil then return {} end
  _M.argcheck(type(v) == "table", n, fname, "table expected, got " .. type(v))
  return v
end

--- Raises unless option `name` is nil or of type `want`.
function _M.check_type(v, want, name, level)
  if v ~= nil and type(v) ~= want then
    error(("option '%s' must be a %s, got %s"):format(name, want, type(v)), level + 1)
  end
end

--- Raises unless option `name` is nil or a table of strings to strings.
function _M.check_string_map(t, name, level)
  if t == nil then return end
  if type(t) ~= "table" then error(("option '%s' must be a table"):format(name), level + 1) end
  for k, v in pairs(t) do
    if type(k) ~= "string" or type(v) ~= "string" then
      error(("option '%s' must map strings to strings"):format(name), level + 1)
    end
  end
end

--- Raises unless every key of `t` is in `allowed` (a set or a list).
-- @tparam table t the option table
-- @tparam table allowed
-- @tparam string what the name used in the message
-- @tparam[opt] integer level passed to error (default: the caller's caller)
function _M.check_fields(t, allowed, what, level)
  local set = allowed
  if allowed[1] ~= nil then
    set = {}
    for _, k in ipairs(allowed) do set[k] = true end
  end
  for k in pairs(t) do
    if not set[k] then
      local names = {}
      for n in pairs(set) do names[#names + 1] = n end
      table_sort(names)
      error(("unknown %s option '%s' (expected one of: %s)"):format(what, tostring(k),
        table_concat(names, ", ")), (level or 2) + 1)
    end
  end
end

local Detail = { __name = "warmbox.ErrorDetail" }
Detail.__index = Detail
function Detail.__tostring(d)
  return ("http %s: %s"):format(tostring(d.status), tostring(d.message))
end

--- A detail table `{ status, message }` (E2B's status and message kept).
function _M.detail(status, message, extra)
  local d = setmetatable({ status = status, message = message }, Detail)
  if type(extra) == "table" then
    for k, v in pairs(extra) do d[k] = v end
  end
  return d
end

return _M
