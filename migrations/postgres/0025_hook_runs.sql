-- Hooks' runs: the table as in the SQLite schema's 0039_hook_runs.sql, which says what each
-- column holds.
CREATE TABLE hook_runs (
    id             BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id       TEXT COLLATE "C" NOT NULL REFERENCES agents (id),
    event          TEXT    NOT NULL,
    tool_use_id    TEXT,
    tool_name      TEXT,
    program        TEXT    NOT NULL,
    exit_code      INTEGER,
    decision       TEXT    NOT NULL,
    output         TEXT    NOT NULL,
    started_at_ms  BIGINT  NOT NULL,
    finished_at_ms BIGINT  NOT NULL
);
CREATE INDEX hook_runs_by_agent ON hook_runs (agent_id, id);
