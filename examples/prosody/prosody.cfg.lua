-- A Prosody configuration serving mod_warmbox on loopback (HTTP only).
-- Adjust the paths; the example's spec writes one like it for a free port.
--   LUA_PATH="/path/to/warmbox/lua/?.lua;/path/to/warmbox/lua/?/init.lua;;" \
--   LUA_CPATH="/path/to/warmbox/build/?.so;;" prosody -F --config prosody.cfg.lua
plugin_paths = { "/path/to/warmbox/examples/prosody" }
data_path = "/tmp/prosody-warmbox"
pidfile = "/tmp/prosody-warmbox/prosody.pid"
log = { info = "/tmp/prosody-warmbox/prosody.log" }
modules_enabled = { "http", "warmbox" }
c2s_ports = {}
s2s_ports = {}
component_ports = {}
http_ports = { 5280 }
http_interfaces = { "127.0.0.1" }
https_ports = {}
http_default_host = "localhost"
VirtualHost "localhost"
