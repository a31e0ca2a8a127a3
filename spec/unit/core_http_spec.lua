-- warmbox.core without a server: the module, digests, time, the Http
-- object's lifecycle and option checking, the stream splitter.
local core = require "warmbox.core"

describe("warmbox.core", function()
  it("carries _VERSION", function()
    assert.equals(require("spec.helpers.fakes").VERSION, core._VERSION)
  end)

  it("module_path() is the absolute path of core.so", function()
    local p = core.module_path()
    assert.truthy(p:match("^/.*/warmbox/core%.so$"))
    local f = io.open(p, "rb")
    assert.truthy(f)
    f:close()
  end)

  describe("digests", function()
    it("sha256 gives lower-case hex", function()
      assert.equals("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", core.sha256(""))
      assert.equals("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", core.sha256("abc"))
    end)

    it("sha256 is binary safe", function()
      assert.are_not.equal(core.sha256("a\0b"), core.sha256("a"))
    end)

    it("hmac_sha256 matches RFC 4231 test case 2", function()
      assert.equals("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
        core.hmac_sha256("Jefe", "what do ya want for nothing?"))
    end)

    it("raise on wrong argument types", function()
      assert.has_error(function() core.sha256() end, "bad argument #1 to 'sha256' (string expected, got no value)")
      assert.has_error(function() core.hmac_sha256("k") end,
        "bad argument #2 to 'hmac_sha256' (string expected, got no value)")
    end)
  end)

  describe("time", function()
    it("now() is monotonic and sleep() sleeps", function()
      local a = core.now()
      core.sleep(0.01)
      local b = core.now()
      assert.is_true(b >= a)
      assert.equals("float", math.type(a))
    end)

    it("sleep ignores zero and negative values", function()
      core.sleep(0)
      core.sleep(-1)
    end)
  end)
end)

describe("warmbox.Http", function()
  it("is created open and closes idempotently", function()
    local h = core.http{}
    assert.truthy(tostring(h):match("^warmbox%.Http: 0x%x+$") or tostring(h):match("^warmbox%.Http: %x+$"))
    h:close()
    h:close()
    assert.equals("warmbox.Http (closed)", tostring(h))
  end)

  it("refuses methods after close", function()
    local h = core.http()
    h:close()
    assert.has_error(function() h:request{ url = "http://127.0.0.1:1/" } end,
      "attempt to use a closed warmbox.Http")
    assert.has_error(function() h:batch({}) end, "attempt to use a closed warmbox.Http")
  end)

  it("closes on scope exit (__close)", function()
    local outer
    do
      local h <close> = core.http{}
      outer = h
    end
    assert.equals("warmbox.Http (closed)", tostring(outer))
  end)

  it("is collected without leaks", function()
    for _ = 1, 50 do core.http{} end
    collectgarbage()
    collectgarbage()
  end)

  it("checks the self argument", function()
    local h = core.http{}
    assert.has_error(function() h.request(nil, {}) end,
      "bad argument #1 to 'request' (warmbox.Http expected, got nil)")
  end)

  it("rejects unknown options and wrong types", function()
    assert.has_error(function() core.http{ bogus = 1 } end, "bad argument #1 to 'http' (unknown option 'bogus')")
    assert.has_error(function() core.http{ timeout = "x" } end,
      "bad argument #1 to 'http' (option 'timeout': number expected, got string)")
    assert.has_error(function() core.http{ proxy = 1 } end,
      "bad argument #1 to 'http' (option 'proxy': string or false expected)")
    local h = core.http{}
    assert.has_error(function() h:request{} end, "bad argument #1 to 'request' (option 'url' is required)")
    assert.has_error(function() h:request{ url = "http://x/", nope = true } end,
      "bad argument #1 to 'request' (unknown option 'nope')")
    assert.has_error(function() h:request{ url = "http://x/", stream = "lines" } end,
      "a streamed request needs an 'on_chunk' function")
    assert.has_error(function() h:request{ url = "http://x/", stream = "bytes", on_chunk = print } end,
      "bad argument #1 to 'request' (option 'stream': \"lines\" or \"connect\" expected)")
    assert.has_error(function() h:request{ url = "http://x/", on_chunk = print } end,
      "bad argument #1 to 'request' (option 'on_chunk' needs 'stream')")
    assert.has_error(function() h:request{ url = "http://x/", retry = { tries = 2 } } end,
      "bad argument #1 to 'request' (unknown option 'retry.tries')")
    assert.has_error(function() h:request{ url = "http://x/", retry = { statuses = 503 } } end,
      "bad argument #1 to 'request' (option 'retry.statuses': a list of status codes expected)")
    assert.has_error(function() h:request{ url = "http://x/", headers = { ["X-A"] = "a\r\nb" } } end,
      "invalid header value")
    assert.has_error(function() h:request{ url = "http://x/", headers = { ["X:A"] = "a" } } end,
      "invalid header name")
    assert.has_error(function() h:batch({ { url = "http://x/", stream = "lines", on_chunk = print } }) end,
      "streaming is not supported in a batch")
    assert.has_error(function() h:batch({}, { conc = 1 }) end, "bad argument #2 to 'batch' (unknown option 'conc')")
    h:close()
  end)

  it("returns nil, message, TRANSPORT for a refused connection, without the key", function()
    local h = core.http{ connect_timeout = 2 }
    local key = "e2b_0123456789abcdef0123456789abcdef01234567"
    local res, msg, code = h:request{ url = "http://127.0.0.1:1/sandboxes", headers = { ["X-API-Key"] = key },
      retry = { attempts = 2, base = 0.001, cap = 0.001 } }
    assert.is_nil(res)
    assert.equals("TRANSPORT", code)
    assert.truthy(msg:find("127.0.0.1:1/sandboxes", 1, true))
    assert.truthy(msg:find("attempt 2", 1, true))
    assert.falsy(msg:find(key, 1, true))
    assert.equals(msg:lower():gsub("get http", ""), msg:gsub("GET http", ""))
    h:close()
  end)

  it("never retries a non-idempotent request more than allowed", function()
    local h = core.http{}
    local _, msg = h:request{ method = "POST", url = "http://127.0.0.1:1/x", body = "{}",
      retry = { attempts = 1 } }
    assert.truthy(msg:find("attempt 1", 1, true))
    h:close()
  end)

  it("batch of zero requests is an empty table", function()
    local h = core.http{}
    assert.same({}, h:batch({}))
    h:close()
  end)

  it("batch keeps per-request results in order", function()
    local h = core.http{}
    local out = h:batch({ { url = "http://127.0.0.1:1/a", retry = false },
      { url = "http://127.0.0.1:1/b", retry = false } }, { concurrency = 1 })
    assert.equals(2, #out)
    for i, r in ipairs(out) do
      assert.is_nil(r[1])
      assert.equals("TRANSPORT", r[3])
      assert.truthy(r[2]:find(i == 1 and "/a" or "/b", 1, true))
    end
    h:close()
  end)
end)

describe("core._split (the stream frame splitter)", function()
  local function env(flags, payload)
    local n = #payload
    return string.char(flags, (n >> 24) & 255, (n >> 16) & 255, (n >> 8) & 255, n & 255) .. payload
  end

  local function chunks_at(s, cuts)
    local out, last = {}, 0
    for _, c in ipairs(cuts) do
      out[#out + 1] = s:sub(last + 1, c)
      last = c
    end
    out[#out + 1] = s:sub(last + 1)
    return out
  end

  local stream = env(0, '{"event":{"start":{"pid":1}}}') .. env(0, "") .. env(0, string.rep("x", 300))
    .. env(2, "{}")
  local want = { { '{"event":{"start":{"pid":1}}}', 0 }, { "", 0 }, { string.rep("x", 300), 0 }, { "{}", 2 } }

  it("splits connect envelopes in one chunk", function()
    local frames, status = core._split("connect", { stream })
    assert.equals("ok", status)
    assert.same(want, frames)
  end)

  it("handles a split at every byte (including inside the 5-byte prefix)", function()
    for cut = 1, #stream - 1 do
      local frames, status = core._split("connect", chunks_at(stream, { cut }))
      assert.equals("ok", status)
      assert.same(want, frames)
    end
  end)

  it("handles one byte per read", function()
    local bytes = {}
    for i = 1, #stream do bytes[i] = stream:sub(i, i) end
    local frames, status = core._split("connect", bytes)
    assert.equals("ok", status)
    assert.same(want, frames)
  end)

  it("handles every pair of cuts in a short stream", function()
    local s = env(0, "ab") .. env(1, "c") .. env(2, "{}")
    for a = 1, #s - 2 do
      for b = a + 1, #s - 1 do
        local frames = core._split("connect", chunks_at(s, { a, b }))
        assert.same({ { "ab", 0 }, { "c", 1 }, { "{}", 2 } }, frames)
      end
    end
  end)

  it("reports a body that ends inside an envelope", function()
    local frames, status = core._split("connect", { env(0, "abc"):sub(1, 6) })
    assert.equals("truncated", status)
    assert.same({}, frames)
    local _, status2 = core._split("connect", { "\0\0" })
    assert.equals("truncated", status2)
  end)

  it("refuses an envelope over the limit", function()
    local _, status = core._split("connect", { env(0, string.rep("y", 100)) }, 10)
    assert.equals("too_big", status)
  end)

  it("splits NDJSON lines across reads, CRLF, blank lines and a last unterminated line", function()
    local s = '{"a":1}\n{"b":2}\r\n\n{"c":3}'
    for cut = 1, #s - 1 do
      local frames, status = core._split("lines", chunks_at(s, { cut }))
      assert.equals("ok", status)
      assert.same({ { '{"a":1}', 0 }, { '{"b":2}', 0 }, { '{"c":3}', 0 } }, frames)
    end
  end)

  it("keeps long lines whole", function()
    local long = string.rep("z", 100000)
    local frames = core._split("lines", { long:sub(1, 7), long:sub(8, 50000), long:sub(50001) .. "\n" })
    assert.equals(1, #frames)
    assert.equals(long, frames[1][1])
  end)
end)
