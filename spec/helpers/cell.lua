--- One cell on a sandbox's code interpreter over real HTTP, for specs that
-- only need its text: `stdout .. main result` and the error's name (or nil).
-- language defaults to "bash".
local http = require "spec.helpers.http"
local ndjson = require "spec.helpers.ndjson"

return function(srv, sb, code, language)
  local res = http.sandbox(srv, sb, 49999, "POST", "/execute",
    { json = { code = code, language = language or "bash" }, timeout = 60 })
  assert(res.status == 200, "execute: http " .. tostring(res.status) .. ": " .. tostring(res.body))
  local out, err = {}, nil
  for _, l in ipairs(ndjson.lines(res.body)) do
    if l.type == "stdout" or (l.type == "result" and l.is_main_result) then out[#out + 1] = l.text end
    if l.type == "error" then err = l.name end
  end
  return table.concat(out), err
end
