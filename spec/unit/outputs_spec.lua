-- warmbox.outputs: what the client takes from an output report (written by
-- code in the sandbox, so trusted for nothing).
local outputs = require "warmbox.outputs"
local util = require "warmbox.util"

-- A sandbox handle whose files are `files` (name -> bytes); it records the
-- max_bytes of every read and, as envd with a limit, returns at most that.
local function sandbox(files)
  local sbx = { reads = {} }
  function sbx:read_file(path, opts)
    local name = path:sub(#outputs.OUTPUT_DIR + 2)
    self.reads[#self.reads + 1] = { name = name, max_bytes = opts and opts.max_bytes }
    local data = files[name]
    if not data then return nil, "not found", "NOT_FOUND" end
    if opts and opts.max_bytes and #data > opts.max_bytes then return nil, "too large", "TOO_LARGE" end
    return data
  end
  return sbx
end

local function entry(name, size, b64)
  return { name = name, size = size, name_b64 = util.b64_encode(name), b64 = b64 }
end

describe("warmbox.outputs", function()
  it("check_output_name keeps relative paths below the output directory and refuses the rest", function()
    for _, ok in ipairs({ "a.txt", "sub/b.csv", "caf\xe9.txt", "..a", "a..", ".hidden" }) do
      assert.equal(ok, outputs.check_output_name(ok))
    end
    for _, bad in ipairs({ "", "..", ".", "../x", "a/../../x", "/etc/passwd", "a//b", "a/", "./a", "a\0b" }) do
      local n, err = outputs.check_output_name(bad)
      assert.is_nil(n, bad)
      assert.matches("output file name", err)
    end
    assert.is_nil(outputs.check_output_name(nil))
  end)

  it("reads a reported file with the run's budget left as its limit, and drops one past it", function()
    local sbx = sandbox({ ["a.bin"] = ("a"):rep(300), ["b.bin"] = ("b"):rep(5000) })
    local cap = { left = 1000, dropped = {} }
    local files = assert(outputs.files_from_report(sbx, { files = { entry("a.bin", 300), entry("b.bin", 10) } }, cap))
    assert.same({ { name = "a.bin", max_bytes = 1000 }, { name = "b.bin", max_bytes = 700 } }, sbx.reads)
    assert.equal(1, #files)
    assert.equal("a.bin", files[1].name)
    assert.equal("b.bin", cap.dropped[1].name)
    assert.is_true(cap.dropped[1].size > 700)
  end)

  it("says PROTOCOL for a climbing name, a short read, a missing size or an entry that is no file", function()
    local cases = {
      { entry("../../../home/victim/.bashrc", 2, "aGk="), "climbs out" },
      { entry("s.txt", 100), "read 5 bytes of the 100 reported" },
      { entry("s.txt", nil, "aGk="), "no valid size" },
      { "s.txt", "not a file" },
    }
    for _, c in ipairs(cases) do
      local files, err, code, partial = outputs.files_from_report(sandbox({ ["s.txt"] = "five!" }),
        { files = { entry("ok.txt", 2, "aGk="), c[1] } }, { left = 1000, dropped = {} })
      assert.is_nil(files)
      assert.equal("PROTOCOL", code)
      assert.matches(c[2], err, 1, true)
      assert.equal(1, #partial)
      assert.equal("ok.txt", partial[1].name)
    end
  end)
end)
