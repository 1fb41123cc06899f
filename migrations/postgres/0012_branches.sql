-- Branches: see ../0026_branches.sql.
ALTER TABLE sessions ADD COLUMN branch_of TEXT COLLATE "C" REFERENCES sessions (id);
ALTER TABLE sessions ADD COLUMN branch_point BIGINT
    CHECK (branch_point IS NULL OR branch_point > 0);
ALTER TABLE sessions ADD COLUMN branch_compacted_to BIGINT
    CHECK (branch_compacted_to IS NULL OR branch_compacted_to > 0);
ALTER TABLE sessions ADD COLUMN params_of TEXT COLLATE "C" REFERENCES sessions (id);

ALTER TABLE sessions ADD COLUMN reply_breakpoint BOOLEAN NOT NULL DEFAULT FALSE;

CREATE INDEX sessions_by_origin ON sessions (branch_of, id) WHERE branch_of IS NOT NULL;

ALTER TABLE session_messages ADD COLUMN starts_turn BOOLEAN NOT NULL DEFAULT FALSE;

UPDATE session_messages SET starts_turn = TRUE
WHERE seq > 0 AND role = 'user'
  AND content_json NOT LIKE '%"type":"tool_result"%'
  AND content_json NOT LIKE '[{"type":"text","text":"<batch-launched>%'
  AND content_json NOT LIKE '[{"type":"text","text":"<batch-notification>%'
  AND content_json NOT LIKE '[{"type":"text","text":"<task-notification>%';
