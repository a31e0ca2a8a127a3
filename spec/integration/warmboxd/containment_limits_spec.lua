-- spec/integration/warmboxd/containment.lua, the parts of group 'limits'.
require("spec.helpers.parts").run("spec/integration/warmboxd/containment.lua", "limits", _ENV)
