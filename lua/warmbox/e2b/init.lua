--- warmbox.e2b: an E2B client (control plane and data plane) over warmbox.core.
--
-- Runtime failures return `nil, message, CODE, detail` where `detail` is
-- `{ status = <http status>, message = <E2B's message> }`; misuse (wrong
-- argument types, unknown option keys) raises. Tables use snake_case.
--
-- Iterators (`list`, `list_pages`) yield `false, message, code, token, detail`
-- on an error: `false` rather than `nil` so that a generic `for` loop sees the
-- error instead of silently stopping.
--
-- The data plane lives in `warmbox.e2b.sandbox`, the wire encodings in
-- `warmbox.e2b.wire`; this module is the client and the control plane.
-- @module warmbox.e2b
if _VERSION ~= "Lua 5.4" then error("warmbox needs Lua 5.4, this is " .. tostring(_VERSION), 2) end
local core = require "warmbox.core"
local json = require "warmbox.json"
local errors = require "warmbox.errors"
local util = require "warmbox.util"
local wire = require "warmbox.e2b.wire"
local sandbox_mod = require "warmbox.e2b.sandbox"

local type, pairs, ipairs, tostring, setmetatable, getmetatable, error, next =
  type, pairs, ipairs, tostring, setmetatable, getmetatable, error, next
local table_concat = table.concat
local math_ceil = math.ceil
local os_getenv = os.getenv

local _M = {}

local DEFAULT_DOMAIN = "e2b.app"
local DEFAULT_SANDBOX_TIMEOUT = 300

local Client = { __name = "warmbox.e2b.Client" }
Client.__index = Client
local argcheck, check_options, bad_option = errors.argcheck, errors.check_options, errors.bad_option
local uri_component, http_failure, transport_failure = wire.uri_component, wire.http_failure, wire.transport_failure
local to_sandbox, to_detail, decode_body = wire.to_sandbox, wire.to_detail, wire.decode_body
local sandbox_new, check_max_pages = sandbox_mod.new, wire.check_max_pages

-- ======================================================================
-- The client
-- ======================================================================

local client_fields = { api_key = "string", api_url = "string", sandbox_url = "string", domain = "string",
  request_timeout = "number", retries = "number", connect_timeout = "number", proxy = "string|false",
  ca_file = "string", user_agent = "string", max_connections = "number", retry_after_max = "number",
  transport = "table|function", max_body = "number", max_pages = "number" }

-- A control-plane answer is read whole (a page of 100 sandboxes with E2B's largest metadata
-- is under 7 MB); a listing call follows this many pages (a server may name them for ever).
local DEFAULT_MAX_BODY, DEFAULT_MAX_PAGES = 32 * 1048576, 10000

-- new's range checks of `retries`, the timeouts and `max_connections` (errors
-- name new's caller); returns `retries` (3), `max_body` and `max_pages` (their defaults).
local function check_ranges(opts)
  local retries = opts.retries or 3
  if retries < 0 or retries > 100 or retries ~= math.floor(retries) then
    bad_option(1, "new", "retries", "integer 0..100 expected, got " .. tostring(retries), 3)
  end
  for _, k in ipairs({ "request_timeout", "connect_timeout" }) do
    local t = opts[k]
    if t ~= nil and not (t > 0 and t <= 86400) then
      bad_option(1, "new", k, "seconds in (0, 86400] expected, got " .. tostring(t), 3)
    end
  end
  if opts.max_connections ~= nil and not (opts.max_connections >= 1 and opts.max_connections <= 10000) then
    bad_option(1, "new", "max_connections", "1..10000 expected, got " .. tostring(opts.max_connections), 3)
  end
  local ram = opts.retry_after_max
  if ram ~= nil and not (ram >= 0 and ram <= 86400) then
    bad_option(1, "new", "retry_after_max", "seconds in [0, 86400] expected, got " .. tostring(ram), 3)
  end
  if opts.max_body ~= nil and not (opts.max_body >= 1 and opts.max_body <= 2 ^ 40) then
    bad_option(1, "new", "max_body", "bytes in [1, 2^40] expected, got " .. tostring(opts.max_body), 3)
  end
  check_max_pages(opts, "new", 4)
  return retries, math.floor(opts.max_body or DEFAULT_MAX_BODY), opts.max_pages or DEFAULT_MAX_PAGES
end

local function is_loopback(url)
  return (url:match("^https?://127%.") or url:match("^https?://localhost[:/]") or url:match("^https?://localhost$")
    or url:match("^https?://%[::1%]")) ~= nil
end

--- Creates a client.
-- @tparam[opt] table opts `api_key` (default `E2B_API_KEY`), `api_url` (`E2B_API_URL`, else
--   `https://api.<domain>`), `sandbox_url` (`E2B_SANDBOX_URL`, else `api_url` when it is
--   a loopback address (a local warmboxd), else the per-port host
--   `https://<port>-<id>.<domain>`), `domain` (`E2B_DOMAIN`, default `e2b.app`),
--   `request_timeout` (60 s), `retries` (3: attempts after the first for idempotent calls),
--   `connect_timeout` (5 s), `proxy`, `ca_file`, `user_agent`, `max_connections`,
--   `retry_after_max` (seconds: the longest `Retry-After` waited; a longer one waits this long;
--   default none), `transport` (what the requests go through instead of the connection: an
--   object with its `request` and `batch` methods, or a function(http) returning one, given
--   the client's connection: warmbox.runner's transport runs them on the engine inside a task),
--   `max_body` (32 MiB: the largest control-plane answer read, and the largest error body of a
--   run's or a command's stream; longer: `TOO_LARGE`), `max_pages` (10000: the most pages one
--   listing call follows; more: `TOO_LARGE`; a listing's own `max_pages` overrides it).
-- @treturn warmbox.e2b.Client
function _M.new(opts)
  opts = check_options(opts, client_fields, "new", 1)
  local function env(name)
    local s = os_getenv(name)
    if s == "" then return nil end
    return s
  end
  local api_key = opts.api_key or env("E2B_API_KEY")
  if not api_key or api_key == "" then
    bad_option(1, "new", "api_key", "an api_key is required (option 'api_key' or E2B_API_KEY)")
  end
  local domain = opts.domain or env("E2B_DOMAIN") or DEFAULT_DOMAIN
  local api_url = opts.api_url or env("E2B_API_URL") or ("https://api." .. domain)
  local sandbox_url = opts.sandbox_url or env("E2B_SANDBOX_URL")
  -- A loopback API URL is a local warmboxd: it serves the data plane on the same port.
  if not sandbox_url and is_loopback(api_url) then sandbox_url = api_url end
  local retries, max_body, max_pages = check_ranges(opts)
  local http, msg = core.http{
    timeout = opts.request_timeout or 60, connect_timeout = opts.connect_timeout or 5,
    proxy = opts.proxy, ca_file = opts.ca_file, max_connections = opts.max_connections,
    user_agent = opts.user_agent or ("warmbox/" .. tostring(core._VERSION)),
  }
  if not http then error("cannot create the http client: " .. tostring(msg), 2) end
  local self = {
    api_url = (api_url:gsub("/+$", "")),
    sandbox_url = sandbox_url and (sandbox_url:gsub("/+$", "")) or nil,
    domain = domain,
    request_timeout = opts.request_timeout or 60,
    max_body = max_body,
    max_pages = max_pages,
    http = http,
    retry = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2 },
    retry_idem = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2, idempotent = true },
    retry_create = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2, refused = { 429, 503 } },
    -- An execute is sent again here only when nothing of it left (connection
    -- refused): an answer's status never proves that an intermediary did not
    -- forward it (the session asks the sandbox; see HACKING.md, "At most once").
    exec_retry = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2, statuses = {},
      refused = {} },
    -- The data plane: a 502 from the sandbox proxy means the sandbox is gone
    -- or paused, not a passing failure, so it is not retried.
    dp_retry = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2, statuses = { 429, 503, 504 } },
    dp_retry_idem = { attempts = math.floor(retries) + 1, budget = 30, base = 0.1, cap = 2, idempotent = true,
      statuses = { 429, 503, 504 } },
    -- transport: nil (requests go to http) or an object with http's request
    -- and batch methods (warmbox.runner's: the engine inside a task).
    transport = type(opts.transport) == "function" and opts.transport(http) or opts.transport,
    -- The key lives only in this header table, never in messages.
    api_headers = { ["X-API-Key"] = api_key, ["Accept"] = "application/json" },
    json_headers = { ["X-API-Key"] = api_key, ["Accept"] = "application/json",
      ["Content-Type"] = "application/json" },
  }
  if opts.retry_after_max then
    -- Every retry table of the client (those above) caps the Retry-After it honours.
    for _, v in pairs(self) do
      if type(v) == "table" and v.attempts then v.retry_after_max = opts.retry_after_max end
    end
  end
  return setmetatable(self, Client)
end

--- A new client like this one (same key, addresses, connections and retry
-- rules) whose requests go through `transport`: an object with `request` and
-- `batch` as a `core.http` client has (warmbox.runner's, for a part that
-- runs its requests on its own tasks), or a function of this client's
-- connection returning one (as `new`'s `transport`). This client is left as it is.
-- @treturn warmbox.e2b.Client
function Client:with_transport(transport)
  local c = {}
  for k, v in pairs(self) do c[k] = v end
  if type(transport) == "function" then transport = transport(self.http) end
  c.transport = transport
  return setmetatable(c, Client)
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
    retry = retry or (idempotent and self.retry_idem or self.retry), max_body = self.max_body,
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

local create_fields = { template = "string", timeout = "number", metadata = "map", env_vars = "map",
  lifecycle = "table", secure = "boolean", allow_internet_access = "boolean", network = "table" }
local lifecycle_fields = { on_timeout = "string", auto_resume = "boolean", keep_memory = "boolean" }

--- Builds the create body (exposed for specs).
-- @return[1] table the body
-- @return[2] nil, msg, "BAD_REQUEST"
-- syntax: body = e2b.create_body(opts)
function _M.create_body(opts)
  local body = { templateID = opts.template or "base" }
  local timeout = opts.timeout or DEFAULT_SANDBOX_TIMEOUT
  if timeout <= 0 then return nil, "create: timeout must be greater than 0", "BAD_REQUEST" end
  body.timeout = math_ceil(timeout)
  body.secure = opts.secure ~= false
  body.allow_internet_access = opts.allow_internet_access ~= false
  if opts.metadata ~= nil then body.metadata = util.copy(opts.metadata) end
  if opts.env_vars ~= nil then body.envVars = util.copy(opts.env_vars) end
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
  opts = check_options(opts, create_fields, "create", 1)
  check_options(opts.lifecycle, lifecycle_fields, "create", 1, 2, "lifecycle.")
  local body, msg, code = _M.create_body(opts)
  if not body then return nil, msg, code, errors.detail(nil, msg) end
  -- E2B's 429 (and a 503) on create means nothing was created: retried,
  -- honouring Retry-After within the retry budget.
  local res, m2, c2, d2 = api(self, "POST", "/sandboxes", body, "create sandbox", false, self.retry_create)
  if not res then return nil, m2, c2, d2 end
  if res.status == 429 and type(self.rate_limit_hint) == "function" then
    -- A local server's cap is a setting of its own, not E2B's billing tier.
    local n, _, c4, d4 = http_failure(res, "create sandbox")
    local cap = tostring(d4 and d4.message or ""):match("%((%d+)%)")
    return n, "create sandbox: http 429: " .. self.rate_limit_hint(tonumber(cap)), c4, d4
  end
  if res.status ~= 201 and res.status ~= 200 then
    return http_failure(res, "create sandbox")
  end
  local t, m3, c3, d3 = decode_body(res, "create sandbox")
  if not t then return nil, m3, c3, d3 end
  -- `attempts` > 1: an earlier attempt may have made a sandbox too (a 503/429
  -- an intermediary gave after forwarding it).
  return to_sandbox(t), nil, nil, { attempts = res.attempts or 1 }
end

local list_fields = { state = "string|table", metadata = "map", limit = "number", order = "string",
  next_token = "string", template = "string", started_after = "string", max_pages = "number" }

--- Builds the `/v2/sandboxes` URL path and query (exposed for specs).
-- syntax: path = e2b.list_path(opts)
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

-- Level 3: the caller of list_pages, list or list_all.
local function check_list_opts(opts, fname)
  opts = check_options(opts, list_fields, fname, 1, 3)
  check_max_pages(opts, fname, 4)
  if type(opts.state) == "table" then
    for _, s in ipairs(opts.state) do
      if type(s) ~= "string" then bad_option(1, fname, "state", "a list of strings expected", 3) end
    end
  end
  return opts
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

-- The URL path of one list page: E2B pages with a `nextToken` query parameter
-- and the `x-next-token` response header (the transport knows neither).
local function page_path(opts, token)
  local path = _M.list_path(opts)
  if token then path = path .. (path:find("?", 1, true) and "&" or "?") .. "nextToken=" .. uri_component(token) end
  return path
end

local function has_sandbox_id(t) return type(json.value(t.sandboxID)) == "string" end

-- One sandbox list page (see wire.read_page), the items re-checked against `filter`.
local function list_page(res, msg, code, sent, used, filter)
  return wire.read_page(res, msg, code, sent, used, "list sandboxes", has_sandbox_id, function(t)
    local dt = to_detail(t)
    if metadata_matches(dt, filter) then return dt end
    return nil
  end)
end

-- The page iterator of a listing (list_pages, list_snapshot_pages): a GET of `path_of(token)` per page until the
-- server names no next page, at most `max_pages` pages (a server that names
-- one for ever is refused: TOO_LARGE); `read(res, msg, code, sent, used)` is
-- wire.read_page's. Yields `items, token_used | false, next_token`, or `false, msg,
-- code, token, detail` once, then stops.
local function page_iter(self, token, path_of, retry, read, what, max_pages)
  if token == "" then token = nil end
  local finished, pages = false, 0
  max_pages = max_pages or self.max_pages
  return function()
    if finished then return nil end
    local used = token
    if pages >= max_pages then
      finished = true
      local msg = ("%s: the server named a next page after %d pages (max_pages)"):format(what, pages)
      return false, msg, "TOO_LARGE", used, errors.detail(nil, msg)
    end
    pages = pages + 1
    local res, msg, code, sent = (self.transport or self.http):request{ method = "GET",
      url = self.api_url .. path_of(used), headers = self.api_headers, retry = retry, max_body = self.max_body }
    local items, a, b, c, d = read(res, msg, code, sent, used)
    if items == false then
      finished = true
      return false, a, b, c, d
    end
    token, finished = b, b == nil
    return items, used or false, b
  end
end

--- Iterates over pages of listed sandboxes.
-- `for items, token_used, next_token in c:list_pages(opts) do ... end`; on an
-- error the loop gets `false, msg, code, token, detail` and then stops.
function Client:list_pages(opts)
  check_client(self, "list_pages")
  opts = check_list_opts(opts, "list_pages")
  local filter = opts.metadata and util.copy(opts.metadata)
  return page_iter(self, opts.next_token, function(t) return page_path(opts, t) end, self.retry,
    function(res, msg, code, sent, used) return list_page(res, msg, code, sent, used, filter) end,
    "list sandboxes", opts.max_pages)
end

--- Iterates over listed sandboxes, following every page.
-- @tparam[opt] table opts `state` ("running", "paused" or a list; default both),
--   `metadata` (exact AND filter, re-checked client-side), `limit` (page size, 1..100),
--   `order` ("asc"|"desc"), `next_token` (resume from a page), `template`, `started_after`,
--   `max_pages` (the client's, 10000: a server that names more pages gets `TOO_LARGE`).
-- @return an iterator: `for item in c:list(opts) do ... end`; on an error the loop
--   gets `false, msg, code, token (the page it failed at), detail`, then stops.
function Client:list(opts)
  check_client(self, "list")
  check_list_opts(opts, "list")
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
  check_list_opts(opts, "list_all")
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
  local res, msg, code, d = api(self, "GET", "/sandboxes/" .. uri_component(id), nil, what)
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
  opts = check_options(opts, { timeout = "number" }, "connect", 2)
  local timeout = opts.timeout or DEFAULT_SANDBOX_TIMEOUT
  if timeout < 0 then bad_option(2, "connect", "timeout", "a number >= 0 expected") end
  local what = ("connect to sandbox '%s'"):format(id)
  local res, msg, code, d = api(self, "POST", "/sandboxes/" .. uri_component(id) .. "/connect",
    { timeout = math_ceil(timeout) }, what, true)
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
  opts = check_options(opts, { memory = "boolean" }, "pause", 2)
  local what = ("pause sandbox '%s'"):format(id)
  local res, msg, code, d = api(self, "POST", "/sandboxes/" .. uri_component(id) .. "/pause",
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
  local res, msg, code, d = api(self, "DELETE", "/sandboxes/" .. uri_component(id), nil, what)
  if not res then return nil, msg, code, d end
  if res.status == 204 or res.status == 200 then return true end
  if res.status == 404 then return false end
  return http_failure(res, what)
end

--- Kills many sandboxes in parallel (libcurl's multi interface, bounded).
-- @tparam table ids sandbox ids (or sandbox tables)
-- @tparam[opt] table opts `concurrency` (8)
-- @treturn table one entry per id, in order: `{ true }` (killed), `{ false }` (already gone)
--   or `{ nil, msg, code, detail }`
function Client:kill_many(ids, opts)
  check_client(self, "kill_many")
  argcheck(type(ids) == "table", 1, "kill_many", "table expected, got " .. type(ids))
  opts = check_options(opts, { concurrency = "number" }, "kill_many", 2)
  local ops = {}
  for i, id in ipairs(ids) do ops[i] = { op = "kill", id = check_id(id, 1, "kill_many") } end
  return self:batch(ops, opts)
end

--- Sends list pages and kills together, in parallel (one `h:batch`): what lets
-- GC fetch the next page while it re-checks and kills the previous ones.
-- @tparam table ops `{ op = "list", opts = list opts (with `next_token`) }` or
--   `{ op = "kill", id = id }`, in any mix
-- @tparam[opt] table opts `concurrency` (8)
-- @treturn table one entry per op, in order: a list gives `{ items, token_used (false for
--   the first page), next_token }` or `{ false, msg, code, token, detail }`; a kill gives
--   `{ true }`, `{ false }` (already gone) or `{ nil, msg, code, detail }`
function Client:batch(ops, opts)
  check_client(self, "batch")
  argcheck(type(ops) == "table", 1, "batch", "table expected, got " .. type(ops))
  opts = check_options(opts, { concurrency = "number" }, "batch", 2)
  local reqs, what = {}, {}
  for i, o in ipairs(ops) do
    argcheck(type(o) == "table", 1, "batch", "op " .. i .. " must be a table")
    if o.op == "kill" then
      local id = check_id(o.id, 1, "batch")
      what[i] = { "kill", ("kill sandbox '%s'"):format(id) }
      reqs[i] = { method = "DELETE", url = self.api_url .. "/sandboxes/" .. uri_component(id),
        headers = self.api_headers, retry = self.retry, max_body = self.max_body }
    elseif o.op == "list" then
      local lo = check_list_opts(o.opts, "batch")
      what[i] = { "list", lo.next_token or false, lo.metadata and util.copy(lo.metadata) }
      reqs[i] = { method = "GET", url = self.api_url .. page_path(lo, lo.next_token), headers = self.api_headers,
        retry = self.retry, max_body = self.max_body }
    else
      argcheck(false, 1, "batch", "op " .. i .. " must be \"list\" or \"kill\"")
    end
  end
  local out = {}
  if #reqs == 0 then return out end
  local results = (self.transport or self.http):batch(reqs, { concurrency = opts.concurrency or 8 })
  for i, r in ipairs(results) do
    local w, res = what[i], r[1]
    if w[1] == "kill" then
      if not res then
        out[i] = { transport_failure(w[2], r[2], r[3], r[4]) }
      elseif res.status == 204 or res.status == 200 then
        out[i] = { true }
      elseif res.status == 404 then
        out[i] = { false }
      else
        out[i] = { http_failure(res, w[2]) }
      end
    else
      out[i] = { list_page(res, r[2], r[3], r[4], w[2], w[3]) }
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
  local res, msg, code, d = api(self, "POST", "/sandboxes/" .. uri_component(id) .. "/timeout",
    { timeout = math_ceil(seconds) }, what, true)
  if not res then return nil, msg, code, d end
  if res.status == 204 or res.status == 200 then return true end
  return http_failure(res, what, false, ("sandbox '%s' not found or not running"):format(id))
end

-- ======================================================================
-- Persistent snapshots (E2B's `POST /sandboxes/{id}/snapshots`)
-- ======================================================================

local function check_snapshot_id(id, n, fname)
  if type(id) == "table" then id = id.snapshot_id end
  argcheck(type(id) == "string" and id ~= "", n, fname, "snapshot id expected, got " .. type(id))
  return id
end

--- Takes a persistent snapshot of a running sandbox (memory and files; it is
-- paused briefly and keeps running). Not retried once sent: a second attempt
-- could make a second snapshot.
-- @tparam string id
-- @tparam[opt] table opts `name` ("n" or "n:tag"; a name taken again moves to the new snapshot)
-- @treturn[1] table `{ snapshot_id, names }` (the id is a template id: `create{ template = id }`)
-- @return[2] nil, msg, code ("NOT_FOUND": unknown or paused; "CONFLICT": one is being taken), detail
function Client:snapshot(id, opts)
  check_client(self, "snapshot")
  id = check_id(id, 1, "snapshot")
  opts = check_options(opts, { name = "string" }, "snapshot", 2)
  local what = ("snapshot sandbox '%s'"):format(id)
  local res, msg, code, d = api(self, "POST", "/sandboxes/" .. uri_component(id) .. "/snapshots",
    { name = opts.name }, what)
  if not res then return nil, msg, code, d end
  if res.status ~= 201 and res.status ~= 200 then
    return http_failure(res, what, false, ("sandbox '%s' not found or not running"):format(id))
  end
  local t, m2, c2, d2 = decode_body(res, what)
  if not t then return nil, m2, c2, d2 end
  local snap = wire.to_snapshot(t)
  if type(snap.snapshot_id) ~= "string" or snap.snapshot_id == "" then
    return nil, what .. ": the answer has no snapshotID", "PROTOCOL", errors.detail(res.status, res.body)
  end
  return snap
end

local snapshot_list_fields = { sandbox_id = "string", name = "string", limit = "number", next_token = "string",
  max_pages = "number" }

--- The `/snapshots` URL path and query of one page (exposed for specs; `warmbox.e2b.wire`'s).
_M.snapshots_path = wire.snapshots_path

local function has_snapshot_id(t) return type(json.value(t.snapshotID)) == "string" end

--- Iterates over pages of the team's snapshots, newest first:
-- `for items, token_used, next_token in c:list_snapshot_pages(opts) do ... end`;
-- on an error the loop gets `false, msg, code, token, detail`, then stops.
-- @tparam[opt] table opts `sandbox_id` (made from that sandbox), `name` (a name or id,
--   optionally `:tag`), `limit` (page size, 1..100), `next_token`
function Client:list_snapshot_pages(opts)
  check_client(self, "list_snapshot_pages")
  opts = check_options(opts, snapshot_list_fields, "list_snapshot_pages", 1)
  check_max_pages(opts, "list_snapshot_pages", 3)
  if opts.limit ~= nil and not (opts.limit >= 1 and opts.limit <= 100) then
    bad_option(1, "list_snapshot_pages", "limit", "1..100 expected, got " .. tostring(opts.limit))
  end
  return page_iter(self, opts.next_token, function(t) return wire.snapshots_path(opts, t) end, self.retry_idem,
    function(res, msg, code, sent, used)
      return wire.read_page(res, msg, code, sent, used, "list snapshots", has_snapshot_id, wire.to_snapshot)
    end, "list snapshots", opts.max_pages)
end

--- Every matching snapshot (all pages), newest first.
-- @treturn[1] table items `{ snapshot_id, names }`
-- @return[2] nil, msg, code, detail
function Client:list_snapshots(opts)
  check_client(self, "list_snapshots")
  local out = {}
  for items, msg, code, _, detail in self:list_snapshot_pages(opts) do
    if items == false then return nil, msg, code, detail end
    for _, it in ipairs(items) do out[#out + 1] = it end
  end
  return out
end

--- Deletes a snapshot (`DELETE /templates/{id}`); sandboxes started from it keep running.
-- @treturn[1] boolean true when deleted, false when there was none
-- @return[2] nil, msg, code, detail
function Client:delete_snapshot(id)
  check_client(self, "delete_snapshot")
  id = check_snapshot_id(id, 1, "delete_snapshot")
  local what = ("delete snapshot '%s'"):format(id)
  local res, msg, code, d = api(self, "DELETE", "/templates/" .. uri_component(id), nil, what, true)
  if not res then return nil, msg, code, d end
  if res.status == 204 or res.status == 200 then return true end
  if res.status == 404 then return false end
  return http_failure(res, what)
end

--- A data-plane handle on a sandbox (see `warmbox.e2b.sandbox`).
-- @tparam table|string sb a sandbox table (from create/connect/info) or an id
-- @tparam[opt] table opts `access_token` (default `sb.envd_access_token`), `user`, `traffic_token`
-- @treturn warmbox.e2b.Sandbox
function Client:sandbox(sb, opts)
  check_client(self, "sandbox")
  return sandbox_new(self, sb, opts)
end

--- Re-exported from `warmbox.e2b.wire`.
_M.encode_metadata = wire.encode_metadata
_M.Client = Client
_M.Sandbox = sandbox_mod.Sandbox
return _M
