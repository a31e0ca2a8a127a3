-- envd's gzip on /files over real HTTP: `Content-Encoding: gzip` uploads
-- (octet-stream and multipart) store the inflated bytes, an inflated body over
-- the upload limit is refused (a decompression bomb), a corrupt body is a 400,
-- and `GET /files` answers gzip only when Accept-Encoding asks for it.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local q = wbd.sh_quote

local function shell(cmd, input)
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "wb"))
  f:write(input)
  f:close()
  local p = assert(io.popen(cmd .. " < " .. q(tmp)))
  local out = p:read("a")
  p:close()
  os.remove(tmp)
  return out
end

local function gzip(s) return shell("gzip -c -n", s) end
local function gunzip(s) return shell("gzip -dc", s) end

describe("warmboxd envd gzip /files", function()
  local srv, sb

  local function upload(path, body, headers)
    local h = { ["Content-Type"] = "application/octet-stream", ["Content-Encoding"] = "gzip" }
    for k, v in pairs(headers or {}) do h[k] = v end
    return http.sandbox(srv, sb, 49983, "POST", "/files?path=" .. path, { body = body, headers = h })
  end

  local function download(path, headers)
    return http.sandbox(srv, sb, 49983, "GET", "/files?path=" .. path, { headers = headers })
  end

  lazy_setup(function()
    srv = wbd.start{ args = { "--max-upload-mb", "1" } }
    sb = http.create(srv, { templateID = "base", secure = true, timeout = 600 })
  end)

  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("stores the inflated bytes of a gzip octet-stream upload", function()
    local data = string.rep("warmbox gzip line\n", 2000) .. "\0\1\2end"
    local res = upload("/home/user/gz/a.txt", gzip(data))
    assert.are.equal(200, res.status, res.body)
    assert.are.equal("/home/user/gz/a.txt", res.json[1].path)
    res = download("/home/user/gz/a.txt")
    assert.are.equal(200, res.status)
    assert.is_nil(res.headers["content-encoding"])
    assert.are.equal(data, res.body)
  end)

  it("inflates a gzip multipart upload", function()
    local boundary = "wbgzboundary"
    local body = "--" .. boundary .. "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"m.txt\"\r\n" ..
      "Content-Type: application/octet-stream\r\n\r\nmultipart payload\r\n--" .. boundary .. "--\r\n"
    local res = upload("/home/user/gz/m.txt", gzip(body),
      { ["Content-Type"] = "multipart/form-data; boundary=" .. boundary })
    assert.are.equal(200, res.status, res.body)
    assert.are.equal("multipart payload", download("/home/user/gz/m.txt").body)
  end)

  it("refuses a body that inflates past the upload limit, and a corrupt one", function()
    -- 2 MiB of zeros is a few KiB gzipped: under the 1 MiB body limit, over it inflated
    local bomb = gzip(string.rep("\0", 2 << 20))
    assert.is_true(#bomb < 64 * 1024)
    local res = upload("/home/user/gz/bomb", bomb)
    assert.are.equal(413, res.status, res.body)
    assert.are.equal(404, download("/home/user/gz/bomb").status)
    res = upload("/home/user/gz/bad", "this is not gzip")
    assert.are.equal(400, res.status, res.body)
    local good = gzip("truncated?")
    res = upload("/home/user/gz/bad", good:sub(1, #good - 6))
    assert.are.equal(400, res.status, res.body)
    res = upload("/home/user/gz/bad", "x", { ["Content-Encoding"] = "br" })
    assert.are.equal(400, res.status, res.body)
    assert.is_truthy(res.body:find("br", 1, true))
  end)

  it("serves gzip when Accept-Encoding asks for it", function()
    local data = string.rep("compress me ", 500)
    assert.are.equal(200, upload("/home/user/gz/d.txt", gzip(data)).status)
    local res = download("/home/user/gz/d.txt", { ["Accept-Encoding"] = "br, gzip;q=0.8" })
    assert.are.equal(200, res.status)
    assert.are.equal("gzip", res.headers["content-encoding"])
    assert.is_true(#res.body < #data)
    assert.are.equal(data, gunzip(res.body))
    res = download("/home/user/gz/d.txt", { ["Accept-Encoding"] = "gzip;q=0, identity" })
    assert.is_nil(res.headers["content-encoding"])
    assert.are.equal(data, res.body)
  end)
end)
