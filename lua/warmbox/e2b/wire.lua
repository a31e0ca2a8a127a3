--- E2B's wire encodings: camelCase JSON to snake_case tables, the URI and
-- metadata-filter encodings, multipart bodies, the Connect envelope and
-- Connect's error codes, and failures made from E2B's answers. No I/O.
-- @module warmbox.e2b.wire
local json = require "warmbox.json"
local errors = require "warmbox.errors"

local type, pairs, ipairs, tostring, tonumber = type, pairs, ipairs, tostring, tonumber
local string_char, string_byte, string_format = string.char, string.byte, string.format
local table_concat, table_sort = table.concat, table.sort
local math_random = math.random

local _M = {}

-- ======================================================================
-- URI and metadata-filter encodings
-- ======================================================================

--- encodeURIComponent: everything but A-Z a-z 0-9 - _ . ! ~ * ' ( ) escaped.
local function uri_component(s)
  return (s:gsub("[^%w%-_%.!~%*'%(%)]", function(c) return string_format("%%%02X", string_byte(c)) end))
end
_M.uri_component = uri_component

--- application/x-www-form-urlencoded (WHATWG): A-Z a-z 0-9 * - . _ kept, space -> +.
local function form_component(s)
  return (s:gsub("[^%w%*%-%._ ]", function(c) return string_format("%%%02X", string_byte(c)) end):gsub(" ", "+"))
end

--- The three-layer metadata filter encoding of the official SDKs (E2B's API,
-- metadata filters): pct(k)=pct(v) pairs form-joined, then the whole value
-- escaped again.
-- Keys are sorted so the URL is deterministic.
-- @tparam table metadata
-- @treturn string the value of the `metadata` query parameter, as sent
-- syntax: q = wire.encode_metadata(metadata) (re-exported as `e2b.encode_metadata`)
function _M.encode_metadata(metadata)
  local keys = {}
  for k in pairs(metadata) do keys[#keys + 1] = k end
  table_sort(keys)
  local pairs_ = {}
  for i, k in ipairs(keys) do
    pairs_[i] = form_component(uri_component(k)) .. "=" .. form_component(uri_component(metadata[k]))
  end
  return uri_component(table_concat(pairs_, "&"))
end

-- ======================================================================
-- Failures from E2B's answers
-- ======================================================================

local function lower(s)
  return (tostring(s):lower())
end

-- E2B's message from an error body: JSON {message} (control plane, proxy,
-- Connect errors), FastAPI {detail}, or plain text.
local function body_message(body)
  if type(body) ~= "string" or body == "" then return nil end
  local v = json.decode(body)
  if type(v) == "table" then
    if type(v.message) == "string" then return v.message end
    if type(v.detail) == "string" then return v.detail end
  end
  local text = body:gsub("^%s+", ""):gsub("%s+$", "")
  if #text > 300 then text = text:sub(1, 300) .. "..." end
  return text
end

-- nil, msg, code, detail for a non-success response.
local function http_failure(res, what, data_plane, not_found_msg)
  local status = res.status
  local message = body_message(res.body) or ""
  local code = errors.code_for_status(status, data_plane)
  local msg
  if status == 404 and not_found_msg then
    msg = not_found_msg
  elseif code == "SANDBOX_GONE" then
    msg = what .. ": the sandbox is gone or paused (http 502)"
    if message ~= "" then msg = msg .. ": " .. lower(message) end
  elseif message ~= "" then
    msg = ("%s: http %d: %s"):format(what, status, lower(message))
  else
    msg = ("%s: http %d"):format(what, status)
  end
  return nil, msg, code, errors.detail(status, message)
end

-- `sent`: the core's word on whether the request may have reached the server
-- (false only when it provably did not: connection refused, connect timeout).
local function transport_failure(what, msg, code, sent)
  return nil, what .. ": " .. tostring(msg), code, errors.detail(nil, msg, { sent = sent ~= false })
end
-- The decoded JSON object of a success answer, or nil, msg, "HTTP", detail.
local function decode_body(res, what)
  local t, err = json.decode(res.body)
  if type(t) ~= "table" then
    return nil, what .. ": invalid json in the response: " .. tostring(err), "HTTP",
      errors.detail(res.status, res.body)
  end
  return t
end

-- The decoded JSON array of objects of a success answer, or nil, msg,
-- "PROTOCOL" (an object, or an item that is no object: never an empty list),
-- or nil, msg, "HTTP" for a body that is not JSON. `want(item)` may say an
-- item lacks what it must have.
local function decode_array(res, what, want)
  local arr, m, c, d = decode_body(res, what)
  if not arr then return nil, m, c, d end
  if not res.body:match("^%s*%[") then
    return nil, what .. ": the answer is not a JSON array", "PROTOCOL", errors.detail(res.status, res.body)
  end
  local n = 0
  for _ in pairs(arr) do n = n + 1 end
  for i = 1, n do
    if type(arr[i]) ~= "table" or (want and not want(arr[i])) then
      return nil, ("%s: item %d of the answer is not the object it should be"):format(what, i), "PROTOCOL",
        errors.detail(res.status, res.body)
    end
  end
  return arr
end

-- One page from h:request's answer, for `what` ("list sandboxes"): each
-- element that passes `has_id` turned into an item by `item` (nil: left out).
-- → items, token_used, next_token | false, msg, code, token_used, detail.
local function read_page(res, msg, code, sent, used, what, has_id, item)
  local _, m, c, d
  if not res then
    _, m, c, d = transport_failure(what, msg, code, sent)
  elseif res.status < 200 or res.status > 299 then
    _, m, c, d = http_failure(res, what)
  end
  if m then return false, m, c, used, d end
  local arr
  arr, m, c, d = decode_array(res, what, has_id)
  if not arr then return false, m, c, used, d end
  local items = {}
  for _, t in ipairs(arr) do
    local it = item(t)
    if it ~= nil then items[#items + 1] = it end
  end
  local nxt = res.headers["x-next-token"]
  if nxt == "" then nxt = nil end
  return items, used, nxt
end

_M.read_page = read_page

--- A listing's (or a client's) `max_pages` option: an integer >= 1 or nil;
-- raises at `level` as error's, counted from this function's caller.
function _M.check_max_pages(opts, fname, level)
  local mp = opts.max_pages
  if mp ~= nil and not (mp >= 1 and mp == math.floor(mp)) then
    errors.bad_option(1, fname, "max_pages", "an integer >= 1 expected, got " .. tostring(mp), level)
  end
end
_M.lower = lower
_M.body_message = body_message
_M.decode_body = decode_body
_M.decode_array = decode_array
_M.http_failure = http_failure
_M.transport_failure = transport_failure

-- ======================================================================
-- Conversions (camelCase wire -> snake_case tables)
-- ======================================================================

local v = json.value

local function to_sandbox(t)
  return {
    sandbox_id = v(t.sandboxID), template_id = v(t.templateID), client_id = v(t.clientID),
    envd_version = v(t.envdVersion), envd_access_token = v(t.envdAccessToken),
    traffic_access_token = v(t.trafficAccessToken), domain = v(t.domain), alias = v(t.alias),
  }
end

local function to_metadata(m)
  if type(m) ~= "table" then return {} end
  local out = {}
  for k, x in pairs(m) do
    if type(x) == "string" then out[k] = x end
  end
  return out
end

local function to_detail(t)
  local d = to_sandbox(t)
  d.started_at = v(t.startedAt)
  d.end_at = v(t.endAt)
  d.state = v(t.state)
  d.metadata = to_metadata(v(t.metadata))
  d.cpu_count = v(t.cpuCount)
  d.memory_mb = v(t.memoryMB)
  d.disk_size_mb = v(t.diskSizeMB)
  d.allow_internet_access = v(t.allowInternetAccess)
  local lc = v(t.lifecycle)
  if type(lc) == "table" then
    d.lifecycle = { on_timeout = v(lc.onTimeout), auto_resume = v(lc.autoResume) }
  end
  return d
end

local FILE_TYPES = { FILE_TYPE_FILE = "file", FILE_TYPE_DIRECTORY = "dir", FILE_TYPE_SYMLINK = "symlink",
  file = "file", dir = "dir", directory = "dir", symlink = "symlink" }

local function to_entry(e)
  if type(e) ~= "table" then return nil end
  return {
    name = v(e.name), path = v(e.path), type = FILE_TYPES[v(e.type)] or v(e.type),
    size = tonumber(v(e.size)) or 0, mode = v(e.mode), permissions = v(e.permissions),
    owner = v(e.owner), group = v(e.group), modified_time = v(e.modifiedTime),
    symlink_target = v(e.symlinkTarget), metadata = to_metadata(v(e.metadata)),
  }
end

local function to_context(t)
  return { id = v(t.id), language = v(t.language), cwd = v(t.cwd) }
end

-- A snapshot as the client hands it out: `{ snapshot_id, names }`.
local function to_snapshot(t)
  local names = {}
  if type(t.names) == "table" then
    for _, n in ipairs(t.names) do
      if type(n) == "string" then names[#names + 1] = n end
    end
  end
  return { snapshot_id = json.value(t.snapshotID), names = names }
end

-- The `/snapshots` URL path and query of one page.
-- syntax: path = e2b.snapshots_path(opts, token)
local function snapshots_path(opts, token)
  local q = {}
  if opts.sandbox_id then q[#q + 1] = "sandboxID=" .. uri_component(opts.sandbox_id) end
  if opts.name then q[#q + 1] = "name=" .. uri_component(opts.name) end
  if opts.limit then q[#q + 1] = "limit=" .. tostring(math.floor(opts.limit)) end
  if token then q[#q + 1] = "nextToken=" .. uri_component(token) end
  if #q == 0 then return "/snapshots" end
  return "/snapshots?" .. table_concat(q, "&")
end
_M.to_snapshot, _M.snapshots_path = to_snapshot, snapshots_path

_M.to_sandbox, _M.to_metadata, _M.to_detail, _M.to_entry, _M.to_context =
  to_sandbox, to_metadata, to_detail, to_entry, to_context
_M.FILE_TYPES = FILE_TYPES

local RESULT_KEYS = { "text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json",
  "javascript", "data", "chart", "is_main_result", "extra" }
_M.RESULT_KEYS = RESULT_KEYS

local clean = json.utf8_clean

-- Cuts s to at most n bytes without splitting a UTF-8 sequence.
local function cut_utf8(s, n)
  if n <= 0 then return "" end
  if #s <= n then return s end
  local i = n + 1
  while i > 1 and (string_byte(s, i) or 0) & 0xC0 == 0x80 do i = i - 1 end
  return s:sub(1, i - 1)
end
_M.cut_utf8 = cut_utf8

-- The forms of a result a cut keeps (text; a cut image or structure is broken).
local CUT_KEYS = { "text", "html", "markdown", "svg", "latex", "javascript" }

--- Result `r` cut to `room` bytes of its text forms (an output cap), or nil
-- when none is left.
function _M.cut_result(r, room)
  local kept, any = { is_main_result = r.is_main_result, extra = {} }, false
  for _, k in ipairs(CUT_KEYS) do
    local s = r[k]
    if type(s) == "string" and room > 0 then
      s = cut_utf8(s, room)
      room = room - #s
      if s ~= "" then kept[k], any = s, true end
    end
  end
  return any and kept or nil
end

local function clean_tree(x, depth)
  if type(x) == "string" then return clean(x) end
  if type(x) ~= "table" or depth > 32 then return x end
  for k, y in pairs(x) do x[k] = clean_tree(y, depth + 1) end
  return x
end
_M.clean_tree = clean_tree

-- ======================================================================
-- Bodies: multipart/form-data and the Connect envelope
-- ======================================================================

local function multipart(files)
  local boundary
  repeat
    boundary = ("warmbox-%08x%08x"):format(math_random(0, 0x7fffffff), math_random(0, 0x7fffffff))
    local clash = false
    for _, f in ipairs(files) do
      if f.data:find(boundary, 1, true) or f.path:find(boundary, 1, true) then clash = true end
    end
  until not clash
  local parts = {}
  for _, f in ipairs(files) do
    local name = f.path:gsub('[\r\n"]', function(c) return string_format("%%%02X", string_byte(c)) end)
    parts[#parts + 1] = "--" .. boundary .. "\r\n" ..
      'Content-Disposition: form-data; name="file"; filename="' .. name .. '"\r\n' ..
      "Content-Type: application/octet-stream\r\n\r\n" .. f.data .. "\r\n"
  end
  parts[#parts + 1] = "--" .. boundary .. "--\r\n"
  return table_concat(parts), "multipart/form-data; boundary=" .. boundary
end
_M.multipart = multipart

local CONNECT_CODES = {
  canceled = "ABORTED", invalid_argument = "BAD_REQUEST", failed_precondition = "BAD_REQUEST",
  out_of_range = "BAD_REQUEST", deadline_exceeded = "TIMEOUT", not_found = "NOT_FOUND",
  already_exists = "CONFLICT", aborted = "CONFLICT", permission_denied = "AUTH", unauthenticated = "AUTH",
  resource_exhausted = "RATE_LIMITED", unavailable = "SANDBOX_GONE",
}

local function envelope(s)
  local n = #s
  return string_char(0, (n >> 24) & 255, (n >> 16) & 255, (n >> 8) & 255, n & 255) .. s
end
_M.CONNECT_CODES = CONNECT_CODES
_M.envelope = envelope

return _M
