--- warmbox.e2b: an E2B client (control plane and data plane) over warmbox.core.
--
-- Runtime failures return `nil, message, CODE, detail` where `detail` is
-- `{ status = <http status>, message = <E2B's message> }`; misuse (wrong
-- argument types, unknown option keys) raises. Tables use snake_case.
--
-- Iterators (`list`, `list_pages`) yield `false, message, code, token, detail`
-- on an error: `false` rather than `nil` so that a generic `for` loop sees the
-- error instead of silently stopping.
-- @module warmbox.e2b
local core = require "warmbox.core"
local json = require "warmbox.json"
local errors = require "warmbox.errors"

local type, pairs, ipairs, tostring, tonumber, setmetatable, getmetatable, error, next =
  type, pairs, ipairs, tostring, tonumber, setmetatable, getmetatable, error, next
local string_char, string_byte, string_format = string.char, string.byte, string.format
local table_concat, table_sort = table.concat, table.sort
local math_ceil, math_type, math_random = math.ceil, math.type, math.random
local os_getenv = os.getenv

local _M = { _VERSION = "0.1.0" }

local DEFAULT_DOMAIN = "e2b.app"
local ENVD_PORT = 49983
local INTERP_PORT = 49999
local DEFAULT_SANDBOX_TIMEOUT = 300

local Client = { __name = "warmbox.e2b.Client" }
Client.__index = Client
local Sandbox = { __name = "warmbox.e2b.Sandbox" }
Sandbox.__index = Sandbox

-- ======================================================================
-- Helpers
-- ======================================================================

local function argcheck(cond, n, fname, msg)
  if not cond then error(("bad argument #%d to '%s' (%s)"):format(n, fname, msg), 3) end
end

local function opt_table(v, n, fname)
  if v == nil then return {} end
  argcheck(type(v) == "table", n, fname, "table expected, got " .. type(v))
  return v
end

local function check_type(v, want, name, level)
  if v ~= nil and type(v) ~= want then
    error(("option '%s' must be a %s, got %s"):format(name, want, type(v)), level + 1)
  end
end

local function check_fields(t, allowed, what)
  errors.check_fields(t, allowed, what, 3)
end

local function check_string_map(t, name, level)
  if t == nil then return end
  if type(t) ~= "table" then error(("option '%s' must be a table"):format(name), level + 1) end
  for k, v in pairs(t) do
    if type(k) ~= "string" or type(v) ~= "string" then
      error(("option '%s' must map strings to strings"):format(name), level + 1)
    end
  end
end

local function copy_map(t)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  return out
end

local function ceil_seconds(s)
  return math_ceil(s)
end

--- encodeURIComponent: everything but A-Z a-z 0-9 - _ . ! ~ * ' ( ) escaped.
local function uri_component(s)
  return (s:gsub("[^%w%-_%.!~%*'%(%)]", function(c) return string_format("%%%02X", string_byte(c)) end))
end
_M._uri_component = uri_component

--- application/x-www-form-urlencoded (WHATWG): A-Z a-z 0-9 * - . _ kept, space -> +.
local function form_component(s)
  return (s:gsub("[^%w%*%-%._ ]", function(c) return string_format("%%%02X", string_byte(c)) end):gsub(" ", "+"))
end

--- The three-layer metadata filter encoding of the official SDKs (e2b-api.md
-- 1.5): pct(k)=pct(v) pairs form-joined, then the whole value escaped again.
-- Keys are sorted so the URL is deterministic.
-- @tparam table metadata
-- @treturn string the value of the `metadata` query parameter, as sent
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

local function path_segment(s)
  return uri_component(s)
end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local B64_DEC = {}
for i = 1, 64 do B64_DEC[string_byte(B64, i)] = i - 1 end
B64_DEC[string_byte("-")] = 62
B64_DEC[string_byte("_")] = 63

--- Standard (or URL-safe) base64 decoding; padding optional.
-- @tparam string s
-- @treturn string|nil
function _M.base64_decode(s)
  s = s:gsub("[%s=]", "")
  local out, n = {}, 0
  local len = #s
  local i = 1
  while i <= len do
    local a, b, c, d = string_byte(s, i, i + 3)
    local va, vb = B64_DEC[a], B64_DEC[b]
    if va == nil or vb == nil then return nil end
    local vc, vd = c and B64_DEC[c], d and B64_DEC[d]
    if (c and vc == nil) or (d and vd == nil) then return nil end
    local v = va * 262144 + vb * 4096 + (vc or 0) * 64 + (vd or 0)
    n = n + 1
    if d then
      out[n] = string_char(v >> 16, (v >> 8) & 255, v & 255)
    elseif c then
      out[n] = string_char(v >> 16, (v >> 8) & 255)
    else
      out[n] = string_char(v >> 16)
    end
    i = i + 4
  end
  return table_concat(out)
end

--- Standard base64 encoding with padding.
-- @tparam string s
-- @treturn string
function _M.base64_encode(s)
  return (s:gsub("..?.?", function(c)
    local a, b, cc = string_byte(c, 1, 3)
    local n = a * 65536 + (b or 0) * 256 + (cc or 0)
    local function at(i) return B64:sub(i + 1, i + 1) end
    return at(n >> 18) .. at((n >> 12) & 63) .. (b and at((n >> 6) & 63) or "=") .. (cc and at(n & 63) or "=")
  end))
end

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

-- ======================================================================
-- The client
-- ======================================================================

local client_fields = { "api_key", "api_url", "sandbox_url", "domain", "request_timeout", "retries",
  "connect_timeout", "proxy", "ca_file", "user_agent", "max_connections" }

--- Creates a client.
-- @tparam[opt] table opts `api_key` (default `E2B_API_KEY`), `api_url` (`E2B_API_URL`, else
--   `https://api.<domain>`), `sandbox_url` (`E2B_SANDBOX_URL`, else the per-port host
--   `https://<port>-<id>.<domain>`), `domain` (`E2B_DOMAIN`, default `e2b.app`),
--   `request_timeout` (60 s), `retries` (3: attempts after the first for idempotent calls),
--   `connect_timeout` (5 s), `proxy`, `ca_file`, `user_agent`, `max_connections`.
-- @treturn warmbox.e2b.Client
function _M.new(opts)
  opts = opt_table(opts, 1, "new")
  check_fields(opts, client_fields, "e2b.new")
  for _, k in ipairs({ "api_key", "api_url", "sandbox_url", "domain", "ca_file", "user_agent" }) do
    check_type(opts[k], "string", k, 2)
  end
  for _, k in ipairs({ "request_timeout", "retries", "connect_timeout", "max_connections" }) do
    check_type(opts[k], "number", k, 2)
  end
  if opts.proxy ~= nil and opts.proxy ~= false then check_type(opts.proxy, "string", "proxy", 2) end
  local function env(name)
    local s = os_getenv(name)
    if s == "" then return nil end
    return s
  end
  local api_key = opts.api_key or env("E2B_API_KEY")
  if not api_key or api_key == "" then
    error("an api_key is required (option 'api_key' or E2B_API_KEY)", 2)
  end
  local domain = opts.domain or env("E2B_DOMAIN") or DEFAULT_DOMAIN
  local api_url = opts.api_url or env("E2B_API_URL") or ("https://api." .. domain)
  local sandbox_url = opts.sandbox_url or env("E2B_SANDBOX_URL")
  local retries = opts.retries or 3
  if retries < 0 or retries > 100 or retries ~= math.floor(retries) then
    error("bad option 'retries' to 'new' (integer 0..100 expected, got " .. tostring(retries) .. ")", 2)
  end
  for _, k in ipairs({ "request_timeout", "connect_timeout" }) do
    local t = opts[k]
    if t ~= nil and not (t > 0 and t <= 86400) then
      error(("bad option '%s' to 'new' (seconds in (0, 86400] expected, got %s)"):format(k, tostring(t)), 2)
    end
  end
  if opts.max_connections ~= nil and not (opts.max_connections >= 1 and opts.max_connections <= 10000) then
    error("bad option 'max_connections' to 'new' (1..10000 expected, got " .. tostring(opts.max_connections) .. ")", 2)
  end
  local http, msg = core.http{
    timeout = opts.request_timeout or 60, connect_timeout = opts.connect_timeout or 5,
    proxy = opts.proxy, ca_file = opts.ca_file, max_connections = opts.max_connections,
    user_agent = opts.user_agent or ("warmbox/" .. _M._VERSION),
  }
  if not http then error("cannot create the http client: " .. tostring(msg), 2) end
  local self = {
    api_url = (api_url:gsub("/+$", "")),
    sandbox_url = sandbox_url and (sandbox_url:gsub("/+$", "")) or nil,
    domain = domain,
    request_timeout = opts.request_timeout or 60,
    http = http,
    retry = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2 },
    retry_idem = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2, idempotent = true },
    retry_create = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2, refused = { 429, 503 } },
    -- An execute answered 429/503 (before any stream byte) was not accepted.
    exec_retry = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2, statuses = {},
      refused = { 429, 503 } },
    -- The data plane: a 502 from the sandbox proxy means the sandbox is gone
    -- or paused, not a passing failure, so it is not retried.
    dp_retry = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2, statuses = { 429, 503, 504 } },
    dp_retry_idem = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2, idempotent = true,
      statuses = { 429, 503, 504 } },
    -- transport: nil (requests go to http) or an object with http's request,
    -- batch and pages methods (warmbox.runner's: the engine inside a task).
    -- The key lives only in this header table, never in messages.
    api_headers = { ["X-API-Key"] = api_key, ["Accept"] = "application/json" },
    json_headers = { ["X-API-Key"] = api_key, ["Accept"] = "application/json",
      ["Content-Type"] = "application/json" },
  }
  return setmetatable(self, Client)
end

function Client:__tostring()
  return ("warmbox.e2b.Client: %s"):format(self.api_url)
end

--- Closes the client's connections (idempotent).
function Client:close()
  self.http:close()
end
Client.__close = Client.close

local function check_client(self, fname)
  if getmetatable(self) ~= Client then
    error(("bad argument #1 to '%s' (warmbox.e2b.Client expected, got %s)"):format(fname, type(self)), 3)
  end
end

-- A control-plane call; returns res (any status) or nil, msg, code, detail.
local function api(self, method, path, body, what, idempotent, retry)
  local req = {
    method = method, url = self.api_url .. path,
    headers = body ~= nil and self.json_headers or self.api_headers,
    retry = retry or (idempotent and self.retry_idem or self.retry),
  }
  if body ~= nil then
    local s, err = json.encode(body)
    if not s then return nil, what .. ": cannot encode the request: " .. tostring(err), "BAD_REQUEST" end
    req.body = s
  end
  local res, msg, code, sent = (self.transport or self.http):request(req)
  if not res then return transport_failure(what, msg, code, sent) end
  return res
end

local function check_id(id, n, fname)
  if type(id) == "table" then id = id.sandbox_id end
  argcheck(type(id) == "string" and id ~= "", n, fname, "sandbox id expected, got " .. type(id))
  return id
end

local function decode_body(res, what)
  local t, err = json.decode(res.body)
  if type(t) ~= "table" then
    return nil, what .. ": invalid json in the response: " .. tostring(err), "HTTP",
      errors.detail(res.status, res.body)
  end
  return t
end

local create_fields = { "template", "timeout", "metadata", "env_vars", "lifecycle", "secure",
  "allow_internet_access", "network" }
local lifecycle_fields = { "on_timeout", "auto_resume", "keep_memory" }

--- Builds the create body (exposed for specs).
-- @return[1] table the body
-- @return[2] nil, msg, "BAD_REQUEST"
function _M.create_body(opts)
  local body = { templateID = opts.template or "base" }
  local timeout = opts.timeout or DEFAULT_SANDBOX_TIMEOUT
  if timeout <= 0 then return nil, "create: timeout must be greater than 0", "BAD_REQUEST" end
  body.timeout = ceil_seconds(timeout)
  body.secure = opts.secure ~= false
  body.allow_internet_access = opts.allow_internet_access ~= false
  if opts.metadata ~= nil then body.metadata = copy_map(opts.metadata) end
  if opts.env_vars ~= nil then body.envVars = copy_map(opts.env_vars) end
  if opts.network ~= nil then body.network = opts.network end
  local lc = opts.lifecycle
  if lc ~= nil then
    local on_timeout, auto_resume, keep_memory = lc.on_timeout, lc.auto_resume, lc.keep_memory
    if on_timeout ~= nil and on_timeout ~= "pause" and on_timeout ~= "kill" then
      return nil, "create: lifecycle.on_timeout must be 'pause' or 'kill'", "BAD_REQUEST"
    end
    if auto_resume and on_timeout ~= "pause" then
      return nil, "create: lifecycle.auto_resume requires on_timeout 'pause'", "BAD_REQUEST"
    end
    if keep_memory ~= nil and on_timeout ~= "pause" then
      return nil, "create: lifecycle.keep_memory requires on_timeout 'pause'", "BAD_REQUEST"
    end
    if keep_memory == false and auto_resume then
      return nil, "create: lifecycle.keep_memory = false cannot be combined with auto_resume", "BAD_REQUEST"
    end
    if on_timeout ~= nil then body.autoPause = on_timeout == "pause" end
    if keep_memory ~= nil then body.autoPauseMemory = keep_memory end
    if auto_resume ~= nil then body.autoResume = { enabled = auto_resume } end
  end
  return body
end

--- Creates a sandbox.
-- @tparam[opt] table opts `template` ("base"), `timeout` (300 s), `metadata`, `env_vars`,
--   `lifecycle = { on_timeout = "pause"|"kill", auto_resume, keep_memory }`, `secure` (true),
--   `allow_internet_access` (true), `network` (passed through).
-- @treturn[1] table sandbox `{ sandbox_id, template_id, client_id, envd_version,
--   envd_access_token, domain, alias }`
-- @return[2] nil, msg, code, detail
function Client:create(opts)
  check_client(self, "create")
  opts = opt_table(opts, 1, "create")
  check_fields(opts, create_fields, "create")
  check_type(opts.template, "string", "template", 2)
  check_type(opts.timeout, "number", "timeout", 2)
  check_string_map(opts.metadata, "metadata", 2)
  check_string_map(opts.env_vars, "env_vars", 2)
  check_type(opts.secure, "boolean", "secure", 2)
  check_type(opts.allow_internet_access, "boolean", "allow_internet_access", 2)
  check_type(opts.network, "table", "network", 2)
  check_type(opts.lifecycle, "table", "lifecycle", 2)
  if opts.lifecycle then
    check_fields(opts.lifecycle, lifecycle_fields, "lifecycle")
    check_type(opts.lifecycle.on_timeout, "string", "lifecycle.on_timeout", 2)
    check_type(opts.lifecycle.auto_resume, "boolean", "lifecycle.auto_resume", 2)
    check_type(opts.lifecycle.keep_memory, "boolean", "lifecycle.keep_memory", 2)
  end
  local body, msg, code = _M.create_body(opts)
  if not body then return nil, msg, code, errors.detail(nil, msg) end
  -- E2B's 429 (and a 503) on create means nothing was created: retried,
  -- honouring Retry-After within the retry budget.
  local res, m2, c2, d2 = api(self, "POST", "/sandboxes", body, "create sandbox", false, self.retry_create)
  if not res then return nil, m2, c2, d2 end
  if res.status ~= 201 and res.status ~= 200 then
    return http_failure(res, "create sandbox")
  end
  local t, m3, c3, d3 = decode_body(res, "create sandbox")
  if not t then return nil, m3, c3, d3 end
  return to_sandbox(t), nil
end

local list_fields = { "state", "metadata", "limit", "order", "next_token", "template", "started_after" }

--- Builds the `/v2/sandboxes` URL path and query (exposed for specs).
function _M.list_path(opts)
  local q = {}
  local state = opts.state
  if type(state) == "table" then
    if #state > 0 then q[#q + 1] = "state=" .. table_concat(state, ",") end
  elseif type(state) == "string" then
    q[#q + 1] = "state=" .. state
  end
  if opts.metadata and next(opts.metadata) ~= nil then
    q[#q + 1] = "metadata=" .. _M.encode_metadata(opts.metadata)
  end
  if opts.limit then q[#q + 1] = "limit=" .. tostring(math.floor(opts.limit)) end
  if opts.order then q[#q + 1] = "order=" .. uri_component(opts.order) end
  if opts.template then q[#q + 1] = "template=" .. uri_component(opts.template) end
  if opts.started_after then q[#q + 1] = "startedAfter=" .. uri_component(opts.started_after) end
  if #q == 0 then return "/v2/sandboxes" end
  return "/v2/sandboxes?" .. table_concat(q, "&")
end

local function check_list_opts(opts)
  check_fields(opts, list_fields, "list")
  if opts.state ~= nil and type(opts.state) ~= "string" then
    if type(opts.state) ~= "table" then error("option 'state' must be a string or a list", 3) end
    for _, s in ipairs(opts.state) do
      if type(s) ~= "string" then error("option 'state' must list strings", 3) end
    end
  end
  check_string_map(opts.metadata, "metadata", 3)
  check_type(opts.limit, "number", "limit", 3)
  check_type(opts.order, "string", "order", 3)
  check_type(opts.next_token, "string", "next_token", 3)
  check_type(opts.template, "string", "template", 3)
  check_type(opts.started_after, "string", "started_after", 3)
end

-- Exact client-side re-check of the metadata filter: a loose server must
-- never hand one tenant's sandbox to another.
local function metadata_matches(item, filter)
  if not filter then return true end
  local m = item.metadata or {}
  for k, x in pairs(filter) do
    if m[k] ~= x then return false end
  end
  return true
end

--- Iterates over pages of listed sandboxes.
-- `for items, token_used, next_token in c:list_pages(opts) do ... end`; on an
-- error the loop gets `false, msg, code, token, detail` and then stops.
function Client:list_pages(opts)
  check_client(self, "list_pages")
  opts = opt_table(opts, 1, "list_pages")
  check_list_opts(opts)
  local filter = opts.metadata and copy_map(opts.metadata)
  local pages = (self.transport or self.http):pages{
    url = self.api_url .. _M.list_path(opts), headers = self.api_headers,
    next_token = opts.next_token, retry = self.retry,
  }
  local finished = false
  return function()
    if finished then return nil end
    local body, token, res, extra1, extra2 = pages()
    if body == nil then
      finished = true
      return nil
    end
    if body == false then
      finished = true
      local msg, code = token, res
      if extra2 then
        local _, m, c, d = http_failure(extra2, "list sandboxes")
        return false, m, c, extra1, d
      end
      local _, m, c, d = transport_failure("list sandboxes", msg, code)
      return false, m, c, extra1, d
    end
    local arr, err = json.decode(body)
    if type(arr) ~= "table" then
      finished = true
      return false, "list sandboxes: invalid json in the response: " .. tostring(err), "HTTP", token,
        errors.detail(res.status, body)
    end
    local items = {}
    for _, t in ipairs(arr) do
      local d = to_detail(t)
      if metadata_matches(d, filter) then items[#items + 1] = d end
    end
    local nxt = res.headers["x-next-token"]
    if nxt == "" then nxt = nil end
    return items, token or false, nxt
  end
end

--- Iterates over listed sandboxes, following every page.
-- @tparam[opt] table opts `state` ("running", "paused" or a list; default both),
--   `metadata` (exact AND filter, re-checked client-side), `limit` (page size, 1..100),
--   `order` ("asc"|"desc"), `next_token` (resume from a page), `template`, `started_after`.
-- @return an iterator: `for item in c:list(opts) do ... end`; on an error the loop
--   gets `false, msg, code, token (the page it failed at), detail`, then stops.
function Client:list(opts)
  check_client(self, "list")
  local pages = self:list_pages(opts)
  local items, i = nil, 0
  local finished = false
  return function()
    while not finished do
      if items and i < #items then
        i = i + 1
        return items[i]
      end
      local page, a, b, c, d = pages()
      if page == nil then
        finished = true
        return nil
      end
      if page == false then
        finished = true
        return false, a, b, c, d
      end
      items, i = page, 0
    end
    return nil
  end
end

--- Lists every matching sandbox (all pages).
-- @treturn[1] table items
-- @return[2] nil, msg, code, detail
function Client:list_all(opts)
  check_client(self, "list_all")
  local out = {}
  for item, msg, code, _, detail in self:list(opts) do
    if item == false then return nil, msg, code, detail end
    out[#out + 1] = item
  end
  return out
end

--- Details of one sandbox (running or paused).
-- @treturn[1] table detail (see the module doc for the fields)
-- @return[2] nil, msg, code, detail ("NOT_FOUND" when unknown)
function Client:info(id)
  check_client(self, "info")
  id = check_id(id, 1, "info")
  local what = ("info of sandbox '%s'"):format(id)
  local res, msg, code, d = api(self, "GET", "/sandboxes/" .. path_segment(id), nil, what)
  if not res then return nil, msg, code, d end
  if res.status ~= 200 then
    return http_failure(res, what, false, ("sandbox '%s' not found"):format(id))
  end
  local t, m2, c2, d2 = decode_body(res, what)
  if not t then return nil, m2, c2, d2 end
  return to_detail(t)
end

--- Connects to a sandbox, resuming it when paused.
-- @tparam string id
-- @tparam[opt] table opts `timeout` (300 s: the lease from now)
-- @treturn[1] table sandbox
-- @treturn[1] boolean resumed (true when it was paused: HTTP 201)
-- @return[2] nil, msg, code, detail
function Client:connect(id, opts)
  check_client(self, "connect")
  id = check_id(id, 1, "connect")
  opts = opt_table(opts, 2, "connect")
  check_fields(opts, { "timeout" }, "connect")
  check_type(opts.timeout, "number", "timeout", 2)
  local timeout = opts.timeout or DEFAULT_SANDBOX_TIMEOUT
  if timeout < 0 then error("option 'timeout' must be >= 0", 2) end
  local what = ("connect to sandbox '%s'"):format(id)
  local res, msg, code, d = api(self, "POST", "/sandboxes/" .. path_segment(id) .. "/connect",
    { timeout = ceil_seconds(timeout) }, what, true)
  if not res then return nil, msg, code, d end
  if res.status ~= 200 and res.status ~= 201 then
    return http_failure(res, what, false, ("sandbox '%s' not found"):format(id))
  end
  local t, m2, c2, d2 = decode_body(res, what)
  if not t then return nil, m2, c2, d2 end
  return to_sandbox(t), res.status == 201
end

--- Pauses a sandbox (synchronous).
-- @tparam string id
-- @tparam[opt] table opts `memory` (true: keep memory; false: filesystem only)
-- @treturn[1] boolean true when paused, false when it was already paused
-- @return[2] nil, msg, code, detail
function Client:pause(id, opts)
  check_client(self, "pause")
  id = check_id(id, 1, "pause")
  opts = opt_table(opts, 2, "pause")
  check_fields(opts, { "memory" }, "pause")
  check_type(opts.memory, "boolean", "memory", 2)
  local what = ("pause sandbox '%s'"):format(id)
  local res, msg, code, d = api(self, "POST", "/sandboxes/" .. path_segment(id) .. "/pause",
    { memory = opts.memory ~= false }, what)
  if not res then return nil, msg, code, d end
  if res.status == 204 or res.status == 200 then return true end
  if res.status == 409 then return false end
  return http_failure(res, what, false, ("sandbox '%s' not found"):format(id))
end

--- Kills a sandbox (running or paused).
-- @treturn[1] boolean true when killed, false when it was already gone
-- @return[2] nil, msg, code, detail
function Client:kill(id)
  check_client(self, "kill")
  id = check_id(id, 1, "kill")
  local what = ("kill sandbox '%s'"):format(id)
  local res, msg, code, d = api(self, "DELETE", "/sandboxes/" .. path_segment(id), nil, what)
  if not res then return nil, msg, code, d end
  if res.status == 204 or res.status == 200 then return true end
  if res.status == 404 then return false end
  return http_failure(res, what)
end

--- Kills many sandboxes in parallel (libcurl's multi interface, bounded).
-- Not in HACKING's contract: an extension `warmbox.gc` uses when present.
-- @tparam table ids sandbox ids (or sandbox tables)
-- @tparam[opt] table opts `concurrency` (8)
-- @treturn table one entry per id, in order: `{ true }` (killed), `{ false }` (already gone)
--   or `{ nil, msg, code, detail }`
function Client:kill_many(ids, opts)
  check_client(self, "kill_many")
  argcheck(type(ids) == "table", 1, "kill_many", "table expected, got " .. type(ids))
  opts = opt_table(opts, 2, "kill_many")
  check_fields(opts, { "concurrency" }, "kill_many")
  check_type(opts.concurrency, "number", "concurrency", 2)
  local reqs, list = {}, {}
  for i, id in ipairs(ids) do
    id = check_id(id, 1, "kill_many")
    list[i] = id
    reqs[i] = { method = "DELETE", url = self.api_url .. "/sandboxes/" .. path_segment(id),
      headers = self.api_headers, retry = self.retry }
  end
  local out = {}
  if #reqs == 0 then return out end
  local results = (self.transport or self.http):batch(reqs, { concurrency = opts.concurrency or 8 })
  for i, r in ipairs(results) do
    local what = ("kill sandbox '%s'"):format(list[i])
    local res = r[1]
    if not res then
      out[i] = { transport_failure(what, r[2], r[3], r[4]) }
    elseif res.status == 204 or res.status == 200 then
      out[i] = { true }
    elseif res.status == 404 then
      out[i] = { false }
    else
      out[i] = { http_failure(res, what) }
    end
  end
  return out
end

--- Sets a running sandbox's lease: it ends `seconds` from now.
-- @treturn[1] boolean true
-- @return[2] nil, msg, code, detail ("NOT_FOUND" also when paused)
function Client:set_timeout(id, seconds)
  check_client(self, "set_timeout")
  id = check_id(id, 1, "set_timeout")
  argcheck(type(seconds) == "number" and seconds >= 0, 2, "set_timeout", "number >= 0 expected")
  local what = ("set the timeout of sandbox '%s'"):format(id)
  local res, msg, code, d = api(self, "POST", "/sandboxes/" .. path_segment(id) .. "/timeout",
    { timeout = ceil_seconds(seconds) }, what, true)
  if not res then return nil, msg, code, d end
  if res.status == 204 or res.status == 200 then return true end
  return http_failure(res, what, false, ("sandbox '%s' not found or not running"):format(id))
end

-- ======================================================================
-- The data plane
-- ======================================================================

--- A data-plane handle on a sandbox.
-- @tparam table|string sb a sandbox table (from create/connect/info) or an id
-- @tparam[opt] table opts `access_token` (default `sb.envd_access_token`), `user`
-- @treturn warmbox.e2b.Sandbox
function Client:sandbox(sb, opts)
  check_client(self, "sandbox")
  opts = opt_table(opts, 2, "sandbox")
  check_fields(opts, { "access_token", "user", "traffic_token" }, "sandbox")
  check_type(opts.access_token, "string", "access_token", 2)
  check_type(opts.user, "string", "user", 2)
  check_type(opts.traffic_token, "string", "traffic_token", 2)
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
-- @treturn[1] string the bytes
-- @return[2] nil, msg, code, detail
function Sandbox:read_file(path)
  check_sandbox(self, "read_file")
  check_path(path, 1, "read_file")
  local what = ("read '%s' in sandbox '%s'"):format(path, self.sandbox_id)
  local res, msg, code, d = dp_request(self, { method = "GET",
    url = self.envd_url .. "/files" .. files_query(self, path), headers = self.envd_headers,
    retry = self.client.dp_retry }, what)
  if not res then return nil, msg, code, d end
  if res.status ~= 200 then
    return http_failure(res, what, true, ("file '%s' not found in sandbox '%s'"):format(path, self.sandbox_id))
  end
  return res.body
end

local function entries_of(res, what)
  local arr, err = json.decode(res.body)
  if type(arr) ~= "table" then
    return nil, what .. ": invalid json in the response: " .. tostring(err), "HTTP", errors.detail(res.status, res.body)
  end
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
  local headers = copy_map(self.envd_headers)
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
_M._multipart = multipart

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
  local headers = copy_map(self.envd_headers)
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
  if type(t) ~= "table" then t = {} end
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
  local out = {}
  for _, e in ipairs(v(t.entries) or {}) do
    local entry = to_entry(e)
    if entry then out[#out + 1] = entry end
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
_M._envelope = envelope

local command_fields = { "envs", "cwd", "timeout", "on_stdout", "on_stderr", "user" }

--- Runs a shell command (`/bin/bash -l -c cmd`) through envd's Process.Start.
-- @tparam string cmd
-- @tparam[opt] table opts `envs`, `cwd`, `timeout` (60 s; 0: none), `on_stdout(text)`,
--   `on_stderr(text)`
-- @treturn[1] table `{ stdout, stderr, exit_code, pid, error }` (a non-zero exit is not a failure)
-- @return[2] nil, msg, code, detail ("STREAM_BROKEN" when the stream broke after output started)
function Sandbox:run_command(cmd, opts)
  check_sandbox(self, "run_command")
  argcheck(type(cmd) == "string", 1, "run_command", "string expected, got " .. type(cmd))
  opts = opt_table(opts, 2, "run_command")
  check_fields(opts, command_fields, "run_command")
  check_string_map(opts.envs, "envs", 2)
  check_type(opts.cwd, "string", "cwd", 2)
  check_type(opts.timeout, "number", "timeout", 2)
  check_type(opts.on_stdout, "function", "on_stdout", 2)
  check_type(opts.on_stderr, "function", "on_stderr", 2)
  check_type(opts.user, "string", "user", 2)
  local timeout = opts.timeout or 60
  local process = { cmd = "/bin/bash", args = json.array({ "-l", "-c", cmd }) }
  if opts.envs then process.envs = copy_map(opts.envs) end
  if opts.cwd then process.cwd = opts.cwd end
  local body = assert(json.encode({ process = process, stdin = false }))
  local headers = copy_map(self.envd_headers)
  headers["Content-Type"] = "application/connect+json"
  headers["Connect-Protocol-Version"] = "1"
  headers["Keepalive-Ping-Interval"] = "50"
  if timeout > 0 then headers["Connect-Timeout-Ms"] = tostring(math_ceil(timeout * 1000)) end
  local user = opts.user or self.user
  if user then
    -- Basic base64("<user>:"), the envd way of choosing the Linux user.
    local raw = user .. ":"
    local enc = _M.base64_encode(raw)
    headers["Authorization"] = "Basic " .. enc
  end
  local what = ("run command in sandbox '%s'"):format(self.sandbox_id)
  local out, errs = {}, {}
  local result = { exit_code = nil }
  local trailer_error, ended, started = nil, false, false
  local on_stdout, on_stderr = opts.on_stdout, opts.on_stderr
  local res, msg, code, sent = (self.client.transport or self.client.http):request{
    method = "POST", url = self.envd_url .. "/process.Process/Start", headers = headers,
    body = envelope(body), stream = "connect", retry = false,
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
          local text = _M.base64_decode(so) or ""
          out[#out + 1] = text
          if on_stdout then on_stdout(text) end
        end
        if type(se) == "string" then
          local text = _M.base64_decode(se) or ""
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

local RESULT_KEYS = { "text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json",
  "javascript", "data", "chart", "is_main_result", "extra" }

local code_fields = { "language", "context_id", "env_vars", "timeout", "on_stdout", "on_stderr",
  "on_result", "on_error", "on_line", "max_output", "is_private" }

--- Seconds the client waits past an execute's own timeout for the server's
-- interrupt to end the stream (a bash command gets 3 s to stop).
_M.EXEC_GRACE = 10

local clean = json.utf8_clean

-- Cuts s to at most n bytes without splitting a UTF-8 sequence.
local function cut_utf8(s, n)
  if n <= 0 then return "" end
  if #s <= n then return s end
  local i = n + 1
  while i > 1 and (string_byte(s, i) or 0) & 0xC0 == 0x80 do i = i - 1 end
  return s:sub(1, i - 1)
end
_M._cut_utf8 = cut_utf8

local function clean_tree(x, depth)
  if type(x) == "string" then return clean(x) end
  if type(x) ~= "table" or depth > 32 then return x end
  for k, y in pairs(x) do x[k] = clean_tree(y, depth + 1) end
  return x
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
--   `detail.started` (whether the cell started) and `detail.partial`; `detail.sent` says whether
--   the request may have reached the server
function Sandbox:run_code(code, opts)
  check_sandbox(self, "run_code")
  argcheck(type(code) == "string", 1, "run_code", "string expected, got " .. type(code))
  opts = opt_table(opts, 2, "run_code")
  check_fields(opts, code_fields, "run_code")
  check_type(opts.language, "string", "language", 2)
  check_type(opts.context_id, "string", "context_id", 2)
  check_string_map(opts.env_vars, "env_vars", 2)
  check_type(opts.timeout, "number", "timeout", 2)
  check_type(opts.max_output, "number", "max_output", 2)
  for _, k in ipairs({ "on_stdout", "on_stderr", "on_result", "on_error", "on_line", "is_private" }) do
    check_type(opts[k], "function", k, 2)
  end
  if opts.language and opts.context_id then
    error("options 'language' and 'context_id' are mutually exclusive", 2)
  end
  local timeout = opts.timeout or 300
  if not (timeout >= 0 and timeout < math.huge) then
    error("option 'timeout' must be a finite number >= 0", 2)
  end
  local max_output = opts.max_output or math.huge
  if max_output ~= max_output or max_output < 0 then error("option 'max_output' must be >= 0", 2) end
  local body = { code = code }
  if opts.context_id then body.context_id = opts.context_id end
  if opts.language then body.language = opts.language end
  if opts.env_vars then body.env_vars = copy_map(opts.env_vars) end
  if timeout > 0 then body.timeout = timeout end
  local s = assert(json.encode(body))
  local what = ("run code in sandbox '%s'"):format(self.sandbox_id)
  local exec = { stdout = {}, stderr = {}, results = {}, error = nil, execution_count = nil, truncated = false,
    undecoded = {}, replaced = 0 }
  local used = 0
  local started, finished = false, false
  local on_stdout, on_stderr, on_result, on_error = opts.on_stdout, opts.on_stderr, opts.on_result, opts.on_error
  local on_line, is_private = opts.on_line, opts.is_private
  -- Room for max_output bytes of text in one line, JSON-escaped; never above the core's limit.
  local max_frame = nil
  if max_output < math.huge then max_frame = math.min(64 * 1048576, math.max(1048576, 2 * max_output + 65536)) end
  local mono = core.now or os.time -- (specs may fake the core without a clock)
  local t0 = mono()
  local res, msg, ecode, sent = (self.client.transport or self.client.http):request{
    method = "POST", url = self.interp_url .. "/execute", headers = self.interp_headers, body = s,
    stream = "lines", retry = self.client.exec_retry, max_frame = max_frame,
    timeout = timeout > 0 and (timeout + _M.EXEC_GRACE) or 0,
    on_chunk = function(line, flags)
      if flags & 1 ~= 0 then
        -- A line longer than the stream's limit, cut: past max_output anyway.
        started = true
        exec.truncated = true
        if on_line then on_line("cut") end
        return
      end
      local t, nfixed = json.decode_lossless(line)
      if type(t) ~= "table" then
        started = true
        if used + #line <= max_output then
          used = used + #line
          exec.undecoded[#exec.undecoded + 1] = line
        else
          exec.truncated = true
        end
        if on_line then on_line("undecoded") end
        return
      end
      local kind = t.type
      if on_line then on_line(kind) end
      if kind == "keepalive" then return end
      started = true
      exec.replaced = exec.replaced + (nfixed or 0)
      if kind == "stdout" or kind == "stderr" then
        local text = v(t.text)
        if type(text) ~= "string" then text = "" end
        text = clean(text)
        if used + #text > max_output then
          text = cut_utf8(text, max_output - used)
          exec.truncated = true
          if text == "" then return end
        end
        used = used + #text
        local list = exec[kind]
        list[#list + 1] = text
        local cb = kind == "stdout" and on_stdout or on_stderr
        if cb then cb(text, { text = text, timestamp = v(t.timestamp) }) end
      elseif kind == "result" then
        local r = {}
        for _, k in ipairs(RESULT_KEYS) do r[k] = clean_tree(v(t[k]), 0) end
        r.is_main_result = r.is_main_result == true
        if type(r.extra) ~= "table" then r.extra = {} end
        if is_private and is_private(r) then
          if on_result then on_result(r) end
          return
        end
        if used + #line > max_output then
          exec.truncated = true
          return
        end
        used = used + #line
        exec.results[#exec.results + 1] = r
        if on_result then on_result(r) end
      elseif kind == "error" then
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
        exec.error = e
        if on_error then on_error(e) end
      elseif kind == "number_of_executions" then
        exec.execution_count = v(t.execution_count)
      elseif kind == "end_of_execution" then
        finished = true
      end
      -- unknown types are ignored, as the SDKs do.
    end,
  }
  local elapsed = mono() - t0
  if not res then
    if ecode == "TIMEOUT" then
      return nil, what .. ": the run timed out" .. (started and " (the cell had started)" or
        " before the cell started") .. ": " .. tostring(msg), "TIMEOUT",
        errors.detail(nil, msg, { started = started, sent = true, output_started = started, partial = exec })
    end
    if started then
      return nil, what .. ": the stream broke after output started: " .. tostring(msg), "STREAM_BROKEN",
        errors.detail(nil, msg, { output_started = true, started = true, sent = true, partial = exec })
    end
    local n, m2, c2, d2 = transport_failure(what, msg, ecode, sent)
    d2.started = false
    return n, m2, c2, d2
  end
  if res.status ~= 200 then
    local n, m2, c2, d2 = http_failure(res, what, true)
    d2.started = false
    d2.sent = true
    d2.attempts = res.attempts
    return n, m2, c2, d2
  end
  if not finished then
    if started then
      return nil, what .. ": the stream ended before end_of_execution", "STREAM_BROKEN",
        errors.detail(200, "no end_of_execution", { output_started = true, started = true, sent = true,
          partial = exec })
    end
    return nil, what .. ": the stream ended without any output", "STREAM_BROKEN",
      errors.detail(200, "empty stream", { started = false, sent = true })
  end
  local e = exec.error
  if timeout > 0 and e and elapsed >= timeout and (e.name == "KeyboardInterrupt"
    or (e.name == "BashError" and e.value == "exit status 130")) then
    -- The server interrupted the cell at its timeout.
    return nil, ("%s: the run timed out after %gs (the cell was interrupted)"):format(what, timeout), "TIMEOUT",
      errors.detail(200, "interrupted at the timeout", { started = true, sent = true, output_started = true,
        partial = exec })
  end
  return exec
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

local function to_context(t)
  return { id = v(t.id), language = v(t.language), cwd = v(t.cwd) }
end

--- Creates a code-interpreter context (a kernel).
-- @tparam[opt] table opts `language` ("python"), `cwd` ("/home/user")
-- @treturn[1] table `{ id, language, cwd }`
-- @return[2] nil, msg, code, detail
function Sandbox:create_context(opts)
  check_sandbox(self, "create_context")
  opts = opt_table(opts, 1, "create_context")
  check_fields(opts, { "language", "cwd" }, "create_context")
  check_type(opts.language, "string", "language", 2)
  check_type(opts.cwd, "string", "cwd", 2)
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
  local t, m2, c2, d2 = decode_body(res, what)
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
  local res, msg, code, d = interp_call(self, "POST", "/contexts/" .. path_segment(id) .. "/restart", nil, what,
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
  local res, msg, code, d = interp_call(self, "DELETE", "/contexts/" .. path_segment(id), nil, what,
    ("context '%s' not found"):format(id))
  if not res then return nil, msg, code, d end
  return true
end

_M.Client = Client
_M.Sandbox = Sandbox
return _M
