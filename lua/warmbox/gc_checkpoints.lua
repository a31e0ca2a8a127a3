--- warmbox.gc_checkpoints: the old name of `warmbox.gc.checkpoints`, kept only
-- while `lua/warmbox/init.lua` requires it by that name; delete this file
-- once it requires "warmbox.gc.checkpoints".
-- @module warmbox.gc_checkpoints
return require "warmbox.gc.checkpoints"
