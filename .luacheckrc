std = "lua54"
max_line_length = 120
exclude_files = { "build/", "spec/sdk/node_modules/", ".luarocks/" }
files["spec/"] = { std = "+busted" }
files["bench/"] = { std = "+lua54" }
-- Cyclomatic complexity at most 25 in the module and the CLI (spec/ and
-- bench/ are not held to it).
files["lua/"] = { max_cyclomatic_complexity = 25 }
files["bin/warmbox"] = { max_cyclomatic_complexity = 25 }
-- examples/: scripts run by their hosts, with the globals those hosts give
files["examples/lighttpd/warmbox.lua"] = { globals = { "lighty" } }
files["examples/prosody/mod_warmbox.lua"] = { globals = { "module" } }
files["examples/prosody/prosody.cfg.lua"] = { allow_defined_top = true, ignore = { "131" },
  read_globals = { "VirtualHost" } }
