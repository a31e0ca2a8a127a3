-- spec/integration/warmboxd_envd.lua, the parts of group 'files'.
require("spec.helpers.parts").run("spec/integration/warmboxd_envd.lua", "files", _ENV)
