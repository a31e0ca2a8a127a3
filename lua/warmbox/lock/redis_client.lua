--- warmbox.lock.redis_client: the Redis the lock talks to, whatever its
-- topology: one node, a primary behind Redis Sentinel, or a Redis Cluster.
-- core.redis (hiredis) speaks the protocol and, for Sentinel, finds the
-- primary (and finds it again after a failover: a refused connection, a
-- READONLY answer, a blocked client released by the role change). Here:
-- the options and URL forms, one client per configuration, and a
-- Cluster's routing: every key of one conversation carries the same hash
-- tag (`{...}`, see `name`), a command goes to the node last known to serve
-- that tag, and MOVED / ASK are followed (a MOVED is remembered).
--
--   local rc = require "warmbox.lock.redis_client"
--   local c = assert(rc.client(redis_opts))
--   c:call(tag, "GET", key)      -- value | nil, msg, code
--   c:keeper(tag, key, token, ttl, cap)
local core = require "warmbox.core"

local type, tostring, tonumber, ipairs, pairs, setmetatable, error =
  type, tostring, tonumber, ipairs, pairs, setmetatable, error
local fmt, concat = string.format, table.concat

local _M = {}

-- core.so built without hiredis (CMake's WARMBOX_REDIS) has no core.redis.
_M.NOT_BUILT = "the redis lock is not built: warmbox.core was built without hiredis "
  .. "(install libhiredis-dev and rebuild, or use lock = \"file\")"

-- The topology of redis options: "single" | "sentinel" | "cluster".
-- syntax: t = redis_client.topology(r) ("single" | "sentinel" | "cluster")
function _M.topology(r)
  if r.sentinels then return "sentinel" end
  if r.nodes then return "cluster" end
  return "single"
end

local function hex(s)
  return (s:gsub(".", function(c) return fmt("%02X", c:byte()) end))
end

--- The name of `kind` ("lock", "queue", ...) for `key`. On a Cluster every
-- name of one key carries the hash tag `{key}` (a key with a `}` or an
-- empty one: `{~<hex of key>}` then the key), so one script may touch them
-- all; elsewhere `<prefix><kind>:<key>` as ever.
-- @return name, tag (the routing tag; the key itself off a Cluster)
-- syntax: name, tag = redis_client.name(redis_opts, kind, key) (the hash tag `{key}` on a Cluster)
function _M.name(r, kind, key)
  if not r.nodes then return r.prefix .. kind .. ":" .. key, key end
  if key ~= "" and not key:find("}", 1, true) then return r.prefix .. kind .. ":{" .. key .. "}", key end
  local tag = "~" .. hex(key)
  return r.prefix .. kind .. ":{" .. tag .. "}" .. key, tag
end

-- ---------------------------------------------------------------------------
-- URL forms
-- ---------------------------------------------------------------------------

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

local function addr_list(s, what)
  local list = {}
  for a in s:gmatch("[^,]+") do
    if not a:match("^[^:]+:%d+$") and not a:match("^%[.+%]:%d+$") then
      if a:match("^[^:]+$") then a = a .. (what == "sentinel" and ":26379" or ":6379")
      else return nil end
    end
    list[#list + 1] = a
  end
  return #list > 0 and list or nil
end

-- The user and password of a URL's `[user]:password@` ({} without).
local function url_auth(auth)
  local r = {}
  if not auth then return r end
  local user, pass = auth:match("^([^:]*):(.*)$")
  if not user then user, pass = "", auth end
  r.username = user ~= "" and unescape(user) or nil
  r.password = pass ~= "" and unescape(pass) or nil
  return r
end

--- Parses a Redis URL into redis options (a bad one raises, naming `what`):
-- `redis://[[user]:password@]host[:port][/prefix][?db=N]`,
-- `redis-sentinel://[[user]:password@]host:port,host:port/master[/prefix][?db=N]`
-- (port 26379 by default), `redis-cluster://[[user]:password@]host:port,host:port[/prefix]`.
-- syntax: r = redis_client.parse_url(url, what)
function _M.parse_url(url, what)
  what = what or "url"
  local function bad()
    error(fmt("%s: redis://[[user]:password@]host[:port][/prefix][?db=N], redis-sentinel://[[user]:password@]"
      .. "host:port,.../master[/prefix][?db=N] or redis-cluster://[[user]:password@]host:port,...[/prefix] "
      .. "expected, got '%s'", what, tostring(url)), 3)
  end
  if type(url) ~= "string" then bad() end
  local scheme, rest = url:match("^([%w%-]+)://(.*)$")
  if not scheme then bad() end
  local query
  rest, query = rest:match("^([^?]*)%??(.*)$")
  local auth, hostpart = rest:match("^(.*)@([^@]*)$")
  local r = url_auth(auth)
  local hosts, path = (hostpart or rest):match("^([^/]*)/?(.*)$")
  for k, v in (query or ""):gmatch("([^&=]+)=([^&]*)") do
    if k == "db" and v:match("^%d+$") then r.db = tonumber(v) else bad() end
  end
  if scheme == "redis" then
    local host, port = hosts:match("^([^:]+):?(%d*)$")
    if not host then bad() end
    r.host, r.port = host, tonumber(port) or 6379
    r.prefix = path ~= "" and unescape(path) or nil
  elseif scheme == "redis-sentinel" then
    local master, prefix = path:match("^([^/]+)/?(.*)$")
    r.sentinels = addr_list(hosts, "sentinel")
    if not master or not r.sentinels then bad() end
    r.master, r.prefix = unescape(master), prefix ~= "" and unescape(prefix) or nil
  elseif scheme == "redis-cluster" then
    r.nodes = addr_list(hosts, "cluster")
    if not r.nodes or r.db then bad() end
    r.prefix = path ~= "" and unescape(path) or nil
  else
    bad()
  end
  return r
end

--- The redis options of the environment: $WARMBOX_REDIS_URL (any form of
-- parse_url) with $WARMBOX_REDIS_USERNAME and $WARMBOX_REDIS_PASSWORD (they
-- keep the secret out of the URL), or nil when the URL is unset.
-- syntax: r = redis_client.from_env(getenv)
function _M.from_env(getenv)
  local function get(n)
    local v = getenv(n)
    if v == "" then return nil end
    return v
  end
  local url = get("WARMBOX_REDIS_URL")
  if not url then return nil end
  local r = _M.parse_url(url, "WARMBOX_REDIS_URL")
  r.username = r.username or get("WARMBOX_REDIS_USERNAME")
  r.password = r.password or get("WARMBOX_REDIS_PASSWORD")
  return r
end

local function check_list(l, k, bad)
  if l == nil then return end
  if type(l) ~= "table" or #l < 1 then bad(k, 'a list of "host:port" expected') end
  for i = 1, #l do
    if type(l[i]) ~= "string" or not l[i]:match("^.+:%d+$") then bad(k, 'a list of "host:port" expected') end
  end
end

--- Checks redis options `o` (the lock's, URL merged in): `bad(name, what)` raises.
-- syntax: redis_client.check(o, bad)
function _M.check(o, bad)
  if (o.sentinels == nil) ~= (o.master == nil) then
    bad(o.master and "sentinels" or "master", "sentinels and master go together")
  end
  check_list(o.sentinels, "sentinels", bad)
  check_list(o.nodes, "nodes", bad)
  if o.sentinels and o.nodes then bad("nodes", "a Cluster has no sentinels") end
  if o.db ~= nil and (math.type(o.db) ~= "integer" or o.db < 0 or (o.nodes and o.db ~= 0)) then
    bad("db", "an integer >= 0 expected (0 on a Cluster)")
  end
  if o.username and not o.password then bad("username", "needs a password") end
  if o.nodes and (o.prefix or ""):find("[{}]") then bad("prefix", "no '{' or '}' on a Cluster (the key's hash tag)") end
end

-- ---------------------------------------------------------------------------
-- clients
-- ---------------------------------------------------------------------------

-- One client per configuration (and process): id -> client.
local clients = {}

--- The identity of a configuration (the in-process lock namespace and the
-- client cache use it).
-- syntax: id = redis_client.id(r)
function _M.id(r)
  return concat({ _M.topology(r), tostring(r.host), tostring(r.port), tostring(r.timeout), tostring(r.db or 0),
    r.username or "", r.password or "", r.master or "", concat(r.sentinels or r.nodes or {}, ",") }, "\0")
end

local function core_opts(r, host, port)
  return { host = host, port = port, timeout = r.timeout, username = r.username, password = r.password,
    db = r.db, sentinels = r.sentinels, master = r.master, nodes = r.nodes }
end

-- One node or Sentinel: a single core.redis (it finds the primary itself).
local Plain = {}
Plain.__index = Plain

-- syntax: r, err, code = c:conn() (their core.redis objects)
function Plain:conn()
  if self.c then return self.c end
  if not core.redis then return nil, _M.NOT_BUILT, "LOCK" end
  local c, err, code = core.redis(core_opts(self.r, self.r.host, self.r.port))
  if not c then return nil, err, code end
  self.c = c
  return c
end

-- syntax: v, err, code, sent = c:call(tag, cmd, ...) (`tag`: the key's routing tag; a Cluster client routes by
--   it, follows MOVED and ASK; `sent` false: it cannot have run)
function Plain:call(_, ...)
  local c, err, code = self:conn()
  if not c then return nil, err, code, false end
  return c:command(...)
end

-- syntax: k = c:keeper(tag, key, token, ttl, cap)
function Plain:keeper(_, ...)
  local c = self:conn()
  if not c then return nil end
  return c:keeper(...)
end

-- syntax: addr = c:address(tag)
function Plain:address()
  local c = self:conn()
  if not c then return nil end
  local h, p = c:address()
  return h .. ":" .. p
end

-- A Cluster: one core.redis per node, routes by hash tag.
local Cluster = {}
Cluster.__index = Cluster

-- The most tags remembered (then the memory starts over: a MOVED each re-learns).
local MAX_ROUTES = 4096

-- syntax: r, err, code = c:node(addr)
function Cluster:node(addr)
  local c = self.pool[addr]
  if c then return c end
  if not core.redis then return nil, _M.NOT_BUILT, "LOCK" end
  local host, port = addr:match("^%[?(.-)%]?:(%d+)$")
  local err, code
  c, err, code = core.redis(core_opts(self.r, host, tonumber(port)))
  if not c then return nil, err, code end
  self.pool[addr] = c
  if not self.known[addr] then
    self.known[addr] = true
    self.order[#self.order + 1] = addr
  end
  return c
end

function Cluster:forget(addr)
  local c = self.pool[addr]
  if c then c:close() end
  self.pool[addr] = nil
end

-- syntax: c:route(tag, addr) (a MOVED remembered)
function Cluster:route(tag, addr)
  if addr and not self.routes[tag] then
    self.nroutes = self.nroutes + 1
    if self.nroutes > MAX_ROUTES then self.routes, self.nroutes = {}, 1 end
  end
  self.routes[tag] = addr
end

-- The node after `addr` in the known list (a dead node's stand-in).
-- syntax: addr = c:next_addr(addr) (an unreachable node's stand-in)
function Cluster:next_addr(addr)
  local order = self.order
  for i, a in ipairs(order) do
    if a == addr then return order[i % #order + 1] end
  end
  return order[1]
end

--- Runs one command for `tag`: to the node that serves it, following MOVED
-- (remembered) and ASK (once, after ASKING); a node that cannot be reached
-- (the command was not sent) is replaced by the next known one, which
-- redirects. → value | nil, msg, code, sent
function Cluster:call(tag, ...)
  local addr = self.routes[tag] or self.order[1]
  local err
  for _ = 1, 2 * #self.order + 4 do
    local c, res, code, sent
    c, err = self:node(addr)
    if c then
      res, err, code, sent = c:command(...)
      if res ~= nil or err == nil then return res end
      if code == "REDIS" then
        local kind, to = tostring(err):match("^(%u+) %d+ (%S+)$")
        if kind == "MOVED" then
          self:route(tag, to)
          addr = to
          goto continue
        elseif kind == "ASK" then
          local n, nerr, ncode = self:node(to)
          if not n then return nil, nerr, ncode, false end
          n:command("ASKING")
          return n:command(...)
        end
        return res, err, code, sent
      end
      if sent then return res, err, code, sent end
      -- not sent, or CLUSTERDOWN / TRYAGAIN / READONLY (not run): another node may know better
    end
    self:forget(addr)
    self:route(tag, nil)
    addr = self:next_addr(addr)
    ::continue::
  end
  -- never run: a failover under way (MOVED to a dead node, CLUSTERDOWN); try again later
  return nil, tostring(err), "TRANSPORT", false
end

function Cluster:keeper(tag, ...)
  local addr = self.routes[tag] or self.order[1]
  local c = self:node(addr)
  if not c then return nil end
  return c:keeper(...)
end

function Cluster:address(tag)
  return self.routes[tag] or self.order[1]
end

--- The client of redis options `r` (one per configuration and process).
-- syntax: c = redis_client.client(redis_opts) (one per configuration and process; `redis_client.reset()` drops
--   them)
function _M.client(r)
  local id = _M.id(r)
  local c = clients[id]
  if c then return c end
  if r.nodes then
    c = setmetatable({ r = r, pool = {}, routes = {}, nroutes = 0, known = {}, order = {} }, Cluster)
    for _, a in ipairs(r.nodes) do
      c.known[a] = true
      c.order[#c.order + 1] = a
    end
  else
    c = setmetatable({ r = r }, Plain)
  end
  clients[id] = c
  return c
end

--- Drops every cached client (their connections close when collected).
function _M.reset()
  for k in pairs(clients) do clients[k] = nil end
end

return _M
