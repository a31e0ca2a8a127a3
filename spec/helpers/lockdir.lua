-- A fresh lock directory name for the lock specs (lock_spec, lock_fair_spec,
-- lock_dir_spec): not created (the file lock makes it, 0700), under /tmp.
local M = {}

--- A path that does not exist yet, "<tmpname>-locks".
function M.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  return d .. "-locks"
end

--- Removes a directory under /tmp (anything else is left alone).
function M.rmrf(d)
  if d and d:match("^/tmp/") then os.execute("rm -rf '" .. d .. "'") end
end

return M
