-- spec/integration/cli/server.lua, the parts of group 'run'.
require("spec.helpers.parts").run("spec/integration/cli/server.lua", "run", _ENV)
