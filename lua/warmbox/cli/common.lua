--- warmbox.cli.common: what the CLI's commands share besides their
-- arguments: the exit status of a failure, notes on stderr, the warmbox
-- object a command works with (on which server), terminals, times.
--
-- `io_` is the command's context: `stdout`, `stderr`, `stdin`, `quiet` (-q:
-- no notes), and for specs `is_tty(fd)`, `isatty`.
local tostring, pcall = tostring, pcall
local string_format = string.format

local _M = {}

--- warmbox failed (not the code it ran): exit status 2.
_M.FAILED = 2

--- Says `msg` (and its `code`) on stream `err`; returns FAILED.
-- syntax: status = common.fail(err, msg, code)
function _M.fail(err, msg, code)
  err:write(string_format("warmbox: %s%s\n", tostring(msg), code and (" (" .. tostring(code) .. ")") or ""))
  return _M.FAILED
end
local fail = _M.fail

--- A note on stderr (which server, saved files): not an error, dropped by -q.
-- syntax: common.note(io_, s)
function _M.note(io_, s)
  if not io_.quiet then io_.stderr:write(s) end
end
local note = _M.note

-- Without an E2B key and without --api-url, a running per-user server (`warmbox
-- server start`) is used; the command says so on stderr. Returns whether it was.
local function use_local_server(o, io_)
  if o.api_url or o.client then return false end
  local key = o.api_key or os.getenv("E2B_API_KEY")
  if key and key ~= "" then return false end
  local st = require("warmbox.server").local_server()
  if not st then return false end
  o.api_url, o.api_key, o.sandbox_url = st.url, st.api_key, st.url
  note(io_, string_format("warmbox: using the local server at %s (pid %d; `warmbox server stop` ends it)\n",
    st.url, st.pid))
  return true
end

--- The warmbox object of a command with global options `o`: on the local
-- server when one runs and no backend is given, else on its own server
-- (which ends with it). nil (said on stderr) when it cannot be made.
-- syntax: wb = common.new_warmbox(o, io_)
function _M.new_warmbox(o, io_)
  -- No local server running (and none asked for): this command's own, which ends with it.
  if not use_local_server(o, io_) and o.server == nil then o.server = "private" end
  local err = io_.stderr
  local warmbox = require "warmbox"
  local ok, wb, msg, code = pcall(warmbox.new, o)
  if not ok then
    err:write("warmbox: ", tostring(wb), "\n")
    return nil
  end
  if not wb then
    err:write(string_format("warmbox: %s (%s)\n", tostring(msg), tostring(code)))
    return nil
  end
  return wb
end

--- Whether file descriptor `fd` is a terminal (`io_.is_tty` overrides).
-- syntax: yes = common.is_tty(io_, fd)
function _M.is_tty(io_, fd)
  if io_.is_tty then return io_.is_tty(fd) end
  return os.execute("test -t " .. fd) == true
end
local is_tty = _M.is_tty

--- No local server: start one (`start`: --start), offer to on a terminal,
-- else the command runs on an embedded one. false when starting failed
-- (said on stderr).
-- syntax: ok = common.ensure_local_server(o, io_, start)
function _M.ensure_local_server(o, io_, start)
  if o.api_url then return true end
  local key = o.api_key or os.getenv("E2B_API_KEY")
  if key and key ~= "" then return true end
  local server = require "warmbox.server"
  if server.local_server() then return true end
  local err = io_.stderr
  if not start and is_tty(io_, 0) and is_tty(io_, 2) then
    err:write("warmbox: no local server is running; start one, so that the session keeps its kernel "
      .. "between commands? [Y/n] ")
    err:flush()
    local answer = io_.stdin:read("l")
    start = answer ~= nil and (answer == "" or answer:match("^%s*[yY]") ~= nil)
  end
  if not start then
    note(io_, "warmbox: no local server (`warmbox server start`, or run --start): this command's sandbox "
      .. "ends with it\n")
    return true
  end
  local st, msg, code = server.start_local{ bin = o.warmboxd }
  if not st then
    fail(err, "cannot start the local server: " .. tostring(msg), code)
    return false
  end
  note(io_, string_format("warmbox: started the local server at %s (pid %d)\n", st.url, st.pid))
  return true
end

--- Time `t` (epoch seconds) as RFC 3339 UTC, or nil.
-- syntax: s = common.utc(t)
function _M.utc(t) return t and os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(t)) end

return _M
