-- spec/integration/session/faults.lua, the parts of group 'transient'.
require("spec.helpers.parts").run("spec/integration/session/faults.lua", "transient", _ENV)
