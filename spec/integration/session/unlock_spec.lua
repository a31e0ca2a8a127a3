-- A Redis hiccup at the end of a run: the run's result says its unlock
-- failed (r.unlock_error) instead of reporting a clean success.
local sessions = require "spec.helpers.sessions"
local redis_helper = require "spec.helpers.redis"

local describe_redis = redis_helper.available() and describe or pending

describe_redis("sessions: a failed unlock is reported (warmboxd + redis)", function()
  local env = sessions.new()
  local rds

  lazy_setup(function()
    env:start()
    rds = redis_helper.start()
  end)
  lazy_teardown(function()
    if rds then rds:stop() end
    env:stop()
  end)

  it("returns the run's result with unlock_error when Redis went away during the run", function()
    local wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60,
      lock = { backend = "redis", redis = { host = rds.host, port = rds.port }, timeout = 5 } }
    local s = wb:session("unlock:redis")
    assert(s:run("x = 1"))
    local r = assert(s:run("print('hi')", { on_stdout = function() rds:stop() end }))
    assert.equal("hi\n", r.stdout)
    assert.is_table(r.unlock_error)
    assert.is_string(r.unlock_error[1])
  end)
end)
