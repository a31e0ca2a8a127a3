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

-- A sandbox handle whose envd lists `entries` (and records the depth asked
-- for) and whose command runner answers LIST_CMD with `by_command` (name -> size).
local function lister(entries, files, by_command)
  local sbx = sandbox(files or {})
  function sbx:list_dir(path, depth)
    self.listed = { path = path, depth = depth }
    return entries
  end
  function sbx:run_command(cmd)
    self.command = cmd
    local out = {}
    for _, e in ipairs(by_command) do out[#out + 1] = e[2] .. " " .. e[1] .. "\0" end
    return { exit_code = 0, stdout = util.b64_encode(table.concat(out)) }
  end
  return sbx
end

local function file_entry(rel, size, t)
  return { name = rel:match("[^/]*$"), path = outputs.OUTPUT_DIR .. "/" .. rel, size = size, type = t or "file" }
end

local function names(files)
  local out = {}
  for i, f in ipairs(files) do out[i] = f.name end
  return out
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

  it("sends python/output_hook.py as the build compiled it into warmbox.core, with one call appended", function()
    local f = assert(io.open("python/output_hook.py", "rb"))
    local src = f:read("a")
    f:close()
    assert.equal(src, require("warmbox.core").embedded("output_hook.py"))
    assert.is_nil(require("warmbox.core").embedded("nothing.py"))
    local b64 = outputs.PRELUDE:match("^exec%(__import__%('base64'%)%.b64decode%('([%w+/=]+)'%)%.decode%(%), {}%)$")
    local sent = util.b64_decode(assert(b64))
    assert.equal(src, sent:sub(1, #src))
    assert.equal(string.format("install('%s', '%s', %d, '%s', %d, %d, '%s', %d, %d)\n", outputs.CELLS_DIR,
      outputs.FENCE_FILE, outputs.CELLS_KEPT, outputs.OUTPUT_DIR, outputs.INLINE_LIMIT, outputs.INLINE_TOTAL,
      outputs.OUTPUTS_MIME, outputs.FILES_MAX, outputs.FILES_DEPTH), sent:sub(#src + 1))
    assert.has_error(function() outputs.prelude_for("/home/user/it's") end)
  end)

  it("lists FILES_DEPTH levels over envd and takes the regular files in walk order, named below the directory",
    function()
    local sbx = lister({
      file_entry("b.txt", 1), { name = "a", path = outputs.OUTPUT_DIR .. "/a", type = "dir" },
      file_entry("a.txt", 1), file_entry("a/x/y.txt", 1), file_entry("a/z", 1), file_entry("link", 0, "symlink"),
      file_entry("fifo", 0, "FILE_TYPE_UNSPECIFIED"), file_entry("a-b", 1),
    }, { ["b.txt"] = "b", ["a.txt"] = "a", ["a/x/y.txt"] = "y", ["a/z"] = "z", ["a-b"] = "-" })
    local files = assert(outputs.collect_envd(sbx, { left = 100, dropped = {} }))
    assert.same({ path = outputs.OUTPUT_DIR, depth = outputs.FILES_DEPTH }, sbx.listed)
    assert.same({ "a/x/y.txt", "a/z", "a-b", "a.txt", "b.txt" }, names(files))
    assert.equal("y", files[1].content)
    assert.equal("text/plain", files[1].mime)
    assert.is_nil(sbx.command)
  end)

  it("lists again by a command when the listing lost a name of a file or of a directory above it", function()
    for _, lost in ipairs({ "caf\xEF\xBF\xBD/n.txt", "n\xEF\xBF\xBD.txt" }) do
      local sbx = lister({ file_entry("ok.txt", 1), file_entry(lost, 1) },
        { ["ok.txt"] = "o", ["caf\xe9/n.txt"] = "n" }, { { "ok.txt", 1 }, { "caf\xe9/n.txt", 1 } })
      local files = assert(outputs.collect_envd(sbx, { left = 100, dropped = {} }))
      assert.equal(outputs.LIST_CMD, sbx.command)
      assert.same({ "caf\xe9/n.txt", "ok.txt" }, names(files))
    end
    assert.matches("-maxdepth " .. outputs.FILES_DEPTH .. " -type f -printf '%s %P\\0'", outputs.LIST_CMD, 1, true)
  end)

  it("takes at most FILES_MAX files of a report or a listing: the next is dropped, the walk stops there", function()
    local n = outputs.FILES_MAX + 3
    local report, listing, files = {}, {}, {}
    for i = 1, n do
      local name = ("f%05d"):format(i)
      report[i], listing[i], files[name] = entry(name, 1, "eA=="), file_entry(name, 1), "x"
    end
    for _, got in ipairs({
      { outputs.files_from_report(sandbox(files), { files = report }, { left = 1e9, dropped = {} }) },
      { outputs.collect_envd(lister(listing, files), { left = 1e9, dropped = {} }) },
    }) do
      assert.equal(outputs.FILES_MAX, #got[1])
    end
    local cap = { left = 1e9, dropped = {} }
    outputs.collect_envd(lister(listing, files), cap)
    assert.same({ { name = ("f%05d"):format(outputs.FILES_MAX + 1), size = 1 } }, cap.dropped)
    cap = { left = 1e9, dropped = {} }
    outputs.files_from_report(sandbox(files), { files = report }, cap)
    assert.same({ { name = ("f%05d"):format(outputs.FILES_MAX + 1), size = 1 } }, cap.dropped)
  end)
end)
