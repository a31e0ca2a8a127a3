-- Loaded by busted before every spec file (see .busted).
if os.getenv("WARMBOX_GC_STRESS") == "1" then
  -- In 5.4 a pause <= 100 restarts a cycle at once: every allocation works the GC.
  collectgarbage("incremental", 100, 1000)
end
math.randomseed(os.time() + math.floor(os.clock() * 1e6))
