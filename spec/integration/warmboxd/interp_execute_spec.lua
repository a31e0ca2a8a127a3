-- spec/integration/warmboxd/interp.lua, the parts of group 'execute'.
require("spec.helpers.parts").run("spec/integration/warmboxd/interp.lua", "execute", _ENV)
