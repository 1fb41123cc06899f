-- The process group a Bash call started, recorded while the call runs: its id, its leader's start
-- time (clock ticks since boot, field 22 of /proc/PID/stat) and the machine's boot id. A daemon
-- resuming an agent whose call was cut off stops that group first, if it is still alive on this
-- machine and still the same group (not an id reused since). NULL for calls that started none and
-- for every call stored before this migration.
ALTER TABLE tool_calls ADD COLUMN process_pgid INTEGER;
ALTER TABLE tool_calls ADD COLUMN process_start_ticks INTEGER;
ALTER TABLE tool_calls ADD COLUMN process_boot_id TEXT;
