-- wb:gc_every across "hosts": processes sharing only warmboxd and a Redis lock
-- backend call it at the same moment; exactly one runs the pass, the others
-- get "busy" (or "not due" once it is done), and no sandbox is killed twice.
local wbd = require "spec.helpers.warmboxd"
local redis_helper = require "spec.helpers.redis"
local tag_mod = require "warmbox.tag"
local cjson = require "cjson.safe"

local describe_redis = redis_helper.available() and describe or pending

describe_redis("gc_every with the redis lock backend", function()
  local srv, redis

  lazy_setup(function()
    srv = wbd.start{ args = { "--rtt-ms", "20" } }
    redis = redis_helper.start()
  end)
  lazy_teardown(function()
    if srv then srv:stop() end
    if redis then redis:stop() end
  end)

  it("never runs two passes at once", function()
    for i = 1, 4 do
      local tv = tag_mod.tag_value("r:c" .. i, {})
      wbd.seed(srv, { count = 100, state = "paused", metadata = { warmboxSessionId = tv },
        started_ago_s = 31 * 86400, paused_ago_s = 30 * 86400 })
    end
    local child = string.format([[
      package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
      package.cpath = %q
      local wb = assert(require("warmbox").new{ api_url = %q, api_key = %q,
        lock = { backend = "redis", redis = { host = %q, port = %d } } })
      local rep, why = wb:gc_every(3600, { max_age = 86400, concurrency = 4 })
      io.write(require("cjson").encode({ ran = rep and true or false, why = why or "",
        killed = rep and rep.killed or 0 }), "\n")
      wb:close()
    ]], package.cpath, srv.url, srv.api_key, redis.host, redis.port)
    local outs = {}
    for i = 1, 3 do
      outs[i] = os.tmpname()
      os.execute(string.format("cd %s && lua5.4 -e %s >%s 2>&1 &", wbd.sh_quote(wbd.root()), wbd.sh_quote(child),
        outs[i]))
    end
    local results = {}
    assert(wbd.eventually(function()
      for i = 1, 3 do results[i] = cjson.decode(wbd.read_all(outs[i]) or "") end
      return results[1] and results[2] and results[3]
    end, 60))
    local ran, killed = 0, 0
    for i = 1, 3 do
      local r = results[i]
      if r.ran then
        ran = ran + 1
        killed = killed + r.killed
      else
        assert.is_true(r.why == "busy" or r.why == "not due", r.why)
      end
      os.remove(outs[i])
    end
    assert.equal(1, ran)
    assert.equal(400, killed)
    assert.equal(400, wbd.stats(srv).requests["DELETE /sandboxes/{id}"])
  end)
end)
