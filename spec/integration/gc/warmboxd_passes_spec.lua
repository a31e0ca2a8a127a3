-- spec/integration/gc/warmboxd.lua, the parts of group 'passes'.
require("spec.helpers.parts").run("spec/integration/gc/warmboxd.lua", "passes", _ENV)
