-- Hooks' runs (docs/contracts.md, "Hooks"): what each hook command decided and said, for
-- `forkctl logs` and the web view. One row per command run, in the order they ended.
--
-- - `tool_use_id`, `tool_name`: the tool call the run was about (PreToolUse, PostToolUse, a
--   Notification for its prompt); NULL for a stop, a prompt, a compaction.
-- - `program`: the command's first word only (a session's own command may hold a secret).
-- - `exit_code`: NULL when it was killed (its timeout) or never started.
-- - `decision`: allow | ask | deny | block | stop | error | none.
-- - `output`: what it said (a reason, its context, its systemMessage, an error), clipped.
CREATE TABLE hook_runs (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    agent_id       TEXT    NOT NULL REFERENCES agents (id),
    event          TEXT    NOT NULL,
    tool_use_id    TEXT,
    tool_name      TEXT,
    program        TEXT    NOT NULL,
    exit_code      INTEGER,
    decision       TEXT    NOT NULL,
    output         TEXT    NOT NULL,
    started_at_ms  INTEGER NOT NULL,
    finished_at_ms INTEGER NOT NULL
);
CREATE INDEX hook_runs_by_agent ON hook_runs (agent_id, id);
