-- What spec/integration/warmboxd/interp_*_spec.lua share (their requires and helpers).
local wbd = require "spec.helpers.warmboxd"
local http = require "spec.helpers.http"
local nd = require "spec.helpers.ndjson"

local cjson = http.cjson
local q = wbd.sh_quote

-- The NDJSON body as decoded lines (and the raw lines, for exact-text checks).
local lines_of, of_type, main_result = nd.lines, nd.of_type, nd.main_result

local function stdout_text(lines) return table.concat(nd.texts(lines, "stdout")) end

return {
  wbd = wbd,
  http = http,
  nd = nd,
  cjson = cjson,
  q = q,
  lines_of = lines_of,
  of_type = of_type,
  main_result = main_result,
  stdout_text = stdout_text,
}
