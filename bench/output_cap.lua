-- The caller's memory when a run produces far more output than it keeps:
-- each case runs in a fresh Lua process (peak RSS only grows) against one
-- warmboxd, with the default caps (max_output 16 MiB, max_files_bytes 64 MiB).
--
--   lua5.4 bench/output_cap.lua            (after scripts/setup)
--
-- Prints per case: what the run returned (ok, truncated, bytes kept) and the
-- caller's peak RSS (VmHWM) before and after the run.
dofile(((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/env.lua")

local CASES = {
  { "300 MB of stdout in 64 KB lines",
    "import sys\nfor i in range(4800):\n    sys.stdout.write('x' * 65535 + '\\n')\n" },
  { "one 100 MB stdout line", "import sys\nsys.stdout.write('y' * 100000000)\nsys.stdout.flush()\n" },
  { "5 output files of 30 MB", "for i in range(5):\n    open('/home/user/output/f%d.bin' % i, 'wb')"
    .. ".write(b'z' * 30000000)\n" },
}

local function hwm_mib()
  local f = io.open("/proc/self/status")
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmHWM:%s*(%d+)")) / 1024
end

if arg[1] == "--case" then
  local warmbox = require "warmbox"
  local c = CASES[tonumber(arg[2])]
  local wb = assert(warmbox.new{ api_url = arg[3], sandbox_url = arg[3], api_key = arg[4],
    lock = { backend = "file", dir = arg[5] }, exec_timeout = 300 })
  local s = wb:session("bench-output-cap:" .. arg[2])
  assert(s:run("1"))
  collectgarbage()
  local before = hwm_mib()
  local t0 = os.time()
  local r, err = s:run(c[2])
  local secs = os.time() - t0
  local files = 0
  for _, f in ipairs(r and r.files or {}) do files = files + #f.content end
  print(("%-32s | %-4s | %-9s | %9.1f | %9.1f | %11.1f | %10.1f | %d"):format(c[1], r and "ok" or tostring(err),
    tostring(r and r.truncated), r and #r.stdout / 1048576 or 0, files / 1048576, before, hwm_mib(), secs))
  wb:close()
  os.exit(0)
end

local wbd = require "spec.helpers.warmboxd"
local srv = wbd.start{}
local lockdir = os.tmpname()
os.remove(lockdir)
print(("%-32s | %-4s | %-9s | %9s | %9s | %11s | %10s | %s"):format("case", "run", "truncated", "stdout MiB",
  "files MiB", "RSS before", "RSS peak", "s"))
for i = 1, #CASES do
  local cmd = ("%s %s --case %d %s %s %s"):format("lua5.4", wbd.sh_quote(arg[0]), i, wbd.sh_quote(srv.url),
    wbd.sh_quote(srv.api_key), wbd.sh_quote(lockdir))
  local p = io.popen(cmd)
  io.write(p:read("a"))
  p:close()
end
srv:stop()
os.execute("rm -rf " .. wbd.sh_quote(lockdir))
