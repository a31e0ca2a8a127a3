-- spec/integration/warmboxd/interp.lua, the parts of group 'serial'.
require("spec.helpers.parts").run("spec/integration/warmboxd/interp.lua", "serial", _ENV)
