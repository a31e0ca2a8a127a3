--- Shared error helpers: `nil, message, CODE, detail`.
-- Runtime failures return `nil, message, code` (plus a detail table where
-- useful); misuse raises. Codes are stable upper-case tokens.
-- @module warmbox.errors
local type, tostring, setmetatable, error = type, tostring, setmetatable, error
local pairs, ipairs, string_format, math_type = pairs, ipairs, string.format, math.type

local _M = {}

--- The codes returned across warmbox (`nil, message, CODE`), each with what it
-- means: the one list (README and HACKING point here; spec/unit/errors_spec.lua
-- checks that every code lua/ and csrc/core return is in it).
_M.codes = {
  BUSY = "the session's lock was not free within the lock timeout (another run holds it)",
  HUNG = "the user's own local server runs on its data directory but does not answer (never a second one there)",
  LOCK = "the lock backend failed (e.g. Redis unreachable), or a held lock was lost",
  POLICY = "a policy hook raised or returned a wrong value; a policy file did not load",
  BUDGET = "the policy's budget refused a run or a prewarm: the conversation or its tenant spent its budget",
  CHART = "a chart could not be drawn (warmbox costs --chart: python3 with matplotlib is needed)",
  BAD_REQUEST = "bad input: an input file name that could escape /home/user; E2B's 400/422",
  TIMEOUT = "a request or the run exceeded its timeout (for a run, detail.started says whether the cell "
    .. "had started)",
  SANDBOX_GONE = "the sandbox proxy answered 502 (gone or paused); a run is sent again only when its sandbox "
    .. "says the cell never arrived",
  FENCED = "the sandbox accepted a cell with a higher fencing number (the run's lock was lost or taken over): "
    .. "it refused the run's cell (never run), or, as files_error, its outputs, which may be the later run's",
  HELD = "the sandbox held a run's cell while an older run's cell of the conversation still executed there (the "
    .. "older run's lock was lost), up to the run's timeout, then refused it: it never started",
  HOOKS_LOST = "a python kernel lost warmbox's hooks (restarted) before the run's cell, twice: nothing of it ran",
  STREAM_BROKEN = "a run's or a command's stream broke after output started (not re-run)",
  NOT_FOUND = "E2B's 404; the warmboxd binary not found",
  CONFLICT = "E2B's 409; s:branch to a session that has a sandbox already",
  STALE = "an automatic checkpoint whose turn was followed by another before it could be taken (skipped)",
  RATE_LIMITED = "E2B's 429 (after retries)",
  AUTH = "E2B's 401/403",
  TRANSPORT = "a connection failure (detail.sent says whether the request may have left); the embedded "
    .. "warmboxd did not start",
  ABORTED = "a transfer cancelled (by its on_chunk callback, tr:cancel() or the engine's close)",
  HTTP = "any other HTTP status, or an answer that is not what E2B sends",
  PROTOCOL = "an answer of the wrong shape: a list that is not an array of objects, a file read shorter than "
    .. "its reported size, an output file name that climbs out of the output directory",
  TOO_LARGE = "a body longer than the request's limit (the core's max_body, read_file's max_bytes, the E2B "
    .. "client's max_body): cut off while it downloaded; a listing that names more pages than its max_pages",
  IO = "a local file or descriptor operation failed (the file lock, the engine's poll)",
  REDIS = "Redis answered a command with an error",
  TASK = "a warmbox.task task raised (its result carries the error)",
  CANCELLED = "a warmbox.task task was cancelled before it finished",
  DEADLOCK = "warmbox.task: tasks remain that nothing can ever wake",
}

--- The code for an HTTP status.
-- @tparam integer status
-- @tparam[opt] boolean data_plane a 502 from the sandbox proxy means SANDBOX_GONE
-- @treturn string
-- syntax: code = errors.code_for_status(status, data_plane)
function _M.code_for_status(status, data_plane)
  if status == 401 or status == 403 then return "AUTH" end
  if status == 404 then return "NOT_FOUND" end
  if status == 409 then return "CONFLICT" end
  if status == 429 then return "RATE_LIMITED" end
  if status == 400 or status == 422 then return "BAD_REQUEST" end
  if status == 502 and data_plane then return "SANDBOX_GONE" end
  return "HTTP"
end

-- ------------------------------------------------------------------
-- Misuse: lauxlib's `bad argument #n to 'f' (...)`, the one vocabulary of
-- every module's argument and option checks (csrc/core says the same words
-- through luaL_argerror).
-- ------------------------------------------------------------------

--- Raises `bad argument #argn to 'fname' (msg)`.
-- @tparam integer argn
-- @tparam string fname
-- @tparam string msg
-- @tparam[opt=2] integer level as `error`'s, counted from the function that calls this one
--   (2: that function's caller)
-- syntax: errors.bad_argument(argn, fname, msg[, level])
function _M.bad_argument(argn, fname, msg, level)
  error(string_format("bad argument #%d to '%s' (%s)", argn, fname, msg), (level or 2) + 1)
end

--- Raises `bad argument #argn to 'fname' (option 'key': msg)`.
-- syntax: errors.bad_option(argn, fname, key, msg[, level])
function _M.bad_option(argn, fname, key, msg, level)
  error(string_format("bad argument #%d to '%s' (option '%s': %s)", argn, fname, tostring(key), msg),
    (level or 2) + 1)
end

--- Raises `bad argument #n to 'fname' (msg)` at the caller's caller unless `cond`.
-- syntax: errors.argcheck(cond, n, fname, msg)
function _M.argcheck(cond, n, fname, msg)
  if not cond then error(string_format("bad argument #%d to '%s' (%s)", n, fname, msg), 3) end
end

local function type_ok(v, want)
  if type(want) ~= "string" then return true end
  for w in want:gmatch("[^|]+") do
    if w == "integer" then
      if math_type(v) == "integer" then return true end
    elseif w == "map" then
      if type(v) == "table" then
        local ok = true
        for k, x in pairs(v) do
          if type(k) ~= "string" or type(x) ~= "string" then ok = false break end
        end
        if ok then return true end
      end
    elseif w == "false" then
      if v == false then return true end
    elseif type(v) == w then
      return true
    end
  end
  return false
end

-- A list of names becomes a set of "any type" entries (memoised per list).
local sets = setmetatable({}, { __mode = "k" })
local function spec_of(spec)
  if spec[1] == nil then return spec end
  local set = sets[spec]
  if not set then
    set = {}
    for _, k in ipairs(spec) do set[k] = true end
    sets[spec] = set
  end
  return set
end

--- Checks the option table argument #argn of `fname`: raises lauxlib's
-- `bad argument #argn to 'fname' (...)` for a non-table (`table expected, got
-- T`), an unknown key (`unknown option 'k'`) or a value of the wrong type
-- (`option 'k': T expected, got U`). Absent options are not checked.
-- @tparam table|nil t the options
-- @tparam table spec `{ name = "type" | "type|type" | any other value: any type }` (types:
--   Lua's, plus "integer", "false" and "map", a table of strings to strings) or a list of names
-- @tparam string fname the function named in the message
-- @tparam integer argn the argument's position (as the caller writes it: `o:f(opts)` is #1)
-- @tparam[opt=2] integer level as `error`'s, counted from the function that calls this one
-- @tparam[opt] string prefix put before option names (a nested table: "lifecycle.")
-- @treturn table `t`, or a new empty table for nil
-- syntax: errors.check_options(t, spec, fname, argn[, level, prefix])
function _M.check_options(t, spec, fname, argn, level, prefix)
  level = (level or 2) + 1
  if t == nil then return {} end
  if type(t) ~= "table" then
    error(string_format("bad argument #%d to '%s' (table expected, got %s)", argn, fname, type(t)), level)
  end
  spec = spec_of(spec)
  prefix = prefix or ""
  for k, v in pairs(t) do
    local want = spec[k]
    if want == nil then
      error(string_format("bad argument #%d to '%s' (unknown option '%s%s')", argn, fname, prefix, tostring(k)),
        level)
    end
    if not type_ok(v, want) then
      local msg
      if want == "map" and type(v) == "table" then
        msg = "a table of strings to strings expected"
      else
        msg = string_format("%s expected, got %s", want == "map" and "table" or want:gsub("|", " or "), type(v))
      end
      error(string_format("bad argument #%d to '%s' (option '%s%s': %s)", argn, fname, prefix, tostring(k), msg),
        level)
    end
  end
  return t
end

local Detail = { __name = "warmbox.ErrorDetail" }
Detail.__index = Detail
function Detail.__tostring(d)
  return ("http %s: %s"):format(tostring(d.status), tostring(d.message))
end

--- lua.c's ^C raises "interrupted!" from a hook at the next call, which can be
-- a call under a pcall (cjson.safe's, a policy hook's): such a pcall must not
-- turn the interrupt into an ordinary failure. Raises it again when `e` (an
-- error value, possibly with a traceback appended) is that interrupt;
-- otherwise returns `e`.
-- syntax: e = errors.reraise_interrupt(e) (raises lua.c's `interrupted!` again when a pcall caught it:
--   json.decode, policy hooks, GC's tenant hook)
function _M.reraise_interrupt(e)
  if type(e) == "string" and (e == "interrupted!" or e:match("^interrupted!\n") or e:match("^[^\n]*: interrupted!$")
    or e:match("^[^\n]*: interrupted!\n")) then
    error("interrupted!", 0)
  end
  return e
end

--- A detail table `{ status, message }` (E2B's status and message kept).
-- syntax: d = errors.detail(status, message, extra)
function _M.detail(status, message, extra)
  local d = setmetatable({ status = status, message = message }, Detail)
  if type(extra) == "table" then
    for k, v in pairs(extra) do d[k] = v end
  end
  return d
end

return _M
