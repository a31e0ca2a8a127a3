-- spec/integration/warmboxd_envd.lua, the parts of group 'process'.
require("spec.helpers.parts").run("spec/integration/warmboxd_envd.lua", "process", _ENV)
