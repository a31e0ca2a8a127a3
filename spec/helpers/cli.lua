--- Running bin/warmbox as a user would, with the spec's build (the build dir
-- of the loaded warmbox.core, and warmboxd from spec.helpers.warmboxd).
local wbd = require "spec.helpers.warmboxd"

local M = {}

local q = wbd.sh_quote

local function slurp(p)
  local s = wbd.read_all(p) or ""
  os.remove(p)
  return s
end

--- Runs `bin/warmbox ARGS` (a shell-quoted string) from the checkout's root.
-- `o.stdin` (a file; default /dev/null), `o.env` (a string of `K=V` words put
-- before the command), `o.xdg` (XDG_RUNTIME_DIR; the per-user server's state),
-- `o.clean` (drop E2B_API_KEY, E2B_API_URL and NO_COLOR from the environment),
-- `o.pty` (under script(1): stdout and stderr are one terminal, returned as stdout).
-- @return exit status, stdout, stderr
function M.run(args, o)
  o = o or {}
  local tmp = os.tmpname()
  local build = require("warmbox.core").module_path():match("^(.*)/warmbox/[^/]*$")
  local inner = table.concat({
    o.clean and "env -u E2B_API_KEY -u E2B_API_URL -u NO_COLOR" or "env",
    o.xdg and ("XDG_RUNTIME_DIR=" .. q(o.xdg)) or "",
    "WARMBOX_BUILD_DIR=" .. q(build), "WARMBOXD_BIN=" .. q(wbd.bin()), o.env or "",
    "/usr/bin/lua5.4 bin/warmbox", args }, " ")
  local cmd
  if o.pty then
    cmd = string.format("cd %s && script -qefc %s /dev/null </dev/null >%s.out 2>%s.err", q(wbd.root()), q(inner),
      tmp, tmp)
  else
    cmd = string.format("cd %s && %s <%s >%s.out 2>%s.err", q(wbd.root()), inner, q(o.stdin or "/dev/null"), tmp, tmp)
  end
  local ok, _, code = os.execute(cmd)
  local out, err = slurp(tmp .. ".out"), slurp(tmp .. ".err")
  os.remove(tmp)
  return ok and 0 or code, out, err
end

return M
