-- mod_warmbox: a Prosody module (0.12, Lua 5.4) that runs code in one warm
-- sandbox per conversation on Prosody's own event loop: a run never blocks
-- Prosody; other requests (and XMPP traffic) are served while cells run.
--
--   POST /warmbox/run/KEY   body: the code   ->  200 and the run's text (r.text),
--                                                422 the cell raised, 502 warmbox failed
--   GET  /warmbox/ping                        ->  "pong" (answered at once, even during a run)
--
-- prosody.cfg.lua (see the one next to this file):
--   plugin_paths = { "/path/to/examples/prosody" }
--   modules_enabled = { "http", "warmbox" }  -- with warmbox on Lua's path (LUA_PATH/LUA_CPATH, or a rocks tree)
--
-- warmbox.new{} uses the user's shared local server (or E2B with E2B_API_KEY).
-- It is made at the first request, not at module load: `prosody -D` (how
-- Debian's service runs it) forks after loading the modules, and a warmbox
-- object made before a fork refuses to run in the child (its connections and
-- event engine would be shared with the parent).
local warmbox = require "warmbox"
local loop = require "warmbox.loop.prosody"

module:depends("http")

local wb, hook

-- The module's warmbox object, made (and attached to Prosody's loop) at first use.
local function the_wb()
  if not wb then
    wb = assert(warmbox.new{})
    hook = loop.attach(wb)
  end
  return wb
end

local function reply(response, status, text)
  response.status_code = status
  response.headers.content_type = "text/plain; charset=utf-8"
  response:send(text .. "\n")
end

local function run(event, key)
  local code = event.request.body
  if not key or key == "" or type(code) ~= "string" or code == "" then
    return reply(event.response, 400, "usage: POST /warmbox/run/KEY with the code as the body")
  end
  local response = event.response
  local w = the_wb()
  w:spawn(function() return w:session(key):run(code) end):on_done(function(t)
    local r, err, ecode = t:result()
    if not r then return reply(response, 502, tostring(err) .. " (" .. tostring(ecode) .. ")") end
    if r.error then return reply(response, 422, r.error.name .. ": " .. tostring(r.error.value)) end
    reply(response, 200, r.text or "")
  end)
  return true -- answered later, from on_done
end

module:provides("http", {
  route = {
    ["POST /run/*"] = run,
    ["GET /ping"] = function() return "pong" end,
  },
})

function module.unload()
  if not wb then return end
  hook:detach()
  wb:close{ drain = 5 }
  wb, hook = nil, nil
end
