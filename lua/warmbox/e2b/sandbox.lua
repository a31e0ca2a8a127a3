--- warmbox.e2b.sandbox: the data plane of one sandbox: envd's files and
-- Filesystem RPC, processes (Connect server streams) and the code
-- interpreter (NDJSON). A `Sandbox` comes from `client:sandbox(sb, opts)`.
-- Failures and misuse follow `warmbox.e2b`'s conventions.
-- @module warmbox.e2b.sandbox
local core = require "warmbox.core"
local json = require "warmbox.json"
local errors = require "warmbox.errors"
local util = require "warmbox.util"
local wire = require "warmbox.e2b.wire"

local type, pairs, ipairs, tostring, tonumber, setmetatable, getmetatable, error =
  type, pairs, ipairs, tostring, tonumber, setmetatable, getmetatable, error
local table_concat = table.concat
local math_ceil, math_type, math_tointeger = math.ceil, math.type, math.tointeger
local argcheck, check_options = errors.argcheck, errors.check_options
local uri_component, http_failure, transport_failure = wire.uri_component, wire.http_failure, wire.transport_failure
local to_entry, to_context, multipart, envelope = wire.to_entry, wire.to_context, wire.multipart, wire.envelope
local decode_body, decode_array, lower = wire.decode_body, wire.decode_array, wire.lower
local CONNECT_CODES, RESULT_KEYS, cut_utf8, clean_tree = wire.CONNECT_CODES, wire.RESULT_KEYS, wire.cut_utf8,
  wire.clean_tree
local v, clean = json.value, json.utf8_clean

local _M = {}

local ENVD_PORT = 49983
local INTERP_PORT = 49999

local Sandbox = { __name = "warmbox.e2b.Sandbox" }
Sandbox.__index = Sandbox
_M.Sandbox = Sandbox

--- A data-plane handle on a sandbox (`client:sandbox(sb, opts)` calls this
-- with the client as `self`).
-- @tparam table|string sb a sandbox table (from create/connect/info) or an id
-- @tparam[opt] table opts `access_token` (default `sb.envd_access_token`), `user`
-- @treturn warmbox.e2b.Sandbox
function _M.new(self, sb, opts)
  opts = check_options(opts, { access_token = "string", user = "string", traffic_token = "string" }, "sandbox", 2)
  local id, token, domain, traffic
  if type(sb) == "table" then
    id, token, domain, traffic = sb.sandbox_id, sb.envd_access_token, sb.domain, sb.traffic_access_token
  else
    id = sb
  end
  argcheck(type(id) == "string" and id ~= "", 1, "sandbox", "sandbox or sandbox id expected")
  token = opts.access_token or token
  traffic = opts.traffic_token or traffic
  local self_ = { client = self, sandbox_id = id, user = opts.user }
  local function base(port)
    if self.sandbox_url then return self.sandbox_url end
    return ("https://%d-%s.%s"):format(port, id, domain or self.domain)
  end
  self_.envd_url = base(ENVD_PORT)
  self_.interp_url = base(INTERP_PORT)
  local function headers(port, extra)
    local h = { ["E2b-Sandbox-Id"] = id, ["E2b-Sandbox-Port"] = tostring(port) }
    if token then h["X-Access-Token"] = token end
    if traffic and port ~= ENVD_PORT then h["E2B-Traffic-Access-Token"] = traffic end
    for k, x in pairs(extra or {}) do h[k] = x end
    return h
  end
  self_.envd_headers = headers(ENVD_PORT)
  self_.json_headers = headers(ENVD_PORT, { ["Content-Type"] = "application/json",
    ["Connect-Protocol-Version"] = "1" })
  self_.interp_headers = headers(INTERP_PORT, { ["Content-Type"] = "application/json" })
  return setmetatable(self_, Sandbox)
end

function Sandbox:__tostring()
  return ("warmbox.e2b.Sandbox: %s"):format(self.sandbox_id)
end

local function check_sandbox(self, fname)
  if getmetatable(self) ~= Sandbox then
    error(("bad argument #1 to '%s' (warmbox.e2b.Sandbox expected, got %s)"):format(fname, type(self)), 3)
  end
end

local function check_path(p, n, fname)
  argcheck(type(p) == "string" and p ~= "", n, fname, "path expected, got " .. type(p))
  return p
end

local function dp_request(self, req, what)
  local res, msg, code, sent = (self.client.transport or self.client.http):request(req)
  if not res then return transport_failure(what, msg, code, sent) end
  return res
end

local function files_query(self, path)
  local q = "?path=" .. uri_component(path)
  if self.user then q = q .. "&username=" .. uri_component(self.user) end
  return q
end

--- Reads a file.
-- @tparam string path
-- @tparam[opt] table opts `max_bytes`: a file longer than this is not read past it (the
--   transfer is cut off while it downloads, whatever size the answer announced): `TOO_LARGE`
-- @treturn[1] string the bytes
-- @return[2] nil, msg, code, detail
function Sandbox:read_file(path, opts)
  check_sandbox(self, "read_file")
  check_path(path, 1, "read_file")
  opts = check_options(opts, { max_bytes = "number" }, "read_file", 2)
  if opts.max_bytes and (opts.max_bytes ~= opts.max_bytes or opts.max_bytes < 0) then
    errors.bad_option(2, "read_file", "max_bytes", "a number >= 0 expected")
  end
  local what = ("read '%s' in sandbox '%s'"):format(path, self.sandbox_id)
  -- max_body 0 is "no limit" to the core: a cap of 0 bytes allows 1 byte, then refuses the file
  local max_body = opts.max_bytes and math.max(1, math.floor(opts.max_bytes)) or nil
  local res, msg, code, d = dp_request(self, { method = "GET",
    url = self.envd_url .. "/files" .. files_query(self, path), headers = self.envd_headers,
    retry = self.client.dp_retry, max_body = max_body }, what)
  if not res then return nil, msg, code, d end
  if res.status ~= 200 then
    return http_failure(res, what, true, ("file '%s' not found in sandbox '%s'"):format(path, self.sandbox_id))
  end
  if opts.max_bytes and #res.body > opts.max_bytes then
    return nil, what .. ": longer than max_bytes (" .. tostring(opts.max_bytes) .. ")", "TOO_LARGE",
      errors.detail(200, "longer than max_bytes")
  end
  return res.body
end

local function entries_of(res, what)
  local arr, m, c, d = decode_array(res, what)
  if not arr then return nil, m, c, d end
  local out = {}
  for i, e in ipairs(arr) do out[i] = to_entry(e) end
  return out
end

--- Writes a file (application/octet-stream upload; parents are created).
-- @treturn[1] table entry `{ path, name, type }`
-- @return[2] nil, msg, code, detail
function Sandbox:write_file(path, data)
  check_sandbox(self, "write_file")
  check_path(path, 1, "write_file")
  argcheck(type(data) == "string", 2, "write_file", "string expected, got " .. type(data))
  local what = ("write '%s' in sandbox '%s'"):format(path, self.sandbox_id)
  local headers = util.copy(self.envd_headers)
  headers["Content-Type"] = "application/octet-stream"
  local res, msg, code, d = dp_request(self, { method = "POST",
    url = self.envd_url .. "/files" .. files_query(self, path), headers = headers, body = data,
    retry = self.client.dp_retry_idem }, what)
  if not res then return nil, msg, code, d end
  if res.status ~= 200 then return http_failure(res, what, true) end
  local entries, m2, c2, d2 = entries_of(res, what)
  if not entries then return nil, m2, c2, d2 end
  return entries[1] or { path = path, type = "file" }
end

--- Writes several files in one multipart/form-data request.
-- @tparam table files `{ { path = "a.txt", data = "..." }, ... }`
-- @treturn[1] table entries
-- @return[2] nil, msg, code, detail
function Sandbox:write_files(files)
  check_sandbox(self, "write_files")
  argcheck(type(files) == "table", 1, "write_files", "table expected, got " .. type(files))
  local list = {}
  for i, f in ipairs(files) do
    argcheck(type(f) == "table" and type(f.path) == "string" and f.path ~= "" and type(f.data) == "string", 1,
      "write_files", ("entry %d must be { path = string, data = string }"):format(i))
    list[i] = { path = f.path, data = f.data }
  end
  if #list == 0 then return json.empty_array() end
  local what = ("write %d files in sandbox '%s'"):format(#list, self.sandbox_id)
  local body, ctype = multipart(list)
  local headers = util.copy(self.envd_headers)
  headers["Content-Type"] = ctype
  local url = self.envd_url .. "/files"
  if self.user then url = url .. "?username=" .. uri_component(self.user) end
  local res, msg, code, d = dp_request(self, { method = "POST", url = url, headers = headers, body = body,
    retry = self.client.dp_retry_idem }, what)
  if not res then return nil, msg, code, d end
  if res.status ~= 200 then return http_failure(res, what, true) end
  return entries_of(res, what)
end

-- A Filesystem RPC (Connect unary, JSON). Returns the decoded reply table
-- or nil, msg, code, detail (with detail.rpc_code, Connect's code).
local function rpc(self, method, body, what, idempotent, not_found_msg)
  local s = assert(json.encode(body))
  local res, msg, code, d = dp_request(self, { method = "POST",
    url = self.envd_url .. "/filesystem.Filesystem/" .. method, headers = self.json_headers, body = s,
    retry = idempotent and self.client.dp_retry_idem or self.client.dp_retry }, what)
  if not res then return nil, msg, code, d end
  if res.status ~= 200 then
    local n, m2, c2, d2 = http_failure(res, what, true, not_found_msg)
    local t = json.decode(res.body)
    if type(t) == "table" and type(t.code) == "string" then d2.rpc_code = t.code end
    return n, m2, c2, d2
  end
  local t = json.decode(res.body)
  -- 2nd value: the answer was no JSON object (only ListDir's caller cares)
  if type(t) ~= "table" or not res.body:match("^%s*{") then return {}, true end
  return t
end

--- Information about a path.
-- @treturn[1] table entry `{ name, path, type ("file"|"dir"|"symlink"), size, mode,
--   permissions, owner, group, modified_time, symlink_target, metadata }`
-- @return[2] nil, msg, code, detail ("NOT_FOUND" when missing)
function Sandbox:stat(path)
  check_sandbox(self, "stat")
  check_path(path, 1, "stat")
  local t, msg, code, d = rpc(self, "Stat", { path = path }, ("stat '%s'"):format(path), true,
    ("path '%s' not found in sandbox '%s'"):format(path, self.sandbox_id))
  if not t then return nil, msg, code, d end
  return to_entry(v(t.entry)) or { path = path }
end

--- Creates a directory and its parents.
-- @treturn[1] boolean true when created, false when it already existed
-- @return[2] nil, msg, code, detail
function Sandbox:make_dir(path)
  check_sandbox(self, "make_dir")
  check_path(path, 1, "make_dir")
  local t, msg, code, d = rpc(self, "MakeDir", { path = path }, ("make directory '%s'"):format(path), true)
  if not t then
    if code == "CONFLICT" then return false end
    return nil, msg, code, d
  end
  return true
end

--- Lists a directory.
-- @tparam string path
-- @tparam[opt] integer depth (1)
-- @treturn[1] table entries
-- @return[2] nil, msg, code, detail
function Sandbox:list_dir(path, depth)
  check_sandbox(self, "list_dir")
  check_path(path, 1, "list_dir")
  argcheck(depth == nil or (math_type(depth) == "integer" and depth >= 1), 2, "list_dir", "integer >= 1 expected")
  local t, msg, code, d = rpc(self, "ListDir", { path = path, depth = depth or 1 },
    ("list directory '%s'"):format(path), true,
    ("directory '%s' not found in sandbox '%s'"):format(path, self.sandbox_id))
  if not t then return nil, msg, code, d end
  -- Connect's JSON leaves an empty list out; anything else must be a list of objects.
  local entries = v(t.entries) or {}
  local out, n, not_object = {}, 0, msg
  if type(entries) == "table" and not not_object then
    for _ in pairs(entries) do n = n + 1 end
  else
    out = nil
  end
  for i = 1, n do
    out[i] = to_entry(entries[i])
    if not out[i] then out = nil break end
  end
  if not out then
    return nil, ("list directory '%s': the answer's entries are not a list of objects"):format(path), "PROTOCOL",
      errors.detail(200, "bad entries")
  end
  return out
end

--- Removes a path recursively (a missing path is not an error).
-- @treturn[1] boolean true
-- @return[2] nil, msg, code, detail
function Sandbox:remove(path)
  check_sandbox(self, "remove")
  check_path(path, 1, "remove")
  local t, msg, code, d = rpc(self, "Remove", { path = path }, ("remove '%s'"):format(path), true)
  if not t then return nil, msg, code, d end
  return true
end

--- Moves (renames) a path.
-- @treturn[1] table entry of the destination
-- @return[2] nil, msg, code, detail
function Sandbox:move(src, dst)
  check_sandbox(self, "move")
  check_path(src, 1, "move")
  check_path(dst, 2, "move")
  local t, msg, code, d = rpc(self, "Move", { source = src, destination = dst }, ("move '%s' to '%s'"):format(src, dst),
    false, ("path '%s' not found in sandbox '%s'"):format(src, self.sandbox_id))
  if not t then return nil, msg, code, d end
  return to_entry(v(t.entry)) or { path = dst }
end

local command_fields = { envs = "map", cwd = "string", timeout = "number", on_stdout = "function",
  on_stderr = "function", user = "string" }

-- The headers of run_command's Process.Start stream (timeout: seconds, 0 for none).
local function command_headers(self, opts, timeout)
  local headers = util.copy(self.envd_headers)
  headers["Content-Type"] = "application/connect+json"
  headers["Connect-Protocol-Version"] = "1"
  headers["Keepalive-Ping-Interval"] = "50"
  if timeout > 0 then headers["Connect-Timeout-Ms"] = tostring(math_ceil(timeout * 1000)) end
  local user = opts.user or self.user
  if user then
    -- Basic base64("<user>:"), the envd way of choosing the Linux user.
    local raw = user .. ":"
    local enc = util.b64_encode(raw)
    headers["Authorization"] = "Basic " .. enc
  end
  return headers
end

--- Runs a shell command (`/bin/bash -l -c cmd`) through envd's Process.Start.
-- @tparam string cmd
-- @tparam[opt] table opts `envs`, `cwd`, `timeout` (60 s; 0: none), `on_stdout(text)`,
--   `on_stderr(text)`
-- @treturn[1] table `{ stdout, stderr, exit_code, pid, error }` (a non-zero exit is not a failure)
-- @return[2] nil, msg, code, detail ("STREAM_BROKEN" when the stream broke after output started)
function Sandbox:run_command(cmd, opts)
  check_sandbox(self, "run_command")
  argcheck(type(cmd) == "string", 1, "run_command", "string expected, got " .. type(cmd))
  opts = check_options(opts, command_fields, "run_command", 2)
  local timeout = opts.timeout or 60
  local process = { cmd = "/bin/bash", args = json.array({ "-l", "-c", cmd }) }
  if opts.envs then process.envs = util.copy(opts.envs) end
  if opts.cwd then process.cwd = opts.cwd end
  local body = assert(json.encode({ process = process, stdin = false }))
  local headers = command_headers(self, opts, timeout)
  local what = ("run command in sandbox '%s'"):format(self.sandbox_id)
  local out, errs = {}, {}
  local result = { exit_code = nil }
  local trailer_error, ended, started = nil, false, false
  local on_stdout, on_stderr = opts.on_stdout, opts.on_stderr
  local res, msg, code, sent = (self.client.transport or self.client.http):request{
    method = "POST", url = self.envd_url .. "/process.Process/Start", headers = headers,
    body = envelope(body), stream = "connect", retry = false, max_body = self.client.max_body,
    timeout = timeout > 0 and (timeout + self.client.request_timeout) or 0,
    on_chunk = function(frame, flags)
      local t = json.decode(frame)
      if flags & 2 ~= 0 then
        if type(t) == "table" and type(t.error) == "table" then trailer_error = t.error end
        ended = true
        return
      end
      if type(t) ~= "table" or type(t.event) ~= "table" then return end
      local ev = t.event
      if type(ev.start) == "table" then
        started = true
        result.pid = v(ev.start.pid)
      elseif type(ev.data) == "table" then
        local so, se = v(ev.data.stdout), v(ev.data.stderr)
        if type(so) == "string" then
          local text = util.b64_decode(so) or ""
          out[#out + 1] = text
          if on_stdout then on_stdout(text) end
        end
        if type(se) == "string" then
          local text = util.b64_decode(se) or ""
          errs[#errs + 1] = text
          if on_stderr then on_stderr(text) end
        end
      elseif type(ev["end"]) == "table" then
        local e = ev["end"]
        result.exit_code = tonumber(v(e.exitCode)) or 0
        result.status = v(e.status)
        result.error = v(e.error)
      end
    end,
  }
  result.stdout = table_concat(out)
  result.stderr = table_concat(errs)
  if not res then
    if started and code ~= "TIMEOUT" then
      return nil, what .. ": the stream broke after output started: " .. tostring(msg), "STREAM_BROKEN",
        errors.detail(nil, msg, { output_started = true, partial = result })
    end
    return transport_failure(what, msg, code, sent)
  end
  if res.status ~= 200 then return http_failure(res, what, true) end
  if trailer_error then
    local ccode = v(trailer_error.code)
    local cmsg = v(trailer_error.message) or tostring(ccode)
    local c = CONNECT_CODES[ccode] or "HTTP"
    if started and result.exit_code == nil and c ~= "TIMEOUT" then c = "STREAM_BROKEN" end
    return nil, ("%s: %s: %s"):format(what, tostring(ccode), lower(cmsg)), c,
      errors.detail(200, cmsg, { rpc_code = ccode, partial = result })
  end
  if result.exit_code == nil then
    if started or #out > 0 or #errs > 0 then
      return nil, what .. ": the stream ended before the process did", "STREAM_BROKEN",
        errors.detail(200, "no end event", { output_started = true, partial = result })
    end
    return nil, what .. ": the stream ended without any event", ended and "HTTP" or "STREAM_BROKEN",
      errors.detail(200, "no events")
  end
  return result
end

local code_fields = { language = "string", context_id = "string", env_vars = "map", timeout = "number",
  on_stdout = "function", on_stderr = "function", on_result = "function", on_error = "function",
  on_line = "function", max_output = "number", is_private = "function", fence = "number" }

--- Seconds the client waits past an execute's own timeout for the server's
-- interrupt to end the stream (a bash command gets 3 s to stop).
_M.EXEC_GRACE = 10

-- ------------------------------------------------------------------
-- /execute's stream: one handler per line type, over the run's state `st`
-- (`exec`, the result being built; `used` bytes of `max_output`; `started`,
-- `finished`; the caller's callbacks).
-- ------------------------------------------------------------------

local function text_line(st, kind, t)
  local text = v(t.text)
  if type(text) ~= "string" then text = "" end
  text = clean(text)
  if st.used + #text > st.max_output then
    text = cut_utf8(text, st.max_output - st.used)
    st.exec.truncated = true
    if text == "" then return end
  end
  st.used = st.used + #text
  local list = st.exec[kind]
  list[#list + 1] = text
  local cb = kind == "stdout" and st.on_stdout or st.on_stderr
  if cb then cb(text, { text = text, timestamp = v(t.timestamp) }) end
end

local function result_line(st, _, t, line)
  local r = {}
  for _, k in ipairs(RESULT_KEYS) do r[k] = clean_tree(v(t[k]), 0) end
  r.is_main_result = r.is_main_result == true
  if type(r.extra) ~= "table" then r.extra = {} end
  if st.is_private and st.is_private(r) then
    if st.on_result then st.on_result(r) end
    return
  end
  -- Cut by the kernel (too large for one line), or past the cap: what fits of its text is kept.
  if v(t.truncated) == true or st.used + #line > st.max_output then st.exec.truncated = true end
  if st.used + #line > st.max_output then
    r = wire.cut_result(r, st.max_output - st.used)
    if not r then return end
  end
  st.used = math.min(st.max_output, st.used + #line)
  st.exec.results[#st.exec.results + 1] = r
  if st.on_result then st.on_result(r) end
end

local function error_line(st, _, t)
  local e = { name = v(t.name), value = v(t.value), traceback = v(t.traceback) }
  if type(e.traceback) == "table" then
    local parts = {}
    for i, x in ipairs(e.traceback) do parts[i] = tostring(v(x)) end
    e.traceback = table_concat(parts, "\n")
  end
  for _, k in ipairs({ "name", "value", "traceback" }) do
    if e[k] ~= nil and type(e[k]) ~= "string" then e[k] = tostring(e[k]) end
    e[k] = clean(e[k])
  end
  st.exec.error = e
  if st.on_error then st.on_error(e) end
end

-- lua-cjson decodes every number as a float: a count of 2 is 2, not 2.0.
local function count(n)
  return math_type(n) == "float" and math_tointeger(n) or n
end

-- Unknown types are ignored, as the SDKs do.
local LINE_KINDS = {
  stdout = text_line, stderr = text_line, result = result_line, error = error_line,
  number_of_executions = function(st, _, t) st.exec.execution_count = count(v(t.execution_count)) end,
  end_of_execution = function(st) st.finished = true end,
}

local function execute_line(st, line, flags)
  if flags & 1 ~= 0 then
    -- A line longer than the stream's limit, cut: past max_output anyway.
    st.started = true
    st.exec.truncated = true
    if st.on_line then st.on_line("cut") end
    return
  end
  local t, nfixed = json.decode_lossless(line)
  if type(t) ~= "table" then
    st.started = true
    if st.used + #line <= st.max_output then
      st.used = st.used + #line
      st.exec.undecoded[#st.exec.undecoded + 1] = line
    else
      st.exec.truncated = true
    end
    if st.on_line then st.on_line("undecoded") end
    return
  end
  local kind = t.type
  if st.on_line then st.on_line(kind) end
  if kind == "keepalive" then return end
  st.started = true
  st.exec.replaced = st.exec.replaced + (nfixed or 0)
  local handler = type(kind) == "string" and LINE_KINDS[kind]
  if handler then handler(st, kind, t, line) end
end

-- What run_code returns once the request is over: the result, or the failure
-- with what it says about the cell (`started`, `sent`, the partial output).
local function execute_outcome(st, what, timeout, elapsed, res, msg, ecode, sent)
  local exec, started = st.exec, st.started
  if not res then
    if ecode == "TIMEOUT" then
      -- The request may have reached the kernel unless the core knows it never
      -- left (a connect timeout): then the cell may be running, output or not.
      local may_run = started or sent ~= false
      return nil, what .. ": the run timed out" .. (may_run and " (the cell may have started)" or
        " before the request was sent") .. ": " .. tostring(msg), "TIMEOUT",
        errors.detail(nil, msg, { started = may_run, sent = sent ~= false, output_started = started,
          partial = exec })
    end
    if started then
      return nil, what .. ": the stream broke after output started: " .. tostring(msg), "STREAM_BROKEN",
        errors.detail(nil, msg, { output_started = true, started = true, sent = true, partial = exec })
    end
    -- Sent (or maybe sent), the cell may have started: only the sandbox can say.
    local n, m2, c2, d2 = transport_failure(what, msg, ecode, sent)
    d2.started, d2.output_started = sent ~= false, false
    return n, m2, c2, d2
  end
  if res.status ~= 200 then
    -- A bare status: whoever answered it (an intermediary after forwarding
    -- the request, too) may have let the cell start.
    local n, m2, c2, d2 = http_failure(res, what, true)
    d2.started, d2.output_started = true, false
    d2.sent = true
    d2.attempts = res.attempts
    d2.retry_after = tonumber(res.headers and res.headers["retry-after"])
    return n, m2, c2, d2
  end
  if not st.finished then
    if started then
      return nil, what .. ": the stream ended before end_of_execution", "STREAM_BROKEN",
        errors.detail(200, "no end_of_execution", { output_started = true, started = true, sent = true,
          partial = exec })
    end
    return nil, what .. ": the stream ended without any output", "STREAM_BROKEN",
      errors.detail(200, "empty stream", { started = true, output_started = false, sent = true })
  end
  if timeout > 0 and elapsed >= timeout then
    -- The run reached its timeout: the server interrupted the cell then,
    -- whatever the kernel says about it (an error, or none: an interrupt can
    -- land where the kernel ends the cell without one).
    return nil, ("%s: the run timed out after %gs (the cell was interrupted)"):format(what, timeout), "TIMEOUT",
      errors.detail(200, "interrupted at the timeout", { started = true, sent = true, output_started = true,
        partial = exec })
  end
  return exec
end

--- Runs code in the code interpreter (port 49999, NDJSON stream).
--
-- At most once: the execute is never sent twice once it may have reached the
-- server. Only a refusal is retried here: 429/503 before any stream byte
-- (honouring Retry-After within the retry budget) and a connection that
-- failed before anything was sent.
--
-- Decoding loses nothing: lone surrogate escapes (`\udcXX`, Python's
-- surrogate-escaped bytes) and invalid UTF-8 become U+FFFD, and a line that
-- still cannot be parsed is kept, raw, in `undecoded`.
-- @tparam string code
-- @tparam[opt] table opts `language`, `context_id` (not both), `env_vars`, `timeout` (300 s; 0: none;
--   sent to the server, which interrupts the cell then; the client waits `EXEC_GRACE` s more),
--   `on_stdout(text, msg)`, `on_stderr(text, msg)`, `on_result(result)`, `on_error(err)`,
--   `on_line(type)` (every line, keepalives included), `max_output` (bytes of stdout, stderr,
--   results and undecoded lines kept; past it the rest is read and dropped, `truncated = true`),
--   `is_private(result)` (results it says true for go to `on_result` only: not kept, not counted)
-- @treturn[1] table `{ stdout = {chunks}, stderr = {chunks}, results = {...}, error = {name, value,
--   traceback} | nil, execution_count = n, truncated = bool, undecoded = { raw lines },
--   replaced = n (characters replaced by U+FFFD) }`
-- @return[2] nil, msg, code, detail: "SANDBOX_GONE" for the proxy's 502 before any output,
--   "STREAM_BROKEN" when the stream broke after output started (never retried), "TIMEOUT" with
--   `detail.partial`; on any failure `detail.started` says whether the cell may have started
--   (true once the request may have left: only the sandbox can say more), `detail.output_started`
--   whether any of its output came, `detail.sent` whether the request may have reached the server;
--   `opts.fence` (a run's fencing number) is sent as `X-Warmbox-Fence`: warmboxd then never starts the
--   cell while another fenced run's cell executes in another context (409 "CONFLICT" when that outlives
--   the timeout; E2B ignores the header)
function Sandbox:run_code(code, opts)
  check_sandbox(self, "run_code")
  argcheck(type(code) == "string", 1, "run_code", "string expected, got " .. type(code))
  opts = check_options(opts, code_fields, "run_code", 2)
  if opts.language and opts.context_id then
    errors.bad_argument(2, "run_code", "options 'language' and 'context_id' are mutually exclusive")
  end
  local timeout = opts.timeout or 300
  if not (timeout >= 0 and timeout < math.huge) then
    errors.bad_option(2, "run_code", "timeout", "a finite number >= 0 expected")
  end
  local max_output = opts.max_output or math.huge
  if max_output ~= max_output or max_output < 0 then
    errors.bad_option(2, "run_code", "max_output", "a number >= 0 expected")
  end
  local body = { code = code }
  if opts.context_id then body.context_id = opts.context_id end
  if opts.language then body.language = opts.language end
  if opts.env_vars then body.env_vars = util.copy(opts.env_vars) end
  if timeout > 0 then body.timeout = timeout end
  local s = assert(json.encode(body))
  local what = ("run code in sandbox '%s'"):format(self.sandbox_id)
  local hdrs = self.interp_headers
  if opts.fence then
    if math_type(opts.fence) ~= "integer" or opts.fence < 0 then
      errors.bad_option(2, "run_code", "fence", "an integer >= 0 expected")
    end
    hdrs = util.copy(hdrs)
    hdrs["X-Warmbox-Fence"] = ("%d"):format(opts.fence)
  end
  local st = {
    exec = { stdout = {}, stderr = {}, results = {}, error = nil, execution_count = nil, truncated = false,
      undecoded = {}, replaced = 0 },
    used = 0, max_output = max_output, started = false, finished = false,
    on_stdout = opts.on_stdout, on_stderr = opts.on_stderr, on_result = opts.on_result, on_error = opts.on_error,
    on_line = opts.on_line, is_private = opts.is_private,
  }
  -- Room for max_output bytes of text in one line, JSON-escaped, and for a kernel's cut result (8 MiB:
  -- what fits is kept); never above the core's limit.
  local max_frame = max_output < math.huge and math.min(64 << 20, math.max(9 << 20, 2 * max_output + 65536)) or nil
  local mono = core.now or os.time -- (specs may fake the core without a clock)
  local t0 = mono()
  local res, msg, ecode, sent = (self.client.transport or self.client.http):request{
    method = "POST", url = self.interp_url .. "/execute", headers = hdrs, body = s,
    stream = "lines", retry = self.client.exec_retry, max_frame = max_frame, max_body = self.client.max_body,
    timeout = timeout > 0 and (timeout + _M.EXEC_GRACE) or 0,
    on_chunk = function(line, flags) execute_line(st, line, flags) end,
  }
  return execute_outcome(st, what, timeout, mono() - t0, res, msg, ecode, sent)
end

local function interp_call(self, method, path, body, what, not_found_msg, idempotent)
  local req = { method = method, url = self.interp_url .. path, headers = self.interp_headers,
    retry = idempotent and self.client.dp_retry_idem or self.client.dp_retry }
  if body ~= nil then req.body = assert(json.encode(body)) end
  local res, msg, code, d = dp_request(self, req, what)
  if not res then return nil, msg, code, d end
  if res.status ~= 200 and res.status ~= 204 then
    return http_failure(res, what, true, not_found_msg)
  end
  return res
end

--- Creates a code-interpreter context (a kernel).
-- @tparam[opt] table opts `language` ("python"), `cwd` ("/home/user")
-- @treturn[1] table `{ id, language, cwd }`
-- @return[2] nil, msg, code, detail
function Sandbox:create_context(opts)
  check_sandbox(self, "create_context")
  opts = check_options(opts, { language = "string", cwd = "string" }, "create_context", 1)
  local body = {}
  if opts.language then body.language = opts.language end
  if opts.cwd then body.cwd = opts.cwd end
  local what = ("create a context in sandbox '%s'"):format(self.sandbox_id)
  local res, msg, code, d = interp_call(self, "POST", "/contexts", body, what)
  if not res then return nil, msg, code, d end
  local t, m2, c2, d2 = decode_body(res, what)
  if not t then return nil, m2, c2, d2 end
  return to_context(t)
end

--- Lists the code-interpreter contexts.
-- @treturn[1] table `{ { id, language, cwd }, ... }`
-- @return[2] nil, msg, code, detail
function Sandbox:list_contexts()
  check_sandbox(self, "list_contexts")
  local what = ("list contexts in sandbox '%s'"):format(self.sandbox_id)
  local res, msg, code, d = interp_call(self, "GET", "/contexts", nil, what, nil, true)
  if not res then return nil, msg, code, d end
  local t, m2, c2, d2 = decode_array(res, what)
  if not t then return nil, m2, c2, d2 end
  local out = {}
  for i, c in ipairs(t) do out[i] = to_context(c) end
  return out
end

--- Restarts a context's kernel (its id is kept, its state lost).
-- @treturn[1] boolean true
-- @return[2] nil, msg, code, detail ("NOT_FOUND" for an unknown context)
function Sandbox:restart_context(id)
  check_sandbox(self, "restart_context")
  argcheck(type(id) == "string" and id ~= "", 1, "restart_context", "context id expected")
  local what = ("restart context '%s' in sandbox '%s'"):format(id, self.sandbox_id)
  local res, msg, code, d = interp_call(self, "POST", "/contexts/" .. uri_component(id) .. "/restart", nil, what,
    ("context '%s' not found"):format(id))
  if not res then return nil, msg, code, d end
  return true
end

--- Deletes a context.
-- @treturn[1] boolean true
-- @return[2] nil, msg, code, detail ("NOT_FOUND" for an unknown context)
function Sandbox:delete_context(id)
  check_sandbox(self, "delete_context")
  argcheck(type(id) == "string" and id ~= "", 1, "delete_context", "context id expected")
  local what = ("delete context '%s' in sandbox '%s'"):format(id, self.sandbox_id)
  local res, msg, code, d = interp_call(self, "DELETE", "/contexts/" .. uri_component(id), nil, what,
    ("context '%s' not found"):format(id))
  if not res then return nil, msg, code, d end
  return true
end

return _M
