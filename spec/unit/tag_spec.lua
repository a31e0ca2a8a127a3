-- The session tag value (injective key encoding plus creation fingerprint),
-- the remembered state's codec and base64: the leaves the session builds on.
local tag_mod = require "warmbox.tag"
local state_codec = require "warmbox.state"
local util = require "warmbox.util"

local fakes = require "spec.helpers.fakes"
local fake_hash = fakes.hash
local O = { hmac = fakes.hmac, sha256 = fake_hash }
local function tv(key, extra)
  local o = {}
  for k, v in pairs(O) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return tag_mod.tag_value(key, o)
end

describe("warmbox.tag_mod.tag_value", function()
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
      assert.equal(k, (tag_mod.parse_tag(v)))
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
    assert.is_nil((tag_mod.parse_tag(v)))
  end)

  it("raises on a key that is not a non-empty string", function()
    assert.has_error(function() tag_mod.tag_value(nil, O) end,
      "bad argument #1 to 'tag_value' (non-empty string expected, got nil)")
    assert.has_error(function() tag_mod.tag_value("", O) end,
      "bad argument #1 to 'tag_value' (non-empty string expected, got empty string)")
  end)
end)

describe("warmbox.tag_mod.tag_matches_key", function()
  it("matches every fingerprint of a key and no other key", function()
    local a = tv("w:t", { actor = "alice" })
    local b = tv("w:t", { actor = "bob" })
    assert.is_true(tag_mod.tag_matches_key(a, "w:t"))
    assert.is_true(tag_mod.tag_matches_key(b, "w:t"))
    assert.is_false(tag_mod.tag_matches_key(a, "w:t1"))
    assert.is_false(tag_mod.tag_matches_key(a, "w"))
    assert.is_false(tag_mod.tag_matches_key("w:t", "w:t"))
  end)
end)

describe("warmbox.state", function()
  it("round-trips and ignores what is not warmbox state", function()
    local st = { sandbox_id = "i1", access_token = "t", lease_end = 10, last_run = 5, tag = "x", hooked = "i1" }
    local back = state_codec.decode(state_codec.encode(st))
    assert.same({ v = 1, sandbox_id = "i1", access_token = "t", lease_end = 10, last_run = 5, tag = "x",
      hooked = "i1" }, back)
    assert.same({}, state_codec.decode(nil))
    assert.same({}, state_codec.decode("garbage"))
    assert.same({}, state_codec.decode('{"v":2}'))
    assert.is_nil(state_codec.encode({}))
  end)
end)

describe("warmbox.util base64", function()
  it("round-trips every length", function()
    for n = 0, 20 do
      local s = ""
      for i = 1, n do s = s .. string.char((i * 37) % 256) end
      assert.equal(s, util.b64_decode(util.b64_encode(s)))
    end
    assert.equal("aGVsbG8=", util.b64_encode("hello"))
  end)
end)

-- The fingerprint's default key is a random secret of the user's, never a public one.
describe("warmbox.tag installation secret", function()
  local build = os.getenv("WARMBOX_BUILD_DIR") or "build"
  local dir

  before_each(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -m 0700 " .. dir))
  end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  -- Runs `code` in a fresh lua5.4 with XDG_STATE_HOME = dir (its output, its status).
  local function child(code, background)
    local cmd = ("XDG_STATE_HOME='%s' LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='%s/?.so;;' lua5.4 -e %q 2>&1")
      :format(dir, build, code)
    if background then return io.popen(cmd) end
    local p = io.popen(cmd)
    local out = p:read("a")
    local ok = p:close()
    return out, ok
  end
  local TV = "io.write(require('warmbox.tag').tag_value('k'))"

  it("makes one random secret per user (0600, in a 0700 directory) that every process uses", function()
    -- four processes at once on a state directory without a secret: they agree
    local ps = {}
    for i = 1, 4 do ps[i] = child(TV, true) end
    local values = {}
    for i, p in ipairs(ps) do
      values[i] = p:read("a")
      assert.is_true(p:close(), values[i])
    end
    for i = 2, 4 do assert.equal(values[1], values[i]) end
    assert.matches("^wb1%.%x+%.k$", values[1])
    local f = assert(io.open(dir .. "/warmbox/secret", "rb"))
    local secret = f:read("a")
    f:close()
    assert.matches("^" .. ("%x"):rep(64) .. "$", secret)
    assert.equal("600", io.popen("stat -c %a " .. dir .. "/warmbox/secret"):read("l"))
    assert.equal("700", io.popen("stat -c %a " .. dir .. "/warmbox"):read("l"))
    -- it is that secret, not the public default; a configured secret still wins
    local tag = require "warmbox.tag"
    assert.equal(tag.tag_value("k", { secret = secret }), values[1])
    assert.are_not.equal(tag.tag_value("k", { secret = "warmbox" }), values[1])
    assert.equal(tag.tag_value("k", { secret = "mine" }),
      child("io.write(require('warmbox.tag').tag_value('k', { secret = 'mine' }))"))
    -- a later process reads the same one
    assert.equal(values[1], child(TV))
  end)

  it("refuses a state directory others may write to, with a clear error", function()
    assert(os.execute("mkdir -m 0777 " .. dir .. "/warmbox && chmod 0777 " .. dir .. "/warmbox"))
    local out, ok = child(TV)
    assert.is_falsy(ok)
    assert.matches("session secret", out)
    assert.matches("writable by others", out)
    -- nowhere to keep it: an error that says so, nothing made
    local p = io.popen(("env -u HOME -u XDG_STATE_HOME LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='%s/?.so;;' "
      .. "lua5.4 -e %q 2>&1"):format(build, TV))
    out = p:read("a")
    assert.is_falsy(p:close())
    assert.matches("neither XDG_STATE_HOME nor HOME is set %(or configure `secret`%)", out)
  end)
end)
