-- The simulator and the ledger agree on the same traffic: a scripted chat
-- runs against warmboxd with its clock moved (three conversations, warm
-- runs, pauses at the lease's end, resumes, a late newcomer), the ledger
-- prices it from warmboxd's lifecycle events, the same recorded events are
-- replayed in the simulator as a trace (`warmbox simulate --events`), and
-- the two costs agree within 2% (the same creates and resumes too).
local sessions = require "spec.helpers.sessions"
local http = require "spec.helpers.http"
local cjson = require "cjson"

describe("simulator and ledger on recorded lifecycle events", function()
  local env = sessions.new()
  local srv, wb

  local function server_now() return sessions.utc(srv:admin("GET", "/clock").json.now) end

  lazy_setup(function()
    srv = env:start()
    -- The simulator plays Session:run without `parallel` (docs/simulator.md): so does this
    -- warmbox object, given a client with a transport of its own (a warmbox.new whose client
    -- goes through the engine runs a paused sandbox's first cell through the data plane's
    -- auto-resume, whose lease is E2B's 300 s at least, where the simulator connects with the
    -- policy's lease).
    local client = require("warmbox.e2b").new{ api_url = srv.url, sandbox_url = srv.url, api_key = srv.api_key,
      transport = (function()
        local h = require("warmbox.core").http{}
        return { request = function(_, req) return h:request(req) end }
      end)() }
    wb = env:warmbox{ exec_timeout = 30, idle_timeout = 60, clock = server_now, client = client }
  end)
  lazy_teardown(function() env:stop() end)

  -- Every event of the team, oldest first, all pages.
  local function all_events()
    local out, offset = {}, 0
    repeat
      local page = http.api(srv, "GET", "/events/sandboxes?orderAsc=true&limit=100&offset=" .. offset).json
      for _, e in ipairs(page) do out[#out + 1] = e end
      offset = offset + #page
    until #page < 100
    return out
  end

  it("agrees within 2% on the cost of a scripted chat", function()
    local A, B, C = wb:session("t1:a"), wb:session("t1:b"), wb:session("t2:c")
    local function run(s, code) assert(s:run(code or "x = 1")) end
    run(A); run(B)
    srv:advance(20)
    run(A, "x = 2")                 -- warm
    srv:advance(100)                -- both pause at their lease's end
    run(A, "x = 3"); run(C)         -- a resume, a create
    srv:advance(30)
    run(C, "x = 2"); run(B, "x = 2")
    srv:advance(50)
    run(A, "x = 4")
    srv:advance(500)                -- every one paused
    run(A, "x = 5")
    srv:advance(45)
    run(A, "x = 6")
    srv:advance(600)

    local now = server_now()
    local ledger = require("warmbox.ledger").new{ client = wb.client }
    assert(ledger:sync())
    local _, totals = ledger:costs{ now = now }
    assert.is_true(totals.usd > 0)

    local events = all_events()
    local path = os.tmpname()
    finally(function() os.remove(path) end)
    local f = assert(io.open(path, "w"))
    for _, e in ipairs(events) do f:write(cjson.encode(e), "\n") end
    f:close()
    local ev = require "warmbox.sim.events"
    local turns, info = ev.trace(assert(ev.load(path)))
    assert.are.equal(3, info.conversations)
    local report = assert(require("warmbox.sim").run{ trace = turns, size = info.size, exec_timeout = 30,
      idle_timeout = 60, gc_every = false,
      model = { rtt_ms = 0, create_ms = 0, kernel_ms = 0, resume_ms = 0, pause_ms = 0 } })
    local diff = math.abs(report.compute_cost - totals.usd) / totals.usd
    print(string.format("ledger $%.6f (%.1f s), simulator $%.6f (%.1f s): %.2f%% apart", totals.usd,
      totals.running_seconds, report.compute_cost, report.compute_seconds, diff * 100))
    assert.is_true(diff < 0.02, ("ledger %f, simulator %f"):format(totals.usd, report.compute_cost))
    -- the same lifecycle: creates and resumes
    local created, resumed = 0, 0
    for _, e in ipairs(events) do
      if e.type == "sandbox.lifecycle.created" then created = created + 1 end
      if e.type == "sandbox.lifecycle.resumed" then resumed = resumed + 1 end
    end
    assert.are.equal(created, report.created)
    assert.are.equal(resumed, report.model_resumes)
  end)

  it("warmbox simulate --events replays them and compares policies", function()
    local events = all_events()
    local path = os.tmpname()
    finally(function() os.remove(path) end)
    local f = assert(io.open(path, "w"))
    f:write(cjson.encode(events))
    f:close()
    local cli = require "spec.helpers.cli"
    local status, out, err = cli.run("--exec-timeout 30 --idle-timeout 60 simulate --events " .. path
      .. " --policies all")
    assert.are.equal(0, status, err)
    assert.matches("events " .. path:gsub("%p", "%%%0") .. ": 3 conversations", out)
    assert.matches("\ndefault ", out)
    assert.matches("\nno%-reuse ", out)
  end)
end)
