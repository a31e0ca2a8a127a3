--- Reading the code interpreter's /execute answers: NDJSON, one event a line
-- (`stdout`, `stderr`, `result`, `error`, `number_of_executions`, `end_of_execution`).
local cjson = require("cjson.safe").new()

local M = {}

--- The body's lines decoded, and the raw lines. A line that is not JSON
-- raises, or with `lenient` is left out (for bodies that may be an error page).
function M.lines(body, lenient)
  local out, raw = {}, {}
  for line in body:gmatch("[^\n]+") do
    raw[#raw + 1] = line
    local l = cjson.decode(line)
    if not lenient then assert(l, "not JSON: " .. line) end
    if type(l) == "table" then out[#out + 1] = l end
  end
  return out, raw
end

--- The events of type `t`.
function M.of_type(lines, t)
  local r = {}
  for _, l in ipairs(lines) do
    if l.type == t then r[#r + 1] = l end
  end
  return r
end

--- The `text` of every event of type `t`, in order.
function M.texts(lines, t)
  local r = {}
  for _, l in ipairs(M.of_type(lines, t)) do r[#r + 1] = l.text end
  return r
end

--- The main result event (nil when there is none).
function M.main_result(lines)
  for _, l in ipairs(lines) do
    if l.type == "result" and l.is_main_result then return l end
  end
end

--- The first error event (nil when there is none).
function M.error_of(lines)
  return M.of_type(lines, "error")[1]
end

--- The main result's text, from a raw body (nil when there is none; lines
-- that are not JSON are passed over).
function M.main_text(body)
  local r = M.main_result((M.lines(body, true)))
  return r and r.text
end

--- The first error event, from a raw body (lines that are not JSON are passed over).
function M.error_in(body)
  return M.error_of((M.lines(body, true)))
end

return M
