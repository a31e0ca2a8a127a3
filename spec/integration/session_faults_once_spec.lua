-- spec/integration/session_faults.lua, the parts of group 'once'.
require("spec.helpers.parts").run("spec/integration/session_faults.lua", "once", _ENV)
