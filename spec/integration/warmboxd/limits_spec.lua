-- warmboxd against hostile clients: the admin API's
-- token and gate, stats that keep no client-chosen path, per-route body limits
-- checked before the body is read, bounded metadata and envVars, numeric
-- headers that saturate, and connections that cannot lock everyone out.
-- Traffic goes to loopback only (127.0.0.1, and 127.0.0.2 as a second client).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local cjson = http.cjson

-- kind "body": whole heads, slow bodies; health_from: the address /health is asked from;
-- pid: also report that server's threads and RSS while the connections are held.
local function slow_conns(port, n, wait_close, trickle, kind, health_from, pid)
  local cmd = string.format("timeout 60 python3 %s %d %d %s %s %s %s %s",
    wbd.sh_quote(wbd.root() .. "/spec/helpers/slow_conns.py"), port, n, tostring(wait_close or 0),
    tostring(trickle or 0), kind or "head", health_from or "127.0.0.2", pid and tostring(pid) or "")
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return assert(cjson.decode(out), "slow_conns.py printed: " .. out)
end

local function tmpfile(bytes)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  local chunk = string.rep("x", 65536)
  local left = bytes
  while left > 0 do
    f:write(chunk:sub(1, math.min(left, #chunk)))
    left = left - #chunk
  end
  f:close()
  return path
end

describe("warmboxd limits", function()
  local srv

  lazy_setup(function() srv = wbd.start{} end)
  lazy_teardown(function() if srv then srv:stop() end end)

  local function admin(path, o)
    o = o or {}
    o.url = srv.url .. "/_warmboxd" .. path
    return http.request(o)
  end

  describe("the admin API", function()
    it("answers 401 without its token or with a wrong one", function()
      local res = admin("/stats", { admin_token = false })
      assert.are.equal(401, res.status)
      assert.matches("X%-Warmboxd%-Token", res.json.message)
      local wrong = { ["X-Warmboxd-Token"] = "wrong-token-of-some-length" }
      assert.are.equal(401, admin("/stats", { headers = wrong }).status)
      assert.are.equal(401, admin("/seed", { method = "POST", admin_token = false,
        headers = { ["X-API-Key"] = srv.api_key }, json = { count = 1 } }).status)
      assert.are.equal(401, admin("/config", { method = "POST", admin_token = false, json = { rtt_ms = 5000 } }).status)
      assert.are.equal(401, admin("/faults", { method = "POST", admin_token = false,
        json = { route = "*", status = 500, count = 100 } }).status)
      -- nothing of the refused calls took effect
      assert.are.equal(200, http.api(srv, "GET", "/health").status)
    end)

    it("answers with its token", function()
      local res = admin("/stats")
      assert.are.equal(200, res.status)
      assert.is_table(res.json.requests)
    end)

    it("refuses a request with an Origin header, even with the token (403)", function()
      local res = admin("/stats", { headers = { Origin = "http://localhost:3000" } })
      assert.are.equal(403, res.status)
      assert.matches("Origin", res.json.message)
      assert.are.equal(403, admin("/faults", { method = "POST", headers = { Origin = "null" },
        json = { route = "*", status = 500 } }).status)
    end)

    it("refuses a Host that is not loopback, even with the token (403)", function()
      for _, host in ipairs({ "evil.example", "10.0.0.1", "127.0.0.1.evil.example", "localhost.evil", "[::2]" }) do
        local res = admin("/stats", { headers = { Host = host } })
        assert.are.equal(403, res.status, host)
      end
      for _, host in ipairs({ "localhost", "127.0.0.1:" .. srv.port, "127.1.2.3", "[::1]:80" }) do
        assert.are.equal(200, admin("/stats", { headers = { Host = host } }).status, host)
      end
    end)

    it("writes a random token to <data-dir>/admin-token (0600) when none is given", function()
      local server = require "warmbox.server"
      local s = assert(server.start{ bin = wbd.bin() })
      local ok, err = pcall(function()
        assert.matches("^%x+$", s.admin_token)
        assert.are.equal(64, #s.admin_token)
        local p = assert(io.popen("stat -c %a " .. wbd.sh_quote(s.dir .. "/data/admin-token")))
        local mode = p:read("l")
        p:close()
        assert.are.equal("600", mode)
        assert.are.equal(401, http.request{ url = s.url .. "/_warmboxd/stats" }.status)
        assert.are.equal(200, http.request{ url = s.url .. "/_warmboxd/stats", admin_token = s.admin_token }.status)
      end)
      s:stop()
      assert(ok, err)
    end)

    it("refuses a short --admin-token at start-up", function()
      assert.has_error(function() wbd.start{ args = { "--admin-token", "short" } } end)
    end)
  end)

  describe("stats", function()
    it("count unknown routes under one name, never by path", function()
      assert.are.equal(204, admin("/stats/reset", { method = "POST" }).status)
      http.api(srv, "GET", "/secret-path-one/abc")
      http.api(srv, "POST", "/sandboxes/i123/secret-path-two")
      http.request{ url = srv.url .. "/secret-path-three", headers = { ["E2b-Sandbox-Id"] = "isecretid",
        ["E2b-Sandbox-Port"] = "49983" } }
      http.request{ url = srv.url .. "/contexts/x/secret-path-four", headers = { ["E2b-Sandbox-Id"] = "isecretid",
        ["E2b-Sandbox-Port"] = "49999" } }
      http.request{ url = srv.url .. "/x",
        headers = { ["E2b-Sandbox-Id"] = "isecretid", ["E2b-Sandbox-Port"] = "8080" } }
      local st = admin("/stats").json
      local body = assert(cjson.encode(st))
      assert.is_nil(body:find("secret", 1, true), body)
      assert.are.equal(2, st.requests.unknown)
      assert.are.equal(1, st.requests["envd GET unknown"])
      assert.are.equal(1, st.requests["interp GET unknown"])
      assert.are.equal(1, st.requests["other-port GET unknown"])
    end)
  end)

  describe("request bodies", function()
    it("answers 413 from Content-Length alone, before any body is read", function()
      -- Claims 1 GiB and sends one byte: only an answer from the headers can come back.
      local res = http.api(srv, "POST", "/sandboxes", nil, { body = "x", timeout = 10,
        headers = { ["Content-Length"] = tostring(1 << 30), ["Content-Type"] = "application/json" } })
      assert.are.equal(413, res.status)
      assert.matches("too large", res.json.message)
    end)

    it("limits the control plane to 1 MiB, and a caller without a valid key to 64 KiB", function()
      local big = tmpfile(2 << 20)
      local small = tmpfile(100 << 10)
      local ok, err = pcall(function()
        local res = http.api(srv, "POST", "/sandboxes", nil, { curl_args = { "--data-binary", "@" .. big },
          headers = { ["Content-Type"] = "application/json" } })
        assert.are.equal(413, res.status)
        -- 100 KiB: fine for a team (the JSON is bad: 400), too much without a key
        res = http.api(srv, "POST", "/sandboxes", nil, { curl_args = { "--data-binary", "@" .. small },
          headers = { ["Content-Type"] = "application/json" } })
        assert.are.equal(400, res.status)
        res = http.request{ method = "POST", url = srv.url .. "/sandboxes",
          curl_args = { "--data-binary", "@" .. small }, headers = { ["Content-Type"] = "application/json" } }
        assert.are.equal(413, res.status)
        res = http.request{ method = "POST", url = srv.url .. "/sandboxes",
          curl_args = { "--data-binary", "@" .. small }, headers = { ["X-API-Key"] = "e2b_nothex!" } }
        assert.are.equal(413, res.status)
      end)
      os.remove(big)
      os.remove(small)
      assert(ok, err)
    end)

    it("closes a chunked body that runs over the limit", function()
      local big = tmpfile(3 << 20)
      local res = http.api(srv, "POST", "/sandboxes", nil, { curl_args = { "--data-binary", "@" .. big },
        headers = { ["Transfer-Encoding"] = "chunked", ["Content-Type"] = "application/json" } })
      os.remove(big)
      assert.are_not.equal(201, res.status)
      assert.are_not.equal(400, res.status)
      assert.are.equal(200, http.api(srv, "GET", "/health").status)
    end)

    describe("on the data plane", function()
      local sb
      lazy_setup(function()
        sb = http.create(srv, { templateID = "base", secure = true, timeout = 600 })
      end)

      it("takes uploads up to --max-upload-mb, and 64 KiB without the access token", function()
        local res = http.sandbox(srv, sb, 49983, "POST", "/files?path=big.bin", { body = "x",
          headers = { ["Content-Type"] = "application/octet-stream", ["Content-Length"] = tostring(101 << 20) } })
        assert.are.equal(413, res.status)
        local mid = tmpfile(200 << 10)
        local ok, err = pcall(function()
          local octet = { ["Content-Type"] = "application/octet-stream" }
          res = http.sandbox(srv, sb, 49983, "POST", "/files?path=mid.bin",
            { curl_args = { "--data-binary", "@" .. mid }, headers = octet })
          assert.are.equal(200, res.status, res.body)
          res = http.sandbox(srv, sb, 49983, "POST", "/files?path=mid.bin",
            { curl_args = { "--data-binary", "@" .. mid },
              headers = { ["Content-Type"] = "application/octet-stream", ["X-Access-Token"] = "wrong" } })
          assert.are.equal(413, res.status)
          -- a signature that does not check out is no credential either
          res = http.sandbox(srv, { sandboxID = sb.sandboxID }, 49983, "POST",
            "/files?path=mid.bin&signature=v1_forged", { curl_args = { "--data-binary", "@" .. mid }, headers = octet })
          assert.are.equal(413, res.status)
          res = http.sandbox(srv, { sandboxID = "inosuchsandbox" }, 49983, "POST", "/files?path=mid.bin",
            { curl_args = { "--data-binary", "@" .. mid }, headers = octet })
          assert.are.equal(413, res.status)
        end)
        os.remove(mid)
        assert(ok, err)
        -- a client that sends its whole body before it reads still gets the
        -- 413 (the refused body is read and dropped, not met with a closed
        -- connection its send fails on)
        local p = assert(io.popen(table.concat({ "env -u LD_PRELOAD python3",
          wbd.sh_quote(wbd.root() .. "/spec/helpers/send_first.py"),
          srv.port, wbd.sh_quote("/files?path=mid.bin&signature=v1_forged"), 1000 << 10, "0.5",
          wbd.sh_quote("E2b-Sandbox-Id: " .. sb.sandboxID), wbd.sh_quote("E2b-Sandbox-Port: 49983"),
          wbd.sh_quote("Content-Type: application/octet-stream") }, " ")))
        local sent = cjson.decode(p:read("a"))
        p:close()
        local why = sent.error ~= cjson.null and sent.error or nil
        assert.are.same({ status = 413 }, { status = sent.status, error = why })
        -- a small unauthenticated body still gets the handler's own 401
        res = http.sandbox(srv, sb, 49983, "POST", "/files?path=a.txt", { body = "hi",
          headers = { ["Content-Type"] = "application/octet-stream", ["X-Access-Token"] = "wrong" } })
        assert.are.equal(401, res.status)
      end)
    end)
  end)

  describe("metadata and envVars", function()
    local function create(body)
      body.templateID = "base"
      body.timeout = 60
      return http.api(srv, "POST", "/sandboxes", body)
    end

    it("answers 400 for too many keys, a long key, or too many bytes", function()
      local many = {}
      for i = 1, 1001 do many["k" .. i] = "v" end
      local res = create{ metadata = many }
      assert.are.equal(400, res.status)
      assert.matches("/metadata.*1000 entries", res.json.message)
      assert.are.equal(400, create{ metadata = { [string.rep("k", 257)] = "v" } }.status)
      res = create{ metadata = { big = string.rep("v", 65 << 10) } }
      assert.are.equal(400, res.status)
      assert.matches("64 KiB", res.json.message)
      res = create{ envVars = { BIG = string.rep("v", 257 << 10) } }
      assert.are.equal(400, res.status)
      assert.matches("/envVars.*256 KiB", res.json.message)
      assert.are.equal(400, create{ envVars = many }.status)
    end)

    it("takes metadata and envVars within the limits", function()
      local meta = {}
      for i = 1, 1000 do meta["k" .. i] = "v" end
      local res = create{ metadata = meta, envVars = { BIG = string.rep("v", 200 << 10) } }
      assert.are.equal(201, res.status, res.body)
      assert.are.equal(204, http.api(srv, "DELETE", "/sandboxes/" .. res.json.sandboxID).status)
    end)
  end)

  describe("numbers from clients", function()
    it("saturates a huge E2b-Sandbox-Port instead of overflowing", function()
      local res = http.request{ url = srv.url .. "/health", headers = { ["E2b-Sandbox-Id"] = "inosuch",
        ["E2b-Sandbox-Port"] = "99999999999999999999999" } }
      assert.are_not.equal(0, res.status)
      assert.is_true(wbd.alive(srv.pid))
    end)
  end)

  describe("connections", function()
    it("keep /health answering through 1,100 unfinished requests from one address", function()
      local r = slow_conns(srv.port, 1100)
      assert.are.equal(1100, r.opened)
      assert.is_true(r.held <= 128, cjson.encode(r))
      assert.are.equal(200, r.health_status)
      assert.is_true(r.health_ms < 1000, r.health_ms .. " ms")
    end)

    it("closes a connection whose request head stalls (--conn-timeout)", function()
      local s = wbd.start{ args = { "--conn-timeout", "6" } }
      local ok, r = pcall(slow_conns, s.port, 5, 15)
      s:stop()
      assert(ok, r)
      assert.are.equal(5, r.held)
      assert.is_number(r.closed_after_s)
    end)

    it("closes a connection that trickles its request head but never ends it (--conn-timeout)", function()
      local s = wbd.start{ args = { "--conn-timeout", "6" } }
      local ok, r = pcall(slow_conns, s.port, 3, 15, 0.3)
      s:stop()
      assert(ok, r)
      assert.are.equal(3, r.held)
      assert.is_number(r.closed_after_s)
    end)

    it("answer /health from the same address while 200 slow requests fill its slots", function()
      -- Every local client is 127.0.0.1: a new connection makes room by closing
      -- the oldest one that waits (not one being served), so one slow client
      -- cannot lock out the others.
      local r = slow_conns(srv.port, 200, 0, 0, "body", "127.0.0.1")
      assert.are.equal(200, r.opened)
      assert.is_true(r.held <= 128, cjson.encode(r))
      assert.are.equal(200, r.health_status, cjson.encode(r))
      assert.is_true((srv:stats().counters.evicted_waiting_conn or 0) >= 1)
    end)

    it("closes a connection that trickles its request body past --body-timeout", function()
      local s = wbd.start{ args = { "--body-timeout", "4" } }
      local ok, r = pcall(slow_conns, s.port, 3, 20, 0.3, "body")
      local st = ok and s:stats()
      s:stop()
      assert(ok, r)
      assert.are.equal(3, r.held)
      assert.is_number(r.closed_after_s, cjson.encode(r))
      assert.are.equal(3, st.counters.slow_request_body)
    end)

    it("keep a streamed answer going past --body-timeout: a request being served has no deadline", function()
      local s = wbd.start{ args = { "--body-timeout", "1" } }
      local ok, err = pcall(function()
        local sb = http.create_interp(s)
        local res = http.sandbox(s, sb, 49999, "POST", "/execute",
          { json = { code = "import time; time.sleep(3); print('done')" }, timeout = 60 })
        assert.are.equal(200, res.status, res.body)
        assert.matches('"text": *"done', res.body)
        assert.is_nil(s:stats().counters.slow_request_body)
      end)
      s:stop()
      assert(ok, err)
    end)

    it("hold 1,000 idle connections on a few threads, and /health from the same address answers", function()
      -- half wait for their request head, half for their body: neither costs a thread
      local s = wbd.start{ args = { "--max-conns-per-ip", "1100", "--max-conns", "1100" } }
      local ok, r = pcall(function()
        local heads = slow_conns(s.port, 500, 0, 0, "head", "127.0.0.1", s.pid)
        local bodies = slow_conns(s.port, 1000, 0, 0, "body", "127.0.0.1", s.pid)
        return { heads, bodies }
      end)
      s:stop()
      assert(ok, r)
      for _, x in ipairs(r) do
        assert.are.equal(x.opened, x.held, cjson.encode(x))
        assert.are.equal(200, x.health_status, cjson.encode(x))
        -- one thread per connection made that at least 500 and 1,000
        assert.is_true(x.server_threads < 64, cjson.encode(x))
      end
    end)

    it("caps connections from one address (--max-conns-per-ip) and in all (--max-conns)", function()
      local s = wbd.start{ args = { "--max-conns-per-ip", "10", "--max-conns", "20" } }
      local ok, r = pcall(slow_conns, s.port, 30)
      s:stop()
      assert(ok, r)
      assert.are.equal(10, r.held)
      assert.are.equal(200, r.health_status)
    end)
  end)
end)
