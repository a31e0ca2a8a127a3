-- spec/integration/warmboxd_containment.lua, the parts of group 'output'.
require("spec.helpers.parts").run("spec/integration/warmboxd_containment.lua", "output", _ENV)
