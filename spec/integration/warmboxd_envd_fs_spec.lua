-- spec/integration/warmboxd_envd.lua, the parts of group 'fs'.
require("spec.helpers.parts").run("spec/integration/warmboxd_envd.lua", "fs", _ENV)
