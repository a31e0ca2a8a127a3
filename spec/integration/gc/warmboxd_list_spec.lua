-- spec/integration/gc/warmboxd.lua, the parts of group 'list'.
require("spec.helpers.parts").run("spec/integration/gc/warmboxd.lua", "list", _ENV)
