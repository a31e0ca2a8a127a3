-- warmbox.json's lossless decoding of stream lines: lone surrogate escapes
-- (what Python writes for surrogate-escaped bytes) and invalid UTF-8.
local json = require "warmbox.json"

describe("warmbox.json lossless decoding", function()
  it("replaces lone surrogate escapes by U+FFFD and keeps valid pairs and escaped backslashes", function()
    local fixed, n = json.repair_surrogates([["a\udcff b \\udcff \ud83d\ude00 \ud83d x \\\udc80 \uDBFF"]])
    assert.equal([["a\uFFFD b \\udcff \ud83d\ude00 \uFFFD x \\\uFFFD \uFFFD"]], fixed)
    assert.equal(4, n)
    assert.equal("plain", (json.repair_surrogates("plain")))
  end)

  it("decodes a line lua-cjson refuses, and says how many characters it replaced", function()
    assert.is_nil(json.decode([[{"value": "bad \udcff value"}]]))
    local v, n = json.decode_lossless([[{"value": "bad \udcff value", "ok": "\u00e9"}]])
    assert.equal("bad \xEF\xBF\xBD value", v.value)
    assert.equal("\xC3\xA9", v.ok)
    assert.equal(1, n)
    local bad, err = json.decode_lossless("not json \\udcff")
    assert.is_nil(bad)
    assert.is_string(err)
  end)

  it("replaces bytes that are not UTF-8 and leaves valid text alone", function()
    assert.equal("ok\xEF\xBF\xBDx", json.utf8_clean("ok\255x"))
    assert.equal("caf\xC3\xA9 \xF0\x9F\x98\x80", json.utf8_clean("caf\xC3\xA9 \xF0\x9F\x98\x80"))
    assert.equal("a\xEF\xBF\xBD", json.utf8_clean("a\xC3")) -- cut sequence at the end
    assert.equal("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDy", json.utf8_clean("\xED\xA0\x80y")) -- encoded surrogate
  end)
end)
