-- spec/integration/cli_server.lua, the parts of group 'run'.
require("spec.helpers.parts").run("spec/integration/cli_server.lua", "run", _ENV)
