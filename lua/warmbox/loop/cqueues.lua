--- warmbox from cqueues: the waiting calls, made from any `cq:wrap`
-- coroutine, yield to cqueues (as lua-http's calls do) while other coroutines
-- run; the call returns what it returns when made directly.
--
--   local cqueues = require "cqueues"
--   local cq = cqueues.new()
--   local b = require("warmbox.loop.cqueues").new(wb, cq)
--   cq:wrap(function()
--     local r = assert(b:session("ws:1"):run("1 + 1"))   -- yields until the run is done
--   end)
--   assert(cq:loop())          -- ends when every coroutine did, not before
--
-- Each call runs as a warmbox task; a driver coroutine on `cq` steps the engine
-- (`cqueues.poll(wb)`: its fd and timeout) while tasks are pending, and ends
-- when none is (a later call starts it again). Outside a cqueues coroutine, or
-- inside a warmbox task, a call is made directly (it blocks, or yields to the
-- task's engine, as ever).
-- @module warmbox.loop.cqueues

local cqueues = require "cqueues"
local condition = require "cqueues.condition"

local setmetatable, type, error, ipairs = setmetatable, type, error, ipairs

local _M = {}

local Bridge = {}
Bridge.__index = Bridge
Bridge.__name = "warmbox.loop.cqueues.Bridge"

--- A bridge between `wb` and the cqueues controller `cq`.
-- @tparam warmbox.Warmbox wb
-- @tparam cqueues.controller cq
-- @treturn warmbox.loop.cqueues.Bridge
function _M.new(wb, cq)
  if type(wb) ~= "table" or type(wb.spawn) ~= "function" then
    error("bad argument #1 to 'new' (warmbox.Warmbox expected, got " .. type(wb) .. ")", 2)
  end
  if type(cq) ~= "userdata" and type(cq) ~= "table" or type(cq.wrap) ~= "function" then
    error("bad argument #2 to 'new' (cqueues controller expected, got " .. type(cq) .. ")", 2)
  end
  return setmetatable({ wb = wb, cq = cq, kick = condition.new() }, Bridge)
end

-- The driver: one coroutine on cq while tasks are pending.
local function drive(self)
  if self.driving then return self.kick:signal() end
  self.driving = true
  self.cq:wrap(function()
    local wb = self.wb
    while not wb.closed do
      wb:step(0)
      if wb.closed or wb:pending() == 0 then break end
      if wb:timeout() ~= 0 then cqueues.poll(wb, self.kick) end
    end
    self.driving = false
  end)
end

local function returns(t)
  -- a task that raised: raise as the direct call would have
  if t.err ~= nil and t.code == "TASK" then error(t.err, 0) end
  return t:result()
end

--- Call `fn(...)` as a warmbox task and wait for it, yielding to cqueues.
-- @return what `fn` returns (an error it raises is raised)
function Bridge:call(fn, ...)
  if type(fn) ~= "function" then
    error("bad argument #1 to 'call' (function expected, got " .. type(fn) .. ")", 2)
  end
  local _, in_cq = cqueues.running() -- true in a cq:wrap coroutine itself (not one nested in it)
  -- (already in a task of wb's runner: called as it is, it yields to the engine)
  local r = self.wb.runner
  if not in_cq or (r and r:where()) then return fn(...) end
  local t = self.wb:spawn(fn, ...)
  local done = condition.new()
  t:on_done(function() done:signal() end)
  drive(self)
  while not t:done() do done:wait() end
  return returns(t)
end

-- An object whose methods go through call.
local function proxy(self, obj)
  return setmetatable({}, { __index = function(_, name)
    local v = obj[name]
    if type(v) ~= "function" then return v end
    return function(_, ...) return self:call(v, obj, ...) end
  end })
end

--- `wb:session(key, opts)`, whose methods (`run`, `prewarm`, ...) yield to cqueues.
function Bridge:session(key, opts)
  return proxy(self, self.wb:session(key, opts))
end

for _, name in ipairs({ "release", "sessions", "gc", "gc_every" }) do
  Bridge[name] = function(self, ...)
    local wb = self.wb
    return self:call(function(...) return wb[name](wb, ...) end, ...)
  end
end

return _M
