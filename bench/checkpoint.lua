-- Benchmark of checkpoints against warmboxd over HTTP: the latency
-- of s:checkpoint, s:branch (to its first answer) and s:rewind (to its first
-- answer), and what an automatic checkpoint (the policy hook) adds to a turn
-- as the user sees it: the run's own latency with and without the hook, in
-- tasks (the checkpoint goes on in the background) and blocking (its request
-- leaves before the run returns, its answer is taken at the next call; the
-- turns are 100 ms apart, as a user reading the reply).
-- Usage (from the repository root, after scripts/setup):
--   lua5.4 bench/checkpoint.lua [rounds=15] [rtt_ms=20]
local env = dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local core = require "warmbox.core"
local wbd = require "spec.helpers.warmboxd"
local warmbox = require "warmbox"

local ROUNDS, RTT = tonumber(arg[1]) or 15, tonumber(arg[2]) or 20
local srv = wbd.start{ bin = env.warmboxd, args = { "--rtt-ms", tostring(RTT) } }
local lockdir = os.tmpname()
os.remove(lockdir)

local function new_wb(policy)
  return assert(warmbox.new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key,
    lock = { backend = "file", dir = lockdir }, exec_timeout = 60, policy = policy })
end

local function ms(fn)
  local t = core.now()
  local a, b, c = fn()
  return (core.now() - t) * 1000, a, b, c
end

local function pct(v, p)
  table.sort(v)
  return v[math.max(1, math.ceil(#v * p))]
end

local rows = {}
local function row(name, v)
  rows[#rows + 1] = string.format("%-40s p50 %7.1f   p95 %7.1f   (n=%d)", name, pct(v, 0.5), pct(v, 0.95), #v)
end

local wb = new_wb()
local t_cp, t_branch, t_rewind = {}, {}, {}
local s = wb:session("bench:cp")
assert(s:run("x = 0"))
for i = 1, ROUNDS do
  assert(s:run("x += 1"))
  local d, cp = ms(function() return assert(s:checkpoint()) end)
  t_cp[#t_cp + 1] = d
  d = ms(function()
    local b = assert(s:branch(cp, "bench:cp/b" .. i))
    assert(b:run("1"))
  end)
  t_branch[#t_branch + 1] = d
  d = ms(function()
    assert(s:rewind(cp))
    assert(s:run("1"))
  end)
  t_rewind[#t_rewind + 1] = d
end
row("checkpoint", t_cp)
row("branch + its first run", t_branch)
row("rewind + the first run after it", t_rewind)

-- The turn as the user sees it: a warm run, without and with the checkpoint hook.
local function turns(policy, in_tasks, key)
  local w = new_wb(policy)
  local ss = w:session(key)
  assert(ss:run("x = 0"))
  ss:await_checkpoint()
  local v = {}
  for _ = 1, ROUNDS do
    if in_tasks then
      local d
      w:spawn(function() d = ms(function() return assert(ss:run("x += 1")) end) end)
      assert(w:loop()) -- the checkpoint task ends here, after the run's result was taken
      v[#v + 1] = d
    else
      -- the user reads the reply before the next turn (not timed): the snapshot's answer waits meanwhile
      core.sleep(0.1)
      v[#v + 1] = ms(function() return assert(ss:run("x += 1")) end)
    end
  end
  ss:await_checkpoint()
  w:close()
  return v
end
local every = { checkpoint = function() return true end }
row("turn, no checkpoint hook", turns(nil, false, "bench:plain"))
row("turn, hook (blocking caller)", turns(every, false, "bench:hook"))
row("turn, no checkpoint hook (in a task)", turns(nil, true, "bench:plain-t"))
row("turn, hook (in a task)", turns(every, true, "bench:hook-t"))

print(string.format("checkpoints against warmboxd --rtt-ms %d (ms, %d rounds)", RTT, ROUNDS))
for _, r in ipairs(rows) do print(r) end
wb:close()
srv:stop()
os.execute("rm -rf " .. wbd.sh_quote(lockdir))
