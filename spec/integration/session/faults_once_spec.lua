-- spec/integration/session/faults.lua, the parts of group 'once'.
require("spec.helpers.parts").run("spec/integration/session/faults.lua", "once", _ENV)
