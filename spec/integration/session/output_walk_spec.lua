-- One output-file walk for every language, against a real warmboxd: the
-- python hook's report (python/output_hook.py) and the listing over envd
-- (bash) give the same files, subdirectories included, in the same order,
-- under the same caps (count, depth, bytes).
local sessions = require "spec.helpers.sessions"
local outputs = require "warmbox.outputs"

describe("sessions: the output walk, python and bash alike (warmboxd)", function()
  local env = sessions.new()
  local wb

  lazy_setup(function()
    env:start()
    wb = env:warmbox()
  end)
  lazy_teardown(function() env:stop() end)

  -- Runs the bash script `tree` (it writes the output directory) as a python
  -- cell and as a bash cell, each in a session of its own; → r of each.
  local function both(key, tree, opts)
    local py = assert(wb:session(key .. ":py", opts):run(
      "import subprocess\nsubprocess.run(['bash', '-c', " .. string.format("%q", tree):gsub("\\\n", "\\n")
      .. "], check=True)", { timeout = 120 }))
    assert.is_nil(py.error)
    local sh = assert(wb:session(key .. ":sh", opts):run(tree, { language = "bash", timeout = 120 }))
    return py, sh
  end

  local function listing(r)
    local out = {}
    for i, f in ipairs(r.files) do out[i] = { name = f.name, content = f.content } end
    return out
  end

  local O = outputs.OUTPUT_DIR
  -- A file FILES_DEPTH levels below the output directory, and one a level deeper.
  local deep = "deep" .. ("/d"):rep(outputs.FILES_DEPTH - 2)

  it("reports the files of subdirectories, in walk order, links and fifos left out", function()
    local tree = table.concat({
      "cd " .. O,
      "mkdir -p a b/c/e " .. deep .. "/d",
      "printf A > a.txt; printf X > a/x.txt; printf 1,2 > b/c/d.csv",
      "printf in > " .. deep .. "/in.txt; printf out > " .. deep .. "/d/out.txt",
      "ln -s a.txt link; ln -s a linkdir; mkfifo fifo",
    }, "\n")
    local py, sh = both("walk:tree", tree)
    local want = {
      { name = "a/x.txt", content = "X" }, { name = "a.txt", content = "A" },
      { name = "b/c/d.csv", content = "1,2" }, { name = deep .. "/in.txt", content = "in" },
    }
    assert.same(want, listing(py))
    assert.same(want, listing(sh))
    assert.is_nil(py.files_error)
    assert.is_nil(sh.files_error)
    assert.falsy(py.truncated)
    assert.falsy(sh.truncated)
  end)

  it("gives a subdirectory's name bytes as they are (bash: listed again by a command)", function()
    local tree = "mkdir -p $'" .. O .. "/caf\\xe9'; printf n > $'" .. O .. "/caf\\xe9/n.txt'; printf p > "
      .. O .. "/plain.txt"
    local py, sh = both("walk:bytes", tree)
    local want = { { name = "caf\xe9/n.txt", content = "n" }, { name = "plain.txt", content = "p" } }
    assert.same(want, listing(py))
    assert.same(want, listing(sh))
  end)

  it("returns at most FILES_MAX files: the walk stops at the next one, which dropped_files names", function()
    local n = outputs.FILES_MAX + 2
    local tree = "mkdir -p " .. O .. "/many; cd " .. O .. "/many; for i in $(seq 1 " .. n
      .. "); do printf \"$i\" > $(printf 'f%05d' $i); done"
    local py, sh = both("walk:count", tree)
    for _, r in ipairs({ py, sh }) do
      assert.equal(outputs.FILES_MAX, #r.files)
      assert.equal("many/f00001", r.files[1].name)
      assert.equal(("many/f%05d"):format(outputs.FILES_MAX), r.files[#r.files].name)
      assert.is_true(r.truncated)
      assert.same({ { name = ("many/f%05d"):format(outputs.FILES_MAX + 1), size = #tostring(outputs.FILES_MAX + 1) } },
        r.dropped_files)
    end
    assert.same(listing(py), listing(sh))
  end)

  it("takes files in subdirectories within max_files_bytes in walk order", function()
    local tree = "mkdir -p " .. O .. "/a; printf 123456 > " .. O .. "/a/x.txt; printf 123456 > " .. O
      .. "/a.txt; printf 1234 > " .. O .. "/b.txt"
    local py, sh = both("walk:bytes-cap", tree, { max_files_bytes = 10 })
    for _, r in ipairs({ py, sh }) do
      assert.same({ { name = "a/x.txt", content = "123456" }, { name = "b.txt", content = "1234" } }, listing(r))
      assert.same({ { name = "a.txt", size = 6 } }, r.dropped_files)
      assert.is_true(r.truncated)
    end
  end)
end)
