-- spec/integration/warmboxd_interp.lua, the parts of group 'execute'.
require("spec.helpers.parts").run("spec/integration/warmboxd_interp.lua", "execute", _ENV)
