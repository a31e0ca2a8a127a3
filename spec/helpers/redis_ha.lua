-- Throw-away Redis topologies on loopback for specs and benches: a primary
-- with replicas behind three sentinels, and a Redis Cluster of 3 primaries
-- with a replica each (Debian's redis-server, redis-sentinel, redis-cli).
-- Small timeouts (a sentinel sees a primary down after 1 s; a cluster node
-- after 1 s), free ports, no persistence; :stop() ends every process.
--
--   local ha = require "spec.helpers.redis_ha"
--   local t = ha.start("sentinel")     -- or "cluster", or "single"
--   t.redis          -- the lock's redis options (sentinels + master | nodes | host, port)
--   t:call(tag, ...) -- a command routed like the lock's (by the key's hash tag)
--   t:name(prefix, kind, key)  -- the lock's name of kind ("lock", "fence", ...) for key
--   t:failover(tag)  -- by hand: SENTINEL FAILOVER | CLUSTER FAILOVER on a replica; waits for it
--   t:primary(tag)   -- the primary's pid, host:port (of tag's slot on a cluster)
--   t:wait_primary(old) -- until a primary other than `old` serves
--   t:stop()
local core = require "warmbox.core"
local rc = require "warmbox.lock.redis_client"
local wbd = require "spec.helpers.warmboxd"
local single = require "spec.helpers.redis"

local q, read_all, alive, sleep = wbd.sh_quote, wbd.read_all, wbd.alive, core.sleep

local M = {}

function M.available(kind)
  if not single.available() then return false end
  if kind == "sentinel" then return os.execute("command -v redis-sentinel >/dev/null 2>&1") == true end
  if kind == "cluster" then return os.execute("command -v redis-cli >/dev/null 2>&1") == true end
  return true
end

-- The topologies a parametrised spec runs on (those this machine has).
function M.kinds()
  local list = {}
  for _, k in ipairs{ "single", "sentinel", "cluster" } do
    if M.available(k) then list[#list + 1] = k end
  end
  return list
end

local Topo = {}
Topo.__index = Topo

local function port_free(port)
  return not os.execute(string.format("env -u LD_PRELOAD bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d' 2>/dev/null", port))
end

-- A free port (and, for a cluster node, its bus port + 10000).
local function free_port(cluster)
  for _ = 1, 200 do
    local p = math.random(20000, 49999)
    if port_free(p) and (not cluster or port_free(p + 10000)) then return p end
  end
  error("no free port")
end

-- Starts one process `bin args` logging to dir/name.log; waits for `ready`
-- in the log. → pid | nil when its port was taken meanwhile.
local function spawn(self, name, bin, args, ready)
  local logf = self.dir .. "/" .. name .. ".log"
  local p = assert(io.popen(string.format("env -u LD_PRELOAD %s %s >%s 2>&1 & echo $!", bin, args, q(logf))))
  local pid = tonumber(p:read("l"))
  p:close()
  self.pids[#self.pids + 1] = pid
  local deadline = core.now() + 15
  while core.now() < deadline do
    local log = read_all(logf) or ""
    if log:find(ready, 1, true) then return pid end
    if not alive(pid) then
      if log:find("Address already in use", 1, true) then return nil end
      error(name .. " did not start: " .. log)
    end
    sleep(0.02)
  end
  error(name .. " did not become ready: " .. (read_all(logf) or ""))
end

-- spawn on a free port: args(port) makes the arguments. → pid, port
local function spawn_free(self, name, bin, args, ready, cluster)
  for _ = 1, 20 do
    local port = free_port(cluster)
    local pid = spawn(self, name, bin, args(port), ready)
    if pid then return pid, port end
  end
  error(name .. ": no free port")
end

local function server_args(self, port, extra)
  return string.format("--port %d --bind 127.0.0.1 --save '' --appendonly no --daemonize no --dir %s --logfile '' "
    .. "--repl-diskless-sync-delay 0 %s", port, q(self.dir), extra or "")
end

local function conn(host_port)
  local h, p = host_port:match("^(.*):(%d+)$")
  return core.redis{ host = h, port = tonumber(p), timeout = 2 }
end

local function eventually(fn, what, seconds)
  local deadline = core.now() + (seconds or 30)
  while core.now() < deadline do
    local v = fn()
    if v then return v end
    sleep(0.05)
  end
  error("timed out waiting for " .. what)
end

local function start_sentinel(self)
  self.pid_of = {}
  local ppid, pport = spawn_free(self, "primary", "redis-server", function(p) return server_args(self, p) end,
    "Ready to accept connections")
  self.pid_of["127.0.0.1:" .. pport] = ppid
  for i = 1, 2 do
    local pid, p = spawn_free(self, "replica" .. i, "redis-server",
      function(p) return server_args(self, p, string.format("--replicaof 127.0.0.1 %d", pport)) end,
      "Ready to accept connections")
    self.pid_of["127.0.0.1:" .. p] = pid
  end
  local pc = assert(conn("127.0.0.1:" .. pport))
  eventually(function() -- both replicas synced
    local role = pc:command("ROLE")
    return type(role) == "table" and type(role[3]) == "table" and #role[3] == 2
  end, "the replicas to sync")
  pc:close()
  self.master = "wbmaster"
  self.sentinels = {}
  for i = 1, 3 do
    local conf = self.dir .. "/sentinel" .. i .. ".conf"
    local _, sp = spawn_free(self, "sentinel" .. i, "redis-sentinel", function(sp)
      local f = assert(io.open(conf, "w"))
      f:write(string.format([[
port %d
bind 127.0.0.1
daemonize no
logfile ""
dir %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 4000
sentinel parallel-syncs %s 2
]], sp, self.dir, self.master, pport, self.master, self.master, self.master))
      f:close()
      return q(conf)
    end, "+monitor master")
    self.sentinels[i] = "127.0.0.1:" .. sp
  end
  -- every sentinel knows both replicas and the other two sentinels
  for _, s in ipairs(self.sentinels) do
    local c = assert(conn(s))
    eventually(function()
      local m = c:command("SENTINEL", "MASTER", self.master)
      if type(m) ~= "table" then return false end
      local kv = {}
      for i = 1, #m, 2 do kv[m[i]] = m[i + 1] end
      return kv["num-slaves"] == "2" and kv["num-other-sentinels"] == "2"
    end, "the sentinels to see each other")
    c:close()
  end
  self.redis = { sentinels = self.sentinels, master = self.master, timeout = 1 }
end

local function start_cluster(self)
  local addrs = {}
  self.pid_of = {}
  for i = 1, 6 do
    local pid, p = spawn_free(self, "node" .. i, "redis-server", function(p)
      return server_args(self, p, string.format("--cluster-enabled yes --cluster-config-file nodes-%d.conf "
        .. "--cluster-node-timeout 1000 --cluster-replica-validity-factor 0", p))
    end, "Ready to accept connections", true)
    local a = "127.0.0.1:" .. p
    self.pid_of[a] = pid
    addrs[i] = a
  end
  local out = self.dir .. "/create.log"
  local ok = os.execute(string.format(
    "env -u LD_PRELOAD redis-cli --cluster create %s --cluster-replicas 1 --cluster-yes >%s 2>&1",
    table.concat(addrs, " "), q(out)))
  if not ok then error("redis-cli --cluster create failed: " .. (read_all(out) or "")) end
  for _, a in ipairs(addrs) do
    local c = assert(conn(a))
    eventually(function()
      local info = c:command("CLUSTER", "INFO") or ""
      return info:find("cluster_state:ok", 1, true) and info:find("cluster_known_nodes:6", 1, true)
    end, "the cluster to be ok")
    c:close()
  end
  local c = assert(conn(addrs[1]))
  eventually(function() -- every primary with its replica, as the nodes see it
    local slots = c:command("CLUSTER", "SLOTS")
    if type(slots) ~= "table" or #slots < 3 then return false end
    for _, r in ipairs(slots) do
      if not r[4] then return false end
    end
    for _, a in ipairs(addrs) do
      local n = conn(a)
      local role = n and n:command("ROLE")
      if n then n:close() end
      if type(role) ~= "table" or (role[1] == "slave" and role[4] ~= "connected") then return false end
    end
    return true
  end, "the replicas to attach")
  c:close()
  self.nodes = addrs
  self.redis = { nodes = { addrs[1], addrs[2], addrs[3] }, timeout = 1 }
end

local function start_single(self)
  local pid, p = spawn_free(self, "redis", "redis-server", function(p) return server_args(self, p) end,
    "Ready to accept connections")
  self.pid_of = { ["127.0.0.1:" .. p] = pid }
  self.redis = { host = "127.0.0.1", port = p, timeout = 1 }
end

--- Starts topology `kind` ("single" | "sentinel" | "cluster").
function M.start(kind)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. q(dir)))
  local self = setmetatable({ kind = kind, dir = dir, pids = {} }, Topo)
  local ok, err = pcall(kind == "sentinel" and start_sentinel or kind == "cluster" and start_cluster or start_single,
    self)
  if not ok then
    self:stop()
    error(err, 0)
  end
  local r = { prefix = "" }
  for k, v in pairs(self.redis) do r[k] = v end
  r.timeout = 3 -- a client (and connections) of its own, not the lock's
  self.client = rc.client(r)
  self.copts = r
  return self
end

--- The lock's name of `kind` for `key` under `prefix`.
function Topo:name(prefix, kind, key)
  return (rc.name({ prefix = prefix, nodes = self.redis.nodes }, kind, key))
end

--- A command routed by `key`'s hash tag (any key of the conversation).
function Topo:call(key, ...)
  local _, tag = rc.name(self.copts, "x", key)
  return self.client:call(tag, ...)
end

--- A command on the primary serving `key` (CLIENT PAUSE, CLIENT KILL, ...).
function Topo:on_primary(key, ...)
  local _, a = self:primary(key)
  local c = assert(conn(assert(a, "no primary")))
  local res, err, code = c:command(...)
  c:close()
  return res, err, code
end

--- Lua source of the lock's redis options with `prefix` (for child processes).
function Topo:lua_opts(prefix)
  local parts = { string.format("prefix = %q, timeout = 1", prefix) }
  if self.redis.sentinels then
    parts[#parts + 1] = string.format("sentinels = { %q, %q, %q }, master = %q", self.sentinels[1],
      self.sentinels[2], self.sentinels[3], self.master)
  elseif self.redis.nodes then
    parts[#parts + 1] = string.format("nodes = { %q, %q, %q }", self.redis.nodes[1], self.redis.nodes[2],
      self.redis.nodes[3])
  else
    parts[#parts + 1] = string.format("host = '127.0.0.1', port = %d", self.redis.port)
  end
  return "{ " .. table.concat(parts, ", ") .. " }"
end

--- The lock's redis options with `prefix` (a fresh table).
function Topo:opts(prefix)
  local r = { prefix = prefix }
  for k, v in pairs(self.redis) do r[k] = v end
  return r
end

-- The primary the sentinels name, once every sentinel that answers names
-- the same one (right after a failover one may still name the old primary).
local function sentinel_primary(self)
  local deadline = core.now() + 10
  local seen
  repeat
    seen = nil
    local agree = true
    for _, s in ipairs(self.sentinels) do
      local c = conn(s)
      if c then
        local a = c:command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master)
        c:close()
        if type(a) == "table" then
          local addr = a[1] .. ":" .. a[2]
          if seen and seen ~= addr then agree = false end
          seen = seen or addr
        end
      end
    end
    if agree and seen then return seen end
    sleep(0.05)
  until core.now() > deadline
  return seen
end

-- The cluster node serving `key`'s slot, and one of its replicas.
local function cluster_owner(self, key)
  for _, a in ipairs(self.nodes) do
    local c = conn(a)
    if c then
      local slot = c:command("CLUSTER", "KEYSLOT", self:name("", "lock", key))
      local slots = c:command("CLUSTER", "SLOTS")
      c:close()
      if type(slots) == "table" then
        for _, r in ipairs(slots) do
          if slot >= r[1] and slot <= r[2] then
            local p = r[3][1] .. ":" .. r[3][2]
            local rep = r[4] and (r[4][1] .. ":" .. r[4][2]) or nil
            return p, rep
          end
        end
      end
    end
  end
end

--- The primary (of `key`'s slot on a cluster): its pid and host:port.
function Topo:primary(key)
  local a
  if self.kind == "sentinel" then
    a = sentinel_primary(self)
  elseif self.kind == "cluster" then
    a = cluster_owner(self, key or "")
  else
    a = "127.0.0.1:" .. self.redis.port
  end
  return self.pid_of[a], a
end

--- Waits until the primary (of `key`'s slot) is another than `old` (host:port) and takes writes.
function Topo:wait_primary(old, key, seconds)
  return eventually(function()
    local _, a = self:primary(key)
    if not a or a == old then return false end
    local c = conn(a)
    if not c then return false end
    local role = c:command("ROLE")
    c:close()
    return type(role) == "table" and role[1] == "master" and a
  end, "a new primary", seconds or 60)
end

--- A failover by hand: SENTINEL FAILOVER, or CLUSTER FAILOVER on a replica
-- of `key`'s slot; returns once the new primary takes writes.
function Topo:failover(key)
  local _, old = self:primary(key)
  if self.kind == "sentinel" then
    local c = assert(conn(self.sentinels[1]))
    local ok, err
    for _ = 1, 100 do -- "-INPROG" right after another failover
      ok, err = c:command("SENTINEL", "FAILOVER", self.master)
      if ok then break end
      sleep(0.1)
    end
    c:close()
    assert(ok, err)
  elseif self.kind == "cluster" then
    local _, rep = cluster_owner(self, key or "")
    local c = assert(conn(assert(rep, "no replica")))
    assert(c:command("CLUSTER", "FAILOVER"))
    c:close()
  else
    error("no failover on a single Redis")
  end
  return self:wait_primary(old, key)
end

--- Sends `sig` (KILL, STOP, CONT) to the primary (of `key`'s slot); returns its pid, address.
function Topo:signal_primary(sig, key)
  local pid, a = self:primary(key)
  assert(pid, "no primary")
  os.execute("kill -" .. sig .. " " .. pid .. " 2>/dev/null")
  return pid, a
end

--- Starts again a node killed at `addr` (as a replica: it rejoins).
function Topo:restart(addr)
  local port = tonumber(addr:match(":(%d+)$"))
  local extra = ""
  if self.kind == "cluster" then
    extra = string.format("--cluster-enabled yes --cluster-config-file nodes-%d.conf --cluster-node-timeout 1000 "
      .. "--cluster-replica-validity-factor 0", port)
  elseif self.kind == "sentinel" then
    local _, p = self:primary()
    extra = "--replicaof " .. p:gsub(":", " ")
  end
  local log = self.dir .. "/restart-" .. port .. ".log"
  os.remove(log)
  for _ = 1, 100 do
    local ok, pid = pcall(spawn, self, "restart-" .. port, "redis-server", server_args(self, port, extra),
      "Ready to accept connections")
    if ok and pid then
      self.pid_of[addr] = pid
      return
    end
    sleep(0.1)
  end
  error("could not restart " .. addr)
end

function Topo:stop()
  for _, pid in ipairs(self.pids) do os.execute("kill -CONT " .. pid .. " 2>/dev/null; kill -KILL " .. pid
    .. " 2>/dev/null") end
  for _, pid in ipairs(self.pids) do
    local deadline = core.now() + 5
    while alive(pid) and core.now() < deadline do sleep(0.01) end
  end
  self.pids = {}
  if os.getenv("WARMBOX_HA_KEEP") then
    io.stderr:write("redis_ha: kept ", self.dir, "\n")
  elseif self.dir:match("^/tmp/") then
    os.execute("rm -rf " .. q(self.dir))
  end
  rc.reset()
end

return M
