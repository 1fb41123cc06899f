-- Tool calls: each call's intent is stored before it runs, and its result after.
--
-- An intent without a result is a call that was interrupted (the daemon died, the agent was
-- handed over): a later run re-runs it only if it is read-only, and otherwise tells the model it
-- was interrupted. `result_json` is the tool_result block exactly as the model sees it;
-- `full_output` holds the whole output when the model was shown a shortened form (content
-- replacement, decided once per tool_use_id).
CREATE TABLE tool_calls (
    agent_id       TEXT    NOT NULL REFERENCES agents (id),
    tool_use_id    TEXT    NOT NULL,
    name           TEXT    NOT NULL,
    input_json     TEXT    NOT NULL,
    read_only      INTEGER NOT NULL CHECK (read_only IN (0, 1)),
    result_json    TEXT,
    full_output    TEXT,
    started_at_ms  INTEGER NOT NULL,
    finished_at_ms INTEGER,
    CHECK ((result_json IS NULL) = (finished_at_ms IS NULL)),
    PRIMARY KEY (agent_id, tool_use_id)
) STRICT;
