-- spec/integration/warmboxd_containment.lua, the parts of group 'net'.
require("spec.helpers.parts").run("spec/integration/warmboxd_containment.lua", "net", _ENV)
