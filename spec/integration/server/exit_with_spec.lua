-- An embedded warmboxd (warmbox.new without a key) ends with its host
-- process, even when the host is killed with SIGKILL and never gets to stop
-- it; and warmboxd's --exit-with refuses a process that does not exist.
local wbd = require "spec.helpers.warmboxd"

local q = wbd.sh_quote

local function alive(pid) return os.execute("kill -0 " .. pid .. " 2>/dev/null") == true end

describe("warmboxd --exit-with", function()
  it("ends the embedded server, and its sandboxes, when the host is SIGKILLed", function()
    local build = require("warmbox.core").module_path():match("^(.*)/warmbox/[^/]*$")
    local out = os.tmpname()
    -- The host: an embedded warmbox that ran a cell (a kernel is up), then waits.
    local script = table.concat({
      'package.path = "lua/?.lua;lua/?/init.lua;" .. package.path',
      'package.cpath = ' .. string.format("%q", build .. "/?.so;" .. build .. "/?/?.so;") .. ' .. package.cpath',
      'local wb = assert(require("warmbox").new{ server = "private", warmboxd = ' .. string.format("%q", wbd.bin())
        .. ', lock = "memory" })',
      'local r = assert(wb:session("exit-with:1"):run("1 + 1"))',
      'local f = assert(io.open(' .. string.format("%q", out) .. ', "w"))',
      -- its runtime's name (what its jails' command lines carry: never the sandbox id)
      'local res = assert(require("warmbox.core").http{ timeout = 10 }:request{ method = "GET",',
      '  url = wb.server.url .. "/_warmboxd/runtime?id=" .. r.sandbox_id,',
      '  headers = { ["X-Warmboxd-Token"] = wb.server.admin_token } })',
      'local name = assert(require("cjson").decode(res.body).name)',
      'f:write(wb.server.pid, " ", name, "\\n") f:close()',
      'os.execute("sleep 117")',
    }, "\n")
    local p = assert(io.popen("cd " .. q(wbd.root()) .. " && env -u E2B_API_KEY -u E2B_API_URL lua5.4 -e "
      .. q(script) .. " >/dev/null 2>&1 & echo $!"))
    local host = tonumber(p:read("l"))
    p:close()
    local server, sandbox
    assert.is_true(wbd.eventually(function()
      local s = wbd.read_all(out) or ""
      server, sandbox = s:match("^(%d+) (%S+)")
      return server ~= nil
    end, 60), "the host did not start its server")
    assert.is_true(alive(server))
    -- its jails name the sandbox's runtime on their command line
    local function jails()
      local ps = io.popen("ps -eo args=")
      local n = 0
      for line in ps:lines() do
        if line:find(sandbox, 1, true) and line:find("bwrap", 1, true) then n = n + 1 end
      end
      ps:close()
      return n
    end
    assert.is_true(jails() > 0, "no jail for the sandbox")
    os.execute("kill -KILL " .. host)
    assert.is_true(wbd.eventually(function() return not alive(server) end, 15), "warmboxd outlived its host")
    assert.is_true(wbd.eventually(function() return jails() == 0 end, 15), "the sandbox's jails outlived warmboxd")
    os.execute("pkill -KILL -f " .. q("sleep 117") .. " 2>/dev/null")
    os.remove(out)
  end)

  it("refuses a process that does not exist (exit status 2)", function()
    local p = assert(io.popen(q(wbd.bin()) .. " --exit-with 2147483646 2>&1; echo \"status=$?\""))
    local s = p:read("a")
    p:close()
    assert.matches("status=2", s, 1, true)
    assert.matches("--exit-with 2147483646: no such process", s, 1, true)
  end)

  it("is not given to a detached server (the CLI's per-user one outlives its command)", function()
    local server = require "warmbox.server"
    local srv = assert(server.start{ bin = wbd.bin(), detach = true })
    local cmd = wbd.read_all("/proc/" .. srv.pid .. "/cmdline") or ""
    assert.is_nil(cmd:find("--exit-with", 1, true))
    local emb = assert(server.start{ bin = wbd.bin() })
    local cmd2 = wbd.read_all("/proc/" .. emb.pid .. "/cmdline") or ""
    assert.truthy(cmd2:find("--exit-with", 1, true))
    emb:stop()
    server.kill(srv.pid)
    os.execute("rm -rf " .. q(srv.dir))
  end)
end)
