-- spec/integration/warmboxd_containment.lua, the parts of group 'limits'.
require("spec.helpers.parts").run("spec/integration/warmboxd_containment.lua", "limits", _ENV)
