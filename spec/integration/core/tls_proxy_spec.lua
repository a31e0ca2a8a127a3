-- warmbox.core over HTTPS (certificates verified against the system CA store,
-- or a given ca_file) and through a proxy, against local Node peers.
local wbd = require "spec.helpers.warmboxd"
local core = require "warmbox.core"

local q = wbd.sh_quote
local have_tools = os.execute("command -v node >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1") == true

-- Starts the peer with its stdin on a pipe we hold: closing it stops the peer.
local function peer(dir, ...)
  local out = dir .. "/peer" .. select("#", ...) .. ".out"
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = q(a) end
  local pipe = assert(io.popen(string.format("env -u LD_PRELOAD node %s %s >%s 2>&1",
    q(wbd.root() .. "/spec/helpers/tls_proxy_server.mjs"), table.concat(args, " "), q(out)), "w"))
  for _ = 1, 200 do
    local f = io.open(out, "r")
    local port = f and f:read("a"):match("listening (%d+)")
    if f then f:close() end
    if port then return pipe, tonumber(port) end
    wbd.sleep(0.05)
  end
  pipe:close()
  error("the node peer did not start")
end

local describe_if = have_tools and describe or pending
describe_if("warmbox.core over HTTPS and through a proxy", function()
  local dir, tls_pipe, tls_port, proxy_pipe, proxy_port

  lazy_setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir)))
    assert(os.execute(string.format("env -u LD_PRELOAD openssl req -x509 -newkey rsa:2048 -nodes -days 1 "
      .. "-subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout %s -out %s >/dev/null 2>&1",
      q(dir .. "/key.pem"), q(dir .. "/cert.pem"))))
    tls_pipe, tls_port = peer(dir, "https", dir .. "/cert.pem", dir .. "/key.pem")
    proxy_pipe, proxy_port = peer(dir, "proxy")
  end)

  lazy_teardown(function()
    if tls_pipe then tls_pipe:close() end
    if proxy_pipe then proxy_pipe:close() end
    os.execute("rm -rf " .. q(dir))
  end)

  it("verifies the server's certificate: a self-signed one is refused as TRANSPORT", function()
    local h <close> = core.http{ proxy = false }
    local res, msg, code = h:request{ url = "https://127.0.0.1:" .. tls_port .. "/" }
    assert.is_nil(res)
    assert.equal("TRANSPORT", code)
    assert.matches("certificate", msg)
  end)

  it("trusts a server whose certificate authority is given as ca_file", function()
    local h <close> = core.http{ proxy = false, ca_file = dir .. "/cert.pem" }
    local res = assert(h:request{ url = "https://127.0.0.1:" .. tls_port .. "/" })
    assert.equal(200, res.status)
    assert.equal("secure", res.body)
  end)

  it("sends requests through the proxy it is given", function()
    local h <close> = core.http{ proxy = "http://127.0.0.1:" .. proxy_port }
    -- Port 1 is closed: only the proxy can answer this.
    local res = assert(h:request{ url = "http://127.0.0.1:1/hello?x=1" })
    assert.equal(200, res.status)
    assert.equal("http://127.0.0.1:1/hello?x=1", require("cjson").decode(res.body).proxied)
  end)

  it("warmbox.new passes ca_file and proxy to its client's connection", function()
    local warmbox = require "warmbox"
    local wb = assert(warmbox.new{ api_key = "k", api_url = "https://127.0.0.1:" .. tls_port, proxy = false,
      ca_file = dir .. "/cert.pem", retries = 0 })
    local res = assert(wb.client.http:request{ url = "https://127.0.0.1:" .. tls_port .. "/" })
    assert.equal("secure", res.body)
    wb:close()
    local wb2 = assert(warmbox.new{ api_key = "k", api_url = "http://127.0.0.1:1",
      proxy = "http://127.0.0.1:" .. proxy_port })
    local res2 = assert(wb2.client.http:request{ url = "http://127.0.0.1:1/hello" })
    assert.equal("http://127.0.0.1:1/hello", require("cjson").decode(res2.body).proxied)
    wb2:close()
  end)

  it("goes direct with proxy = false", function()
    local h <close> = core.http{ proxy = false }
    local res, _, code = h:request{ url = "http://127.0.0.1:1/hello", retry = { attempts = 1 } }
    assert.is_nil(res)
    assert.equal("TRANSPORT", code)
  end)
end)
