-- The session tag value: injective key encoding plus creation fingerprint.
local session = require "warmbox.session"

local fakes = require "spec.helpers.fakes"
local fake_hash = fakes.hash
local O = { hmac = fakes.hmac, sha256 = fake_hash }
local function tv(key, extra)
  local o = {}
  for k, v in pairs(O) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return session.tag_value(key, o)
end

describe("warmbox.session.tag_value", function()
  it("keeps plain keys readable", function()
    assert.matches("^wb1%.%x+%.workspace%-1:thread%-9$", tv("workspace-1:thread-9"))
  end)

  it("encodes keys that differ by a suffix, & = % + / ~, case or Unicode normalization apart", function()
    local keys = { "w:t", "w:t1", "w:t&x=1", "w:t&x%3D1", "w:t+x", "w:t x", "w:t%2Bx", "w:t/x", "w:t~x",
      "w:t~7Ex", "W:T", "caf\xc3\xa9", "cafe\xcc\x81", "w:t\0", "w:t\n" }
    local seen = {}
    for _, k in ipairs(keys) do
      local v = tv(k)
      assert.is_nil(seen[v], "collision for " .. k)
      seen[v] = k
      assert.matches("^[%w%-_%.:@~]+$", v)
      assert.equal(k, (session.parse_tag(v)))
    end
  end)

  it("puts a fingerprint of template, env and actor in the value, never the secrets", function()
    local base = tv("k", { template = "t", env = { TOKEN = "s3cret" }, actor = "alice" })
    assert.is_nil(base:find("s3cret", 1, true))
    assert.is_nil(base:find("alice", 1, true))
    assert.are_not.equal(base, tv("k", { template = "t", env = { TOKEN = "other" }, actor = "alice" }))
    assert.are_not.equal(base, tv("k", { template = "t", env = { TOKEN = "s3cret" }, actor = "bob" }))
    assert.are_not.equal(base, tv("k", { template = "u", env = { TOKEN = "s3cret" }, actor = "alice" }))
    assert.are_not.equal(base, tv("k", { template = "t", env = { TOKEN = "s3cret", X = "" }, actor = "alice" }))
    assert.equal(base, tv("k", { template = "t", env = { TOKEN = "s3cret" }, actor = "alice" }))
  end)

  it("hashes very long keys so the value stays bounded", function()
    local long = string.rep("x", 1000)
    local v = tv(long)
    assert.is_true(#v < 120)
    assert.are_not.equal(v, tv(long .. "y"))
    assert.is_nil((session.parse_tag(v)))
  end)

  it("raises on a key that is not a non-empty string", function()
    assert.has_error(function() session.tag_value(nil, O) end,
      "bad argument #1 to 'tag_value' (non-empty string expected, got nil)")
    assert.has_error(function() session.tag_value("", O) end,
      "bad argument #1 to 'tag_value' (non-empty string expected, got empty string)")
  end)
end)

describe("warmbox.session.tag_matches_key", function()
  it("matches every fingerprint of a key and no other key", function()
    local a = tv("w:t", { actor = "alice" })
    local b = tv("w:t", { actor = "bob" })
    assert.is_true(session.tag_matches_key(a, "w:t"))
    assert.is_true(session.tag_matches_key(b, "w:t"))
    assert.is_false(session.tag_matches_key(a, "w:t1"))
    assert.is_false(session.tag_matches_key(a, "w"))
    assert.is_false(session.tag_matches_key("w:t", "w:t"))
  end)
end)

describe("warmbox.session state", function()
  it("round-trips and ignores what is not warmbox state", function()
    local st = { sandbox_id = "i1", access_token = "t", lease_end = 10, last_run = 5, tag = "x", hooked = "i1" }
    local back = session.decode_state(session.encode_state(st))
    assert.same({ v = 1, sandbox_id = "i1", access_token = "t", lease_end = 10, last_run = 5, tag = "x",
      hooked = "i1" }, back)
    assert.same({}, session.decode_state(nil))
    assert.same({}, session.decode_state("garbage"))
    assert.same({}, session.decode_state('{"v":2}'))
    assert.is_nil(session.encode_state({}))
  end)
end)

describe("warmbox.session base64", function()
  it("round-trips every length", function()
    for n = 0, 20 do
      local s = ""
      for i = 1, n do s = s .. string.char((i * 37) % 256) end
      assert.equal(s, session.b64_decode(session.b64_encode(s)))
    end
    assert.equal("aGVsbG8=", session.b64_encode("hello"))
  end)
end)
