-- spec/integration/warmboxd/envd.lua, the parts of group 'fs'.
require("spec.helpers.parts").run("spec/integration/warmboxd/envd.lua", "fs", _ENV)
