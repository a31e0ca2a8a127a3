-- spec/integration/warmboxd/containment.lua, the parts of group 'net'.
require("spec.helpers.parts").run("spec/integration/warmboxd/containment.lua", "net", _ENV)
