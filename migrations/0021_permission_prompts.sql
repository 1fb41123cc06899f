-- Permission prompts, stored so that a client of any daemon sharing the database sees them and
-- may answer them: a row lives while its agent waits (the waiting daemon removes it when the
-- wait ends). A prompt is open while it has no answer and `daemon`, which asked it, still holds
-- the agent. One daemon uses a SQLite database, so opening it removes every row (the waits they
-- belonged to ended with the daemon before).
CREATE TABLE permission_prompts (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id),
    agent_id TEXT NOT NULL REFERENCES agents (id),
    daemon TEXT NOT NULL,
    tool TEXT NOT NULL,
    input_json TEXT NOT NULL,
    question TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    -- 'allow_once', 'allow_always' or 'deny'; NULL until a client answers.
    answer TEXT CHECK (answer IN ('allow_once', 'allow_always', 'deny')),
    deny_reason TEXT,
    answered_at_ms INTEGER
);

CREATE INDEX permission_prompts_session ON permission_prompts (session_id, created_at_ms);
CREATE INDEX permission_prompts_agent ON permission_prompts (agent_id);

-- Tools a session's client allowed for the rest of the session ("allow always").
CREATE TABLE session_allowed_tools (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    tool TEXT NOT NULL,
    allowed_at_ms INTEGER NOT NULL,
    PRIMARY KEY (session_id, tool)
);
