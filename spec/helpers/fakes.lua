-- Deterministic stand-ins for warmbox.core's digests, for unit specs that run
-- without the C module: hex strings of the digests' length, different for
-- different inputs in practice, never cryptographic.
local M = {}

--- A 32-hex-digit stand-in for core.sha256.
function M.hash(s)
  local h1, h2 = 5381, 52711
  for i = 1, #s do
    local b = s:byte(i)
    h1 = (h1 * 33 + b) % 4294967296
    h2 = (h2 * 31 + b * 7) % 4294967296
  end
  return string.format("%08x%08x%08x%08x", h1, h2, (h1 ~ h2) % 4294967296, (h1 + h2) % 4294967296)
end

--- The version CMakeLists.txt declares (what the real core reports), for fake cores.
M.VERSION = (function()
  local f = assert(io.open("CMakeLists.txt", "rb"))
  local v = f:read("a"):match("project%(warmbox%s+VERSION%s+([%d%.]+)")
  f:close()
  return assert(v, "no version in CMakeLists.txt")
end)()

--- A stand-in for core.embedded(name): the bytes of python/<name>, as the build compiles them in.
function M.embedded(name)
  local f = io.open("python/" .. name, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

--- A stand-in for core.hmac_sha256(key, s).
function M.hmac(k, s)
  return M.hash(k .. "\0" .. s)
end

--- A lock module for GC's unit specs: `m.new()` makes locks over one shared
-- table; `m.held`, `m.n` (held now), `m.max` (most held at once), `m.state`
-- (per-key state), and `m.busy[key] = true` makes a key look held elsewhere.
function M.counting_lock()
  local m = { held = {}, n = 0, max = 0, state = {}, busy = {} }
  function m.new()
    local lk = {}
    function lk:try_lock(key)
      if m.held[key] or m.busy[key] then return nil, "busy" end
      m.held[key], self.k = true, key
      m.n = m.n + 1
      if m.n > m.max then m.max = m.n end
      return true
    end
    function lk:unlock()
      m.held[self.k] = nil
      m.n = m.n - 1
      return true
    end
    function lk:get_state() return m.state[self.k] end
    function lk:set_state(s) m.state[self.k] = s return true end
    return lk
  end
  return m
end

return M
