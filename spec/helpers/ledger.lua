--- A ledger in a sandbox for the at-most-once specs and benches: cells that
-- append `start MARK` and `end MARK` to /home/user/ledger, so how often a
-- cell ran and whether two overlapped is read back from the file.
--
--   local ledger = require "spec.helpers.ledger"
--   local code_b, mark_b = ledger.cell("bash")
--   local code_a, mark_a = ledger.cell("python", mark_b)  -- waits for B to start
--   ledger.read(srv, sandbox_id)                          -- { "start c1", ... }
local M = {}

local seq = 0

--- A cell of `lang` ("bash", else python) that writes its start to the
-- ledger, then (with `until_mark`) waits until cell `until_mark` started or
-- `wait_s` seconds (4) went by, then writes its end. → code, mark
function M.cell(lang, until_mark, wait_s)
  seq = seq + 1
  local mark, wait = "c" .. seq, tostring(wait_s or 4)
  if lang == "bash" then
    return "echo start " .. mark .. " >> /home/user/ledger\n"
      .. (until_mark and ("end=$((SECONDS + " .. wait .. ")); while [ $SECONDS -lt $end ]; do grep -q '^start "
        .. until_mark .. "$' /home/user/ledger && break; sleep 0.02; done\n") or "")
      .. "echo end " .. mark .. " >> /home/user/ledger\n", mark
  end
  return "import time\nopen('/home/user/ledger', 'a').write('start " .. mark .. "\\n')\n"
    .. (until_mark and ("end = time.monotonic() + " .. wait .. "\nwhile time.monotonic() < end:\n  if 'start "
      .. until_mark .. "\\n' in open('/home/user/ledger').read(): break\n  time.sleep(0.02)\n") or "")
    .. "open('/home/user/ledger', 'a').write('end " .. mark .. "\\n')\n", mark
end

--- The ledger's lines in sandbox `id` of warmboxd `srv` ({} when none).
function M.read(srv, id)
  local t = {}
  local f = io.open(srv:sandbox_home(id) .. "/ledger", "rb")
  if f then
    for line in f:lines() do t[#t + 1] = line end
    f:close()
  end
  return t
end

return M
