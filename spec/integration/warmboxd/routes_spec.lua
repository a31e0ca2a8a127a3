-- warmboxd's route table (csrc/warmboxd/control/routes.c): every control-plane
-- and admin route is one of its rows, requests are counted under the row that
-- took them, and what no row takes gets the same 404s as before the table.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

-- The rows of the table, read from its source: { route, auth, handler }.
local function rows()
  local out = {}
  local f = assert(io.open(wbd.root() .. "/csrc/warmboxd/control/routes.c", "rb"))
  local src = f:read("a")
  f:close()
  for route, auth, fn in src:gmatch('{%s*"([^"]+)",%s*WBD_AUTH_(%u+),%s*([%w_]+),') do
    out[#out + 1] = { route = route, auth = auth, fn = fn }
  end
  return out
end

describe("warmboxd's route table", function()
  local srv
  lazy_setup(function() srv = wbd.start() end)
  lazy_teardown(function() if srv then srv:stop() end end)

  local function no_key(method, path)
    return http.request{ method = method, url = srv.url .. path }
  end

  it("holds every control-plane route, the snapshot and fork routes and the admin API", function()
    local names = {}
    for _, r in ipairs(rows()) do names[r.route] = r.auth end
    for route, auth in pairs({
      ["GET /health"] = "NONE", ["POST /sandboxes"] = "TEAM", ["GET /v2/sandboxes"] = "TEAM",
      ["POST /sandboxes/{id}/pause"] = "SANDBOX", ["POST /v2/sandboxes/{id}/connect"] = "SANDBOX",
      ["POST /sandboxes/{id}/snapshots"] = "TEAM", ["POST /sandboxes/{id}/fork"] = "SANDBOX",
      ["DELETE /templates/{id}"] = "TEAM", ["GET /_warmboxd/stats"] = "ADMIN", ["* /_warmboxd/clock"] = "ADMIN",
    }) do
      assert.are.equal(auth, names[route], route)
    end
  end)

  it("counts a request under the row that took it, and checks the row's auth first", function()
    for _, r in ipairs(rows()) do
      local method, pattern = r.route:match("^(%S+) (%S+)$")
      if r.auth ~= "ADMIN" and method ~= "*" and r.fn ~= "NULL" then
        local path = pattern:gsub("{id}", "nosuchid")
        local before = srv:count(r.route)
        local res = no_key(method, path)
        assert.are.equal(r.auth == "NONE" and 200 or 401, res.status, r.route)
        assert.are.equal(before + 1, srv:count(r.route), r.route)
      end
    end
  end)

  it("answers a path no row takes as before: 404, counted as unknown", function()
    local key = wbd.new_key()
    for _, q in ipairs({ { "DELETE", "/sandboxes/metrics" }, { "POST", "/health" }, { "GET", "/v2/sandboxes/x" },
      { "DELETE", "/templates/a/b" }, { "POST", "/sandboxes/x" }, { "GET", "/sandboxes/x/" } }) do
      local before = srv:count("unknown")
      local res = http.request{ method = q[1], url = srv.url .. q[2], headers = { ["X-API-Key"] = key } }
      assert.are.equal(404, res.status, q[1] .. " " .. q[2])
      assert.are.same({ code = 404, message = "no route for " .. q[1] .. " " .. q[2] }, res.json)
      assert.are.equal(before + 1, srv:count("unknown"))
    end
  end)

  it("answers an admin path no row takes with the admin API's 404", function()
    local res = srv:admin("GET", "/faults")
    assert.are.equal(404, res.status)
    assert.are.same({ code = 404, message = "unknown warmboxd knob GET /_warmboxd/faults" }, res.json)
    assert.are.equal(200, srv:admin("GET", "/clock").status)
  end)

  it("gives a malformed sandbox id 400 once the key is good, on every SANDBOX row", function()
    local key = wbd.new_key()
    for _, r in ipairs(rows()) do
      local method, pattern = r.route:match("^(%S+) (%S+)$")
      if r.auth == "SANDBOX" then
        local res = http.request{ method = method, url = srv.url .. pattern:gsub("{id}", "BAD!"),
          headers = { ["X-API-Key"] = key } }
        assert.are.equal(400, res.status, r.route)
        assert.are.same({ code = 400, message = "Invalid sandbox ID" }, res.json)
      end
    end
  end)
end)
