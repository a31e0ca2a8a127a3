-- spec/integration/warmboxd/interp.lua, the parts of group 'kernel'.
require("spec.helpers.parts").run("spec/integration/warmboxd/interp.lua", "kernel", _ENV)
