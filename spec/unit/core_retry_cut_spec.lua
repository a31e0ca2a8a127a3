-- warmbox.core: a line longer than the frame limit is delivered cut (flag 1)
-- and the rest of it dropped, so a huge output line never fails a stream.
local core = require "warmbox.core"

describe("core._split lines over the limit", function()
  it("delivers the first max bytes flagged 1 and drops the rest of the line", function()
    local long = string.rep("z", 100)
    for cut = 1, 120 do
      local s = '{"a":1}\n' .. long .. "\n" .. '{"b":2}\n'
      local frames, status = core._split("lines", { s:sub(1, cut), s:sub(cut + 1) }, 10)
      assert.equals("ok", status)
      assert.same({ { '{"a":1}', 0 }, { string.rep("z", 10), 1 }, { '{"b":2}', 0 } }, frames)
    end
  end)

  it("drops a cut line that never ends", function()
    local frames, status = core._split("lines", { "abc\n", string.rep("q", 50), string.rep("q", 50) }, 10)
    assert.equals("ok", status)
    assert.same({ { "abc", 0 }, { string.rep("q", 10), 1 } }, frames)
  end)
end)
