-- spec/integration/cli/server.lua, the parts of group 'server'.
require("spec.helpers.parts").run("spec/integration/cli/server.lua", "server", _ENV)
