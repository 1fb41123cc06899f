-- Limits on a child's run (docs/contracts.md, "Limits"): an agent may end `timed_out`, its
-- limits are stored with it, and the clock of its wall-time limit counts from a stored start.
-- The columns as in the SQLite schema's 0035_limits.sql.
ALTER TABLE agents DROP CONSTRAINT agents_state_check;
ALTER TABLE agents ADD CONSTRAINT agents_state_check
    CHECK (state IN ('pending', 'running', 'idle', 'completed', 'failed', 'killed', 'timed_out'));
ALTER TABLE notifications DROP CONSTRAINT notifications_status_check;
ALTER TABLE notifications ADD CONSTRAINT notifications_status_check
    CHECK (status IN ('completed', 'failed', 'killed', 'timed_out'));
ALTER TABLE agents ADD COLUMN limits_json TEXT;
ALTER TABLE agents ADD COLUMN started_at_ms BIGINT;
ALTER TABLE agents ADD COLUMN throttled_ms BIGINT NOT NULL DEFAULT 0 CHECK (throttled_ms >= 0);
