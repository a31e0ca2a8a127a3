-- warmbox.e2b.new on a local warmboxd: a loopback api_url serves the data
-- plane too, so no sandbox_url is needed (as warmbox.new does it).
local e2b = require "warmbox.e2b"

describe("warmbox.e2b.new's sandbox_url", function()
  local KEY = "e2b_" .. string.rep("a", 40)

  it("defaults to a loopback api_url", function()
    for _, url in ipairs({ "http://127.0.0.1:4000", "http://localhost:4000", "http://[::1]:4000" }) do
      local c = e2b.new{ api_key = KEY, api_url = url .. "/" }
      assert.equal(url, c.sandbox_url)
      local sb = c:sandbox({ sandbox_id = "isb1" })
      assert.equal(url, sb.envd_url)
      c:close()
    end
  end)

  it("stays the per-port host for another api_url, and the one given when given", function()
    local c = e2b.new{ api_key = KEY, api_url = "https://api.e2b.app" }
    assert.is_nil(c.sandbox_url)
    c:close()
    c = e2b.new{ api_key = KEY, api_url = "http://127.0.0.1:4000", sandbox_url = "http://127.0.0.1:5000" }
    assert.equal("http://127.0.0.1:5000", c.sandbox_url)
    c:close()
  end)
end)
