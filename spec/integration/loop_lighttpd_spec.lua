-- the blocking-host recipe, lighttpd + mod_magnet
-- (examples/lighttpd/), 2 workers, on loopback. Each worker is a process of
-- its own with its own warmbox object; through the user's shared local server
-- they see one sandbox per conversation: the counter cell gives 1..6 (with a
-- private server per process it gave 1, 1, 2, 2, 3, 3). The cell is on one line:
-- lighttpd refuses control characters (a newline) in a URL.
local COUNTER = "x = globals().get('x', 0) + 1; x"
local wbd = require "spec.helpers.warmboxd"
local hosts = require "spec.helpers.hosts"

local q = wbd.sh_quote

local function urlenc(s)
  return (s:gsub("[^%w%-_%.~]", function(c) return string.format("%%%02X", c:byte()) end))
end

describe("examples/lighttpd (mod_magnet, 2 workers)", function()
  local host, errlog
  lazy_teardown(function()
    hosts.stop(host)
    if errlog then os.remove(errlog) end
    require("warmbox.server").stop_local()
  end)

  it("one conversation across both workers: the counter gives 1, 2, 3, 4, 5, 6", function()
    local port = hosts.free_port()
    errlog = os.tmpname()
    host = hosts.start("WARMBOX_EXAMPLE_DIR=" .. q(hosts.root() .. "/examples/lighttpd") .. " PORT=" .. port
      .. " LIGHTTPD_ERRORLOG=" .. q(errlog) .. " lighttpd -D -f examples/lighttpd/lighttpd.conf", "()", 5)
    assert.is_true(wbd.eventually(function()
      return (wbd.read_all(errlog) or ""):find("server started", 1, true) ~= nil
    end, 30), "lighttpd did not start: " .. tostring(wbd.read_all(errlog)) .. tostring(wbd.read_all(host.log)))
    local url = "http://127.0.0.1:" .. port .. "/run?key=lighttpd%3A1&code=" .. urlenc(COUNTER)
    -- A new connection per request: the kernel hands each to either worker.
    -- Six at least, and on until both workers served (each with its own
    -- warmbox object): the counter goes on from where the other worker left it.
    local got, workers, seen = {}, {}, 0
    repeat
      local status, body, headers = hosts.http("GET", url)
      assert.equal(200, status, body)
      got[#got + 1] = body:gsub("\n$", "")
      local w = headers["x-worker"]
      if not workers[w] then seen = seen + 1 end
      workers[w] = (workers[w] or 0) + 1
    until #got >= 6 and seen >= 2 or #got >= 60
    assert.equal(2, seen, "one worker served all " .. #got .. " requests")
    local want = {}
    for i = 1, #got do want[i] = tostring(i) end
    assert.same(want, got)
    assert.same({ "1", "2", "3", "4", "5", "6" }, { table.unpack(got, 1, 6) })
    local status, body = hosts.http("GET", "http://127.0.0.1:" .. port .. "/run?key=lighttpd%3A1&code=1%2F0")
    assert.equal(422, status)
    assert.matches("ZeroDivisionError", body)
    -- what the cell printed comes back too (then its value, when it has one)
    status, body = hosts.http("GET", "http://127.0.0.1:" .. port .. "/run?key=lighttpd%3A1&code=print(%22hi%22)")
    assert.equal(200, status)
    assert.equal("hi\n", body)
  end)
end)
