-- spec/integration/warmboxd_interp.lua, the parts of group 'serial'.
require("spec.helpers.parts").run("spec/integration/warmboxd_interp.lua", "serial", _ENV)
