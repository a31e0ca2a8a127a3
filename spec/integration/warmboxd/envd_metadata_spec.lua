-- envd's file metadata over real HTTP: `X-Metadata-<key>` headers on POST
-- /files become `user.e2b.<key>` extended attributes of the written file
-- (key lowercased), returned as the upload's and the entry's `metadata`
-- by Stat, ListDir and Move; an overwrite replaces the set; bad keys and
-- values are refused before anything is written; attributes set from inside
-- the sandbox show up too.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local envd = require "spec.helpers.envd"

local RPC = envd.RPC
local urlencode = envd.urlencode

describe("warmboxd envd file metadata", function()
  local srv, sb

  local function upload(path, data, headers, content_type)
    local h = { ["Content-Type"] = content_type or "application/octet-stream" }
    for k, v in pairs(headers or {}) do h[k] = v end
    return http.sandbox(srv, sb, 49983, "POST", "/files?path=" .. urlencode(path), { body = data, headers = h })
  end

  local function rpc(method, body)
    return http.sandbox(srv, sb, 49983, "POST", "/filesystem.Filesystem/" .. method, { json = body, headers = RPC })
  end

  local function stat(path)
    local res = rpc("Stat", { path = path })
    assert.are.equal(200, res.status, res.body)
    return res.json.entry
  end

  -- A user xattr of a sandbox file as the host sees it (nil when absent).
  local function host_xattr(rel, name)
    local path = srv:sandbox_home(sb.sandboxID) .. "/" .. rel
    local p = assert(io.popen("python3 -c " .. wbd.sh_quote(
      "import os,sys\ntry: sys.stdout.write(os.getxattr(sys.argv[1], sys.argv[2]).decode())\n" ..
      "except OSError: sys.stdout.write('<none>')") .. " " .. wbd.sh_quote(path) .. " " .. wbd.sh_quote(name)))
    local out = p:read("a")
    p:close()
    if out == "<none>" then return nil end
    return out
  end

  lazy_setup(function()
    srv = wbd.start{}
    sb = http.create(srv, { templateID = "base", secure = true, timeout = 600 })
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("stores X-Metadata-* headers as user.e2b.* xattrs and returns them", function()
    local res = upload("/home/user/meta/a.txt", "hello",
      { ["X-Metadata-Author"] = "mish", ["x-metadata-PURPOSE"] = "upload test" })
    assert.are.equal(200, res.status, res.body)
    assert.are.same({ author = "mish", purpose = "upload test" }, res.json[1].metadata)
    assert.are.equal("mish", host_xattr("meta/a.txt", "user.e2b.author"))
    assert.are.equal("upload test", host_xattr("meta/a.txt", "user.e2b.purpose"))
    assert.are.same({ author = "mish", purpose = "upload test" }, stat("meta/a.txt").metadata)
    local list = rpc("ListDir", { path = "/home/user/meta", depth = 1 })
    assert.are.equal(200, list.status, list.body)
    assert.are.equal("a.txt", list.json.entries[1].name)
    assert.are.same({ author = "mish", purpose = "upload test" }, list.json.entries[1].metadata)
  end)

  it("gives every file of a multipart upload the same metadata", function()
    local b = "wbmetaboundary"
    local body = ""
    for _, name in ipairs({ "m1.txt", "m2.txt" }) do
      body = body .. "--" .. b .. "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"" ..
        "/home/user/meta/" .. name .. "\"\r\nContent-Type: application/octet-stream\r\n\r\n" .. name .. "\r\n"
    end
    body = body .. "--" .. b .. "--\r\n"
    local res = http.sandbox(srv, sb, 49983, "POST", "/files", { body = body,
      headers = { ["Content-Type"] = "multipart/form-data; boundary=" .. b, ["X-Metadata-Source"] = "suite" } })
    assert.are.equal(200, res.status, res.body)
    assert.are.equal(2, #res.json)
    for i, name in ipairs({ "m1.txt", "m2.txt" }) do
      assert.are.same({ source = "suite" }, res.json[i].metadata)
      assert.are.same({ source = "suite" }, stat("meta/" .. name).metadata)
    end
  end)

  it("has no metadata field on a file uploaded without it", function()
    local res = upload("/home/user/meta/plain.txt", "plain")
    assert.are.equal(200, res.status, res.body)
    assert.is_nil(res.json[1].metadata)
    assert.is_nil(stat("meta/plain.txt").metadata)
    assert.is_nil(stat("meta").metadata)
  end)

  it("replaces the whole set when a file is overwritten", function()
    assert.are.equal(200, upload("/home/user/meta/o.txt", "1",
      { ["X-Metadata-Author"] = "old", ["X-Metadata-Purpose"] = "old" }).status)
    local res = upload("/home/user/meta/o.txt", "2", { ["X-Metadata-Author"] = "new" })
    assert.are.same({ author = "new" }, res.json[1].metadata)
    assert.are.same({ author = "new" }, stat("meta/o.txt").metadata)
    res = upload("/home/user/meta/o.txt", "3")
    assert.is_nil(res.json[1].metadata)
    assert.is_nil(stat("meta/o.txt").metadata)
    assert.is_nil(host_xattr("meta/o.txt", "user.e2b.author"))
  end)

  it("keeps the metadata through a Move", function()
    assert.are.equal(200, upload("/home/user/meta/old.txt", "x", { ["X-Metadata-Stage"] = "renamed" }).status)
    local res = rpc("Move", { source = "meta/old.txt", destination = "meta/new.txt" })
    assert.are.equal(200, res.status, res.body)
    assert.are.same({ stage = "renamed" }, res.json.entry.metadata)
  end)

  it("refuses bad metadata with a 400 before writing anything", function()
    local cases = {
      { ["X-Metadata-Author"] = "caf\xc3\xa9" },                 -- not printable ASCII
      { ["X-Metadata-" .. string.rep("k", 247)] = "v" },         -- key over 246 bytes
      { ["X-Metadata-Big"] = string.rep("v", 4090) },             -- over 4096 bytes in all
    }
    for i, h in ipairs(cases) do
      local res = upload("/home/user/meta/bad" .. i .. ".txt", "x", h)
      assert.are.equal(400, res.status, res.body)
      assert.matches("^invalid metadata: ", res.json.message)
      assert.are.equal(404, rpc("Stat", { path = "meta/bad" .. i .. ".txt" }).status)
    end
    -- the limits themselves pass
    local res = upload("/home/user/meta/edge.txt", "x", { ["X-Metadata-" .. string.rep("k", 246)] = "v" })
    assert.are.equal(200, res.status, res.body)
  end)

  it("checks the access token before the metadata", function()
    local res = http.sandbox(srv, { sandboxID = sb.sandboxID }, 49983, "POST", "/files?path=/home/user/meta/n.txt",
      { body = "x", headers = { ["Content-Type"] = "application/octet-stream", ["X-Metadata-A"] = "caf\xc3\xa9" } })
    assert.are.equal(401, res.status, res.body)
  end)

  it("surfaces user.e2b.* attributes set inside the sandbox, and only those", function()
    assert.are.equal(200, upload("/home/user/meta/inside.txt", "x").status)
    local script = "import os\nos.setxattr('/home/user/meta/inside.txt', 'user.e2b.origin', b'cell')\n" ..
      "os.setxattr('/home/user/meta/inside.txt', 'user.other', b'hidden')\n" ..
      "os.setxattr('/home/user/meta/inside.txt', 'user.e2b.bin', b'\\xff\\xfe')\n"
    local res = http.sandbox(srv, sb, 49983, "POST", "/process.Process/Start", {
      body = (function()
        local json = assert(http.cjson.encode({ process = { cmd = "/usr/bin/python3", args = { "-c", script } } }))
        return string.pack(">I1I4", 0, #json) .. json
      end)(),
      headers = { ["Content-Type"] = "application/connect+json" } })
    assert.are.equal(200, res.status, res.body)
    assert.matches('"exited":true', res.body)
    -- user.other is not E2B's; a value that is not UTF-8 is skipped (as envd)
    assert.are.same({ origin = "cell" }, stat("meta/inside.txt").metadata)
  end)
end)
