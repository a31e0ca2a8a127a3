-- spec/integration/cli_server.lua, the parts of group 'server'.
require("spec.helpers.parts").run("spec/integration/cli_server.lua", "server", _ENV)
