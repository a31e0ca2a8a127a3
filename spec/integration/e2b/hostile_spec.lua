-- warmbox.e2b against a hostile (or broken) API server over real HTTP
-- (spec/helpers/hostile_e2b.py on loopback): a listing whose server names a
-- next page for ever stops at max_pages, and a control-plane answer (or a
-- run's error body) of any size stops at max_body, both with TOO_LARGE.
local e2b = require "warmbox.e2b"
local wbd = require "spec.helpers.warmboxd"
local core = require "warmbox.core"
local json = require "warmbox.json"

local function start()
  local out = os.tmpname()
  -- (not under the sanitizer run's preloaded ASan: python is not instrumented)
  local p = assert(io.popen(("env -u LD_PRELOAD python3 %s >%s 2>&1 </dev/null & echo $!"):format(
    wbd.sh_quote(wbd.root() .. "/spec/helpers/hostile_e2b.py"), out)))
  local pid = assert(tonumber(p:read("l")))
  p:close()
  local port = wbd.eventually(function()
    local f = io.open(out)
    local v = f and tonumber(f:read("l"))
    if f then f:close() end
    return v
  end, 20)
  os.remove(out)
  assert(port, "the hostile server did not start")
  return { url = "http://127.0.0.1:" .. port, pid = pid }
end

describe("warmbox.e2b against a hostile API server", function()
  local srv, raw
  lazy_setup(function()
    srv = start()
    raw = core.http{ timeout = 10 }
  end)
  lazy_teardown(function()
    if raw then raw:close() end
    if srv then os.execute("kill " .. srv.pid .. " 2>/dev/null") end
  end)

  local function pages()
    return json.decode(assert(raw:request{ url = srv.url .. "/_pages", retry = false }).body).pages
  end

  local function client(o)
    o = o or {}
    o.api_key, o.api_url, o.sandbox_url, o.retries = "e2b_0", srv.url, srv.url, 0
    return e2b.new(o)
  end

  it("stops a listing after max_pages pages with TOO_LARGE, whatever the server names next", function()
    local c = client{ max_pages = 7 }
    local before = pages()
    local items, msg, code = c:list_all{}
    assert.is_nil(items)
    assert.are.equal("TOO_LARGE", code)
    assert.matches("list sandboxes: the server named a next page after 7 pages (max_pages)", msg, 1, true)
    assert.are.equal(7, pages() - before)
    -- a listing's own max_pages
    before = pages()
    items, msg, code = c:list_all{ max_pages = 3 }
    assert.is_nil(items)
    assert.are.equal("TOO_LARGE", code, msg)
    assert.are.equal(3, pages() - before)
    -- the pages iterator ends with the error, then stops
    local n, last = 0, nil
    for page, m, cd in c:list_pages{ max_pages = 2 } do
      n = n + 1
      if page == false then last = { m, cd } end
    end
    assert.are.equal(3, n)
    assert.are.equal("TOO_LARGE", last[2])
    -- snapshots too
    before = pages()
    items, msg, code = c:list_snapshots{ max_pages = 4 }
    assert.is_nil(items)
    assert.are.equal("TOO_LARGE", code, msg)
    assert.matches("list snapshots", msg, 1, true)
    assert.are.equal(4, pages() - before)
    c:close()
  end)

  it("follows 10000 pages by default, and refuses a bad max_pages", function()
    assert.are.equal(10000, client().max_pages)
    assert.has_error(function() client{ max_pages = 0 } end)
    assert.has_error(function() client():list_all{ max_pages = 1.5 } end)
  end)

  it("stops a control-plane answer past max_body with TOO_LARGE, while it downloads", function()
    local c = client{ max_body = 1 << 20 }
    local d, msg, code = c:info("iendless")
    assert.is_nil(d)
    assert.are.equal("TOO_LARGE", code, msg)
    -- the default (32 MiB) refuses an announced 40 MiB before reading it
    local c2 = client()
    assert.are.equal(32 << 20, c2.max_body)
    d, msg, code = c2:info("ilength")
    assert.is_nil(d)
    assert.are.equal("TOO_LARGE", code, msg)
    c:close()
    c2:close()
  end)

  it("stops a run's error body past max_body", function()
    local c = client{ max_body = 1 << 20 }
    local sb = c:sandbox({ sandbox_id = "ihostile", envd_access_token = "t" })
    local ex, msg, code = sb:run_code("1 + 1", { timeout = 30 })
    assert.is_nil(ex)
    assert.are.equal("TOO_LARGE", code, msg)
    c:close()
  end)
end)
