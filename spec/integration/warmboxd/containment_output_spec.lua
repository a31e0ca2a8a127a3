-- spec/integration/warmboxd/containment.lua, the parts of group 'output'.
require("spec.helpers.parts").run("spec/integration/warmboxd/containment.lua", "output", _ENV)
