--- warmbox.sim.sandbox: the model's data plane (a sandbox handle of
-- `warmbox.sim.model`: `c:sandbox(id)`), as the session calls it: files,
-- directories and `run_code`, reached through the proxy (a paused sandbox
-- with autoResume is resumed, else 502).
-- @module warmbox.sim.sandbox

local outputs = require "warmbox.outputs"
local rq = require "warmbox.sim.requests"

local type, ipairs, tostring, setmetatable = type, ipairs, tostring, setmetatable
local string_format, math_max, math_min = string.format, math.max, math.min
local ctx, pass, REJECT, request, capped, resume, retry_after, settled_state =
  rq.ctx, rq.pass, rq.REJECT, rq.request, rq.capped, rq.resume, rq.retry_after, rq.settled_state

local Sandbox = {}
Sandbox.__index = Sandbox
Sandbox.__name = "warmbox.sim.Sandbox"

-- Reach the sandbox through the proxy: a paused one with autoResume (and a
-- memory snapshot) is resumed, else the proxy answers 502.
local function reach(self, id)
  local b = self.live[id]
  if b then settled_state(self, b) end
  if b and b.state == "paused" and b.auto_resume and b.memory then
    if capped(self) then return REJECT, retry_after(self) end
    resume(self, b, math_min(math_max(b.timeout, self.cfg.auto_resume_min), self.max_length))
    self.stats.auto_resumes = self.stats.auto_resumes + 1
  end
  if not b or b.state ~= "running" then
    return nil, string_format("sandbox '%s' is not reachable (the sandbox was not found)", id), "SANDBOX_GONE"
  end
  return b
end

local function dp(self, id, work)
  return request(self, function()
    local b, err, code = reach(self, id)
    if b == REJECT then return REJECT, err end
    if not b then return nil, err, code end
    return work(b)
  end, true, false)
end

function Sandbox:write_files(files)
  return dp(self.model, self.sandbox_id, function()
    local out = {}
    for i, f in ipairs(files) do out[i] = { path = f.path, name = f.path:match("[^/]*$"), type = "file" } end
    return out
  end)
end

function Sandbox:write_file(path, data)
  local r, err, code = self:write_files{ { path = path, data = data } }
  if not r then return nil, err, code end
  return r[1]
end

function Sandbox:read_file(path, _)
  return dp(self.model, self.sandbox_id, function()
    return nil, string_format("file '%s' not found", tostring(path)), "NOT_FOUND"
  end)
end

function Sandbox:remove(path)
  return dp(self.model, self.sandbox_id, function() return true, path end)
end

function Sandbox:make_dir(path)
  return dp(self.model, self.sandbox_id, function() return true, path end)
end

function Sandbox:list_dir(path) -- luacheck: ignore 212
  -- The simulated runs leave no files behind.
  return dp(self.model, self.sandbox_id, function() return {} end)
end

function Sandbox:stat(path)
  return dp(self.model, self.sandbox_id, function() return { path = path, type = "dir" } end)
end

--- `s:run_code(code, opts)`: the run takes `model.duration` seconds (set by
-- the simulator per run; 0 by default). The first cell on a fresh kernel
-- pays `kernel_ms`. warmbox's python hooks cell (`outputs.PRELUDE`) registers the
-- output hooks, so the kernel then reports its (empty) output directory the way
-- `warmbox.session` expects. A lease that runs out during the run pauses (or
-- kills) the sandbox under it: the stream breaks.
function Sandbox:run_code(code, opts)
  opts = opts or {}
  local m = self.model
  local c = ctx(m)
  -- warmbox's hooks cell (sent once per new kernel) takes no time of the run's own
  local duration = code == outputs.PRELUDE and 0 or c.duration or 0
  local timeout = opts.timeout
  m.stats.requests = m.stats.requests + 1
  pass(m, m.rtt / 2)
  local b, err, ecode = reach(m, self.sandbox_id)
  if b == REJECT then
    pass(m, m.rtt / 2)
    return nil, "429: too many running sandboxes", "RATE_LIMITED"   -- a stream is not retried
  end
  if not b then
    pass(m, m.rtt / 2)
    return nil, err, ecode
  end
  local epoch = b.epoch
  local function broken()
    -- Paused (lease ran out) or killed under the run: the stream breaks.
    if b.state == "paused" then m.stats.paused_during_run = m.stats.paused_during_run + 1 end
    pass(m, m.rtt / 2)
    return nil, "the stream broke: the sandbox was " .. (b.state == "paused" and "paused" or "killed")
      .. " during the run", "STREAM_BROKEN"
  end
  if not b.kernel then
    pass(m, m.cfg.kernel_ms / 1000)
    if b.epoch ~= epoch then return broken() end
    b.kernel, b.hooked = true, false
  end
  c.mark.code_started = m.now
  c.mark.sandbox_id = b.id
  m.stats.runs = m.stats.runs + 1
  local stop = duration
  local timed_out = timeout and duration > timeout
  if timed_out then stop = timeout end
  local finish = m.now + stop
  -- Run until the end, or until the lease runs out under the run.
  pass(m, math_min(finish, b.end_at) - m.now)
  if b.epoch ~= epoch and b.stopped_at < finish then return broken() end
  if m.now < finish then
    pass(m, finish - m.now)
    if b.epoch ~= epoch and b.stopped_at < finish then return broken() end
  end
  pass(m, m.rtt / 2)
  if timed_out then return nil, "execution timed out", "TIMEOUT" end
  b.executions = b.executions + 1
  local language = opts.language or "python"
  local results = {}
  if language == "python" then
    -- The kernel gets the hooks from warmbox's hooks cell (warmbox.outputs' source).
    if not b.hooked and type(code) == "string" and code:find(outputs.PRELUDE, 1, true) then
      b.hooked = true
    end
    if b.hooked then
      local res = { is_main_result = false, extra = { [outputs.OUTPUTS_MIME] = { v = 1, files = {} } } }
      if opts.on_result then opts.on_result(res) end
      results[1] = res
    end
  end
  return { stdout = {}, stderr = {}, results = results, error = nil, execution_count = b.executions }
end

--- A data-plane handle of sandbox `id` on `model`.
local function new(model, id)
  return setmetatable({ model = model, sandbox_id = id }, Sandbox)
end

return { Sandbox = Sandbox, new = new }
