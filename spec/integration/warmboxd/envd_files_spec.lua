-- spec/integration/warmboxd/envd.lua, the parts of group 'files'.
require("spec.helpers.parts").run("spec/integration/warmboxd/envd.lua", "files", _ENV)
