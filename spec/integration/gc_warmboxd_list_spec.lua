-- spec/integration/gc_warmboxd.lua, the parts of group 'list'.
require("spec.helpers.parts").run("spec/integration/gc_warmboxd.lua", "list", _ENV)
