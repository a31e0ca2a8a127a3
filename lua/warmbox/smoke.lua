--- warmbox.smoke: a short, self-cleaning live check of a backend (`warmbox smoke`).
--
-- One fresh session (key `warmbox-smoke:<random>`) goes through:
--   1. cold start         a new sandbox; the run sets x = 41 and leaves a file in /home/user/output
--   2. reuse hit          the same sandbox, x kept (x + 1 == 42), reused = true
--   3. output isolation   /home/user/output starts empty and no file comes back
--   4. idle pause         nobody runs; the lease ends and the sandbox pauses (polls `info`)
--   5. resume with state  the same sandbox resumes (resumed = true) and x is still 42
--   6. gc                 the session is released: its sandboxes are killed and gone
-- Each step prints its time; the first failing step stops the check, and
-- the session's sandboxes are released whatever happened (step 6 runs, or
-- the clean-up after a failure). The backend is whatever the options select
-- (`warmbox.new`): E2B when an API key is given or `E2B_API_KEY` is set,
-- else the user's shared local warmboxd. Short timeouts by default (`exec_timeout` 15 s,
-- `idle_timeout` 5 s: the pause comes about 5 s after the last run, whatever
-- `exec_timeout` is (a running cell keeps its own lease).
--
--   local code = require("warmbox.smoke").run({ api_key = ... }, { stdout = io.stdout })
-- @module warmbox.smoke

local core = require "warmbox.core"

local tostring, pcall, pairs = tostring, pcall, pairs
local fmt = string.format
local now, sleep = core.now, core.sleep

local _M = {}

--- The step names, in order.
_M.STEPS = { "cold start", "reuse hit", "output isolation", "idle pause", "resume with state", "gc" }

local function first_text(r)
  return r.results and r.results[1] and r.results[1].text
end

local function run_failed(r, msg, code)
  if not r then return fmt("run failed: %s (%s)", tostring(msg), tostring(code)) end
  if r.error then return fmt("the cell raised %s: %s", tostring(r.error.name), tostring(r.error.value)) end
  return nil
end

-- What the smoke test talks to, in words.
local function backend_of(wb)
  local srv = wb.server
  if not srv then return "E2B at " .. tostring(wb.client.api_url or "the API") end
  return (srv.shared and "the shared local warmboxd at " or "a private local warmboxd at ") .. srv.url
end

--- Runs the check. `o`: options for `warmbox.new` (api_url, api_key,
-- sandbox_url, template, exec_timeout, idle_timeout, tag, lock, policy,
-- warmboxd; also `client` for tests), `io_`: { stdout = file }.
-- @treturn integer 0 when every step passed, 1 otherwise
function _M.run(o, io_)
  local out = (io_ and io_.stdout) or io.stdout
  local opts = {}
  for k, v in pairs(o or {}) do opts[k] = v end
  opts.exec_timeout = opts.exec_timeout or 15
  opts.idle_timeout = opts.idle_timeout or 5
  opts.lock = opts.lock or "memory"
  local warmbox = require "warmbox"
  local okn, wb, msg, code = pcall(warmbox.new, opts)
  if not okn or not wb then
    out:write(fmt("warmbox smoke: cannot start: %s%s\n", tostring(okn and msg or wb),
      code and (" (" .. code .. ")") or ""))
    return 1
  end
  local key = "warmbox-smoke:" .. core.sha256(fmt("%d:%.9f:%s", core.getpid(), now(), tostring({}))):sub(1, 12)
  out:write(fmt("warmbox smoke: %s, session %s (exec timeout %gs, idle timeout %gs)\n",
    backend_of(wb),
    key, opts.exec_timeout, opts.idle_timeout))
  local s = wb:session(key)
  local sandbox_id
  local failed_step
  local released = false

  local function step(i, fn)
    if failed_step then return end
    local t0 = now()
    local okp, ok, detail = pcall(fn)
    if not okp then ok, detail = false, "error: " .. tostring(ok) end
    out:write(fmt("%d. %-18s %8.0f ms  %s%s\n", i, _M.STEPS[i], (now() - t0) * 1000, ok and "ok" or "FAILED",
      detail and ("  " .. detail) or ""))
    out:flush()
    if not ok then failed_step = _M.STEPS[i] end
  end

  step(1, function()
    local r, m, c = s:run("x = 41\nopen('/home/user/output/smoke.txt', 'w').write('cold')\n'cold'")
    local bad = run_failed(r, m, c)
    if bad then return false, bad end
    sandbox_id = r.sandbox_id
    if r.reused then return false, "a fresh session reused sandbox " .. tostring(r.sandbox_id) end
    local f = r.files and r.files[1]
    if not f or f.name ~= "smoke.txt" or f.content ~= "cold" then
      return false, "the file left in /home/user/output did not come back"
    end
    return true, "sandbox " .. tostring(sandbox_id)
  end)

  step(2, function()
    local r, m, c = s:run("x += 1\nx")
    local bad = run_failed(r, m, c)
    if bad then return false, bad end
    if r.sandbox_id ~= sandbox_id or not r.reused then
      return false, fmt("sandbox %s (reused=%s), expected %s reused", tostring(r.sandbox_id), tostring(r.reused),
        tostring(sandbox_id))
    end
    if first_text(r) ~= "42" then return false, "x + 1 gave " .. tostring(first_text(r)) .. ", expected 42" end
    return true, "same sandbox, x + 1 = 42"
  end)

  step(3, function()
    local r, m, c = s:run("import os\nsorted(os.listdir('/home/user/output'))")
    local bad = run_failed(r, m, c)
    if bad then return false, bad end
    if first_text(r) ~= "[]" then return false, "/home/user/output held " .. tostring(first_text(r)) end
    if r.files and #r.files > 0 then
      return false, "a file of the previous run came back: " .. tostring(r.files[1].name)
    end
    return true, "/home/user/output empty, no file returned"
  end)

  step(4, function()
    local deadline = now() + opts.exec_timeout + opts.idle_timeout + 60
    local last
    while now() < deadline do
      local info, m, c = wb.client:info(sandbox_id)
      if info and info.state == "paused" then return true, "paused after its lease" end
      last = info and ("state " .. tostring(info.state)) or fmt("%s (%s)", tostring(m), tostring(c))
      if not info and c ~= "TIMEOUT" and c ~= "TRANSPORT" and c ~= "HTTP" and c ~= "RATE_LIMITED" then
        return false, "info: " .. last
      end
      sleep(0.25)
    end
    return false, "did not pause in time; last seen: " .. tostring(last)
  end)

  step(5, function()
    local r, m, c = s:run("x")
    local bad = run_failed(r, m, c)
    if bad then return false, bad end
    if r.sandbox_id ~= sandbox_id or not r.resumed then
      return false, fmt("sandbox %s (resumed=%s), expected %s resumed", tostring(r.sandbox_id), tostring(r.resumed),
        tostring(sandbox_id))
    end
    if first_text(r) ~= "42" then
      return false, "x is " .. tostring(first_text(r)) .. " after the resume, expected 42"
    end
    return true, "same sandbox resumed, x = 42"
  end)

  step(6, function()
    released = true
    local n, m, c = wb:release(key)
    if not n then return false, fmt("release: %s (%s)", tostring(m), tostring(c)) end
    if sandbox_id then
      local info, _, ic = wb.client:info(sandbox_id)
      if info or ic ~= "NOT_FOUND" then
        return false, fmt("sandbox %s still there after release (%s)", tostring(sandbox_id),
          info and tostring(info.state) or tostring(ic))
      end
    end
    return true, fmt("released: %d sandbox%s killed", n, n == 1 and "" or "es")
  end)

  if failed_step and not released then
    -- self-cleaning: whatever the session made goes
    local n, m, c = wb:release(key)
    out:write(n and fmt("cleaned up: %d sandbox%s killed\n", n, n == 1 and "" or "es")
      or fmt("clean-up failed: %s (%s); sandboxes tagged with session %s may remain\n", tostring(m), tostring(c), key))
  end
  wb:close()
  if failed_step then
    out:write(fmt("smoke FAILED at step '%s'\n", failed_step))
    return 1
  end
  out:write("smoke ok\n")
  return 0
end

return _M
