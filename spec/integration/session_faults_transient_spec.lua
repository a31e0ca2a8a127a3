-- spec/integration/session_faults.lua, the parts of group 'transient'.
require("spec.helpers.parts").run("spec/integration/session_faults.lua", "transient", _ENV)
