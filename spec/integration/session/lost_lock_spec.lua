-- A conversation's lock lost while its cell runs: Redis restarted without
-- persistence mid-cell, or a holder stopped past its lock's expiry. A later
-- run of the conversation takes the lock (its fence is higher), but the
-- sandbox never runs its cell while the older one still executes; and the
-- older run, whose cell ran to its end, is never reported as refused.
-- Each cell writes "start <mark>" and "end <mark>" to a ledger in its sandbox.
local wbd = require "spec.helpers.warmboxd"
local sessions = require "spec.helpers.sessions"
local redis_helper = require "spec.helpers.redis"
local ledger_helper = require "spec.helpers.ledger"


describe("sessions: a lock lost while its cell runs (warmboxd)", function()
  local env = sessions.new()
  local srv, redis

  lazy_setup(function()
    srv = env:start()
    if redis_helper.available() then redis = redis_helper.start() end
  end)
  lazy_teardown(function()
    env:stop()
    if redis then redis:stop() end
  end)

  local function lock_src(backend)
    if backend == "redis" then
      return string.format("{ backend = 'redis', redis = { host = %q, port = %d }, ttl = 1, timeout = 60 }",
        redis.host, redis.port)
    end
    return string.format("{ backend = 'file', dir = %q, exptime = 1, timeout = 60 }", env.lockdir)
  end

  -- A holder process: one run of `code`; writes "<ok|code> <lock_lost or ->" to `out`. → pid
  local function holder(backend, key, code, language, out)
    local script = string.format([[
      package.path = %q
      package.cpath = %q
      local wb = assert(require("warmbox").new{ api_url = %q, sandbox_url = %q, api_key = %q,
        lock = %s, exec_timeout = 60, idle_timeout = 60 })
      local r, _, code, detail = wb:session(%q):run(%q, { language = %q })
      local lost = r and r.lock_lost or (type(detail) == "table" and detail.lock_lost)
      local f = assert(io.open(%q, "w"))
      f:write(r and "ok" or tostring(code), " ", lost and "lost" or "-", "\n")
      f:close()
      wb:close()
    ]], package.path, package.cpath, srv.url, srv.url, srv.api_key, lock_src(backend), key, code, language, out)
    local pid = sessions.spawn_lua(script)
    finally(function() os.execute("kill -CONT " .. pid .. " 2>/dev/null") end)
    return pid
  end

  local function result_of(out)
    return sessions.result_line(out):match("^(%S+) (%S+)")
  end

  local function ledger(id) return ledger_helper.read(srv, id) end
  local cell = ledger_helper.cell

  -- The ledger's cells never interleave: each start is followed by its own end.
  local function serial(id)
    local l, open = ledger(id), nil
    for _, line in ipairs(l) do
      local what, mark = line:match("^(%S+) (%S+)$")
      if what == "start" then
        assert.is_nil(open, "cell " .. mark .. " started while " .. tostring(open) .. " ran: " .. table.concat(l, ", "))
        open = mark
      else
        assert.equal(open, mark, table.concat(l, ", "))
        open = nil
      end
    end
    return l
  end

  local function count(l, line)
    local n = 0
    for _, x in ipairs(l) do if x == line then n = n + 1 end end
    return n
  end

  local function warm(backend, key, lang)
    local lock = assert(load("return " .. lock_src(backend)))()
    local wb = env:warmbox{ exec_timeout = 60, idle_timeout = 60, lock = lock }
    local s = wb:session(key)
    local r = assert(s:run(lang == "bash" and "true" or "1", { language = lang }))
    return wb, s, r.sandbox_id
  end

  for _, langs in ipairs({ { "python", "python" }, { "bash", "bash" }, { "python", "bash" }, { "bash", "python" } }) do
    local lang, lang2 = langs[1], langs[2]
    for _, how in ipairs({ "redis restart", "holder stopped" }) do
      local backend = how == "redis restart" and "redis" or "file"
      local name = lang .. " then " .. lang2 .. ", " .. how
      it(name .. " mid-cell: the later cell never runs while the older one does", function()
        if backend == "redis" and not redis then pending("redis-server not installed") return end
        local key = "lost:" .. lang .. lang2 .. ":" .. how:gsub(" ", "-")
        local wb, s, id = warm(backend, key, lang)
        local code2, mark2 = cell(lang2)
        local code1, mark1 = cell(lang, mark2)
        local out = os.tmpname()
        local pid = holder(backend, key, code1, lang, out)
        wbd.eventually(function() return count(ledger(id), "start " .. mark1) == 1 end, 30)
        if how == "redis restart" then redis:restart() else os.execute("kill -STOP " .. pid) end
        local b
        wb:spawn(function()
          b = table.pack(s:run(code2, { language = lang2 }))
          -- the first command on a connection the restart broke fails (LOCK); the next reconnects
          if b[3] == "LOCK" then b = table.pack(s:run(code2, { language = lang2 })) end
        end)
        assert(wb:loop())
        os.execute("kill -CONT " .. pid)
        local a, lost = result_of(out)
        local l = serial(id)
        assert.equal(1, count(l, "start " .. mark1), table.concat(l, ", "))
        -- the older cell ran to its end: its run is never reported refused
        assert.equal("ok", a)
        assert.equal("lost", lost)
        assert(b[1], b[2])
        assert.equal(1, count(l, "end " .. mark2), table.concat(l, ", "))
        wb:close()
      end)
    end
  end
end)
