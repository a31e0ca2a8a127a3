std = "lua54"
max_line_length = 120
exclude_files = { "build/", "spec/sdk/node_modules/", ".luarocks/" }
files["spec/"] = { std = "+busted" }
files["bench/"] = { std = "+lua54" }
