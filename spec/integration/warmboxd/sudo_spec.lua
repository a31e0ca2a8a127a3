-- sudo in a sandbox over real HTTP: E2B's user may sudo without a password;
-- in warmboxd it runs the command as the sandbox's user (no privilege is
-- gained: the host's files stay out of reach, the jail's /usr stays read-only),
-- with sudo's options understood.
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"

local cjson = http.cjson

describe("warmboxd sudo", function()
  local srv, sb

  -- bash through the code interpreter: stdout and the exit status
  local function bash(code)
    local res = http.sandbox(srv, sb, 49999, "POST", "/execute",
      { json = { code = code, language = "bash" }, timeout = 60 })
    assert.are.equal(200, res.status, res.body)
    local out, err = {}, nil
    for line in res.body:gmatch("[^\n]+") do
      local l = cjson.decode(line)
      if l.type == "stdout" then out[#out + 1] = l.text end
      if l.type == "error" then err = l.value end
    end
    return table.concat(out), err
  end

  lazy_setup(function()
    srv = wbd.start{}
    sb = http.api(srv, "POST", "/sandboxes", { templateID = "base", timeout = 600 }).json
  end)
  lazy_teardown(function()
    if srv then srv:stop() end
  end)

  it("runs a command, with sudo's options, as the sandbox's user", function()
    local out, err = bash('FOO=bar; sudo echo "x$FOO"; sudo -u root -E -- sh -c \'echo "$0"\' y;'
      .. " sudo -n true && echo ok")
    assert.is_nil(err)
    assert.are.equal("xbar\ny\nok\n", out)
    assert.are.equal("user\n", (bash("sudo id -un")))
    assert.are.equal("in shell\n", (bash("sudo -s 'echo in shell'")))
    local _, e = bash("sudo false")
    assert.are.equal("exit status 1", e)
  end)

  it("gains no privilege", function()
    local out = bash("sudo touch /usr/local/bin/x 2>/dev/null || echo ro;"
      .. " sudo cat /etc/shadow 2>/dev/null || echo no-shadow;"
      .. " sudo sh -c 'echo > /usr/bin/pwned' 2>/dev/null || echo ro-usr")
    assert.are.equal("ro\nno-shadow\nro-usr\n", out)
    -- the stub is the only thing in /usr/local/bin, and it cannot be changed
    assert.are.equal("sudo\n", (bash("ls /usr/local/bin")))
    assert.are.equal("ro\n", (bash("echo x > /usr/local/bin/sudo 2>/dev/null || echo ro")))
  end)
end)
