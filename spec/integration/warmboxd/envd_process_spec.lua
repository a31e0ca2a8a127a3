-- spec/integration/warmboxd/envd.lua, the parts of group 'process'.
require("spec.helpers.parts").run("spec/integration/warmboxd/envd.lua", "process", _ENV)
