-- spec/integration/warmboxd_interp.lua, the parts of group 'kernel'.
require("spec.helpers.parts").run("spec/integration/warmboxd_interp.lua", "kernel", _ENV)
