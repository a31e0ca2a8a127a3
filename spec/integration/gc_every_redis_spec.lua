-- wb:gc_every across "hosts": processes sharing only warmboxd and a Redis lock
-- backend call it at the same moment; exactly one runs the pass, the others
-- get "busy" (or "not due" once it is done), and no sandbox is killed twice;
-- and 3 processes running wb:gc at once kill each sandbox once, never one
-- whose session a run holds.
local wbd = require "spec.helpers.warmboxd"
local redis_ha = require "spec.helpers.redis_ha"
local tag_mod = require "warmbox.tag"
local cjson = require "cjson.safe"

-- On one Redis, on Sentinel and on a Cluster (those this machine has).
for _, kind in ipairs(redis_ha.kinds()) do
describe("gc_every with the redis lock backend (" .. kind .. ")", function()
  local srv, redis

  lazy_setup(function()
    srv = wbd.start{ args = { "--rtt-ms", "20" } }
    redis = redis_ha.start(kind)
  end)
  lazy_teardown(function()
    if srv then srv:stop() end
    if redis then redis:stop() end
  end)

  -- Runs `body` (Lua source; `wb` is a warmbox on this server and Redis) in 3
  -- processes at once; → their JSON results.
  local function three(body)
    local child = string.format([[
      package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
      package.cpath = %q
      local wb = assert(require("warmbox").new{ api_url = %q, api_key = %q,
        lock = { backend = "redis", redis = %s } })
      %s
      wb:close()
    ]], package.cpath, srv.url, srv.api_key, redis:lua_opts(""), body)
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
    end, 60), wbd.read_all(outs[1]))
    for i = 1, 3 do os.remove(outs[i]) end
    return results
  end

  it("never runs two passes at once", function()
    local before = wbd.stats(srv).requests["DELETE /sandboxes/{id}"] or 0
    for i = 1, 4 do
      local tv = tag_mod.tag_value("r:c" .. i, {})
      wbd.seed(srv, { count = 100, state = "paused", metadata = { warmboxSessionId = tv },
        started_ago_s = 31 * 86400, paused_ago_s = 30 * 86400 })
    end
    local results = three([[
      local rep, why = wb:gc_every(3600, { max_age = 86400, concurrency = 4 })
      io.write(require("cjson").encode({ ran = rep and true or false, why = why or "",
        killed = rep and rep.killed or 0 }), "\n")
    ]])
    local ran, killed = 0, 0
    for i = 1, 3 do
      local r = results[i]
      if r.ran then
        ran = ran + 1
        killed = killed + r.killed
      else
        assert.is_true(r.why == "busy" or r.why == "not due", r.why)
      end
    end
    assert.equal(1, ran)
    assert.equal(400, killed)
    assert.equal(400, wbd.stats(srv).requests["DELETE /sandboxes/{id}"] - before)
  end)

  it("3 hosts collecting at once: no sandbox killed twice, never one whose session is held", function()
    local before = wbd.stats(srv).requests["DELETE /sandboxes/{id}"] or 0
    for i = 1, 6 do
      local tv = tag_mod.tag_value("g:c" .. i, {})
      wbd.seed(srv, { count = 20, state = "paused", metadata = { warmboxSessionId = tv },
        started_ago_s = 31 * 86400, paused_ago_s = 30 * 86400 })
    end
    -- a run holds the session of g:c1: its sandboxes stay
    local lock = require "warmbox.lock"
    local busy = lock.new{ backend = "redis", redis = redis:opts("") }
    assert.truthy(busy:lock(tag_mod.tag_value("g:c1", {})))
    local results = three([[
      local rep = assert(wb:gc{ max_age = 86400, concurrency = 4 })
      io.write(require("cjson").encode({ killed = rep.killed }), "\n")
    ]])
    busy:unlock()
    local killed = 0
    for i = 1, 3 do killed = killed + results[i].killed end
    assert.equal(100, killed)
    assert.equal(100, (wbd.stats(srv).requests["DELETE /sandboxes/{id}"] or 0) - before)
  end)
end)
end
