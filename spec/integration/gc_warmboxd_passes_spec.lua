-- spec/integration/gc_warmboxd.lua, the parts of group 'passes'.
require("spec.helpers.parts").run("spec/integration/gc_warmboxd.lua", "passes", _ENV)
