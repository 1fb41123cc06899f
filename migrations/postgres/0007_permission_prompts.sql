-- Permission prompts, stored so that a client of any daemon sharing the database sees them and
-- may answer them: a row lives while its agent waits (the waiting daemon removes it when the
-- wait ends). A prompt is open while it has no answer and `daemon`, which asked it, still holds
-- the agent under a live lease; a dead daemon's prompts are removed when the daemon that adopts
-- the agent asks again.
CREATE TABLE permission_prompts (
    id TEXT COLLATE "C" PRIMARY KEY,
    session_id TEXT COLLATE "C" NOT NULL REFERENCES sessions (id),
    agent_id TEXT COLLATE "C" NOT NULL REFERENCES agents (id),
    daemon TEXT COLLATE "C" NOT NULL,
    tool TEXT NOT NULL,
    input_json TEXT NOT NULL,
    question TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    -- 'allow_once', 'allow_always' or 'deny'; NULL until a client answers.
    answer TEXT CHECK (answer IN ('allow_once', 'allow_always', 'deny')),
    deny_reason TEXT,
    answered_at_ms BIGINT
);

CREATE INDEX permission_prompts_session ON permission_prompts (session_id, created_at_ms);
CREATE INDEX permission_prompts_agent ON permission_prompts (agent_id);

-- Tools a session's client allowed for the rest of the session ("allow always").
CREATE TABLE session_allowed_tools (
    session_id TEXT COLLATE "C" NOT NULL REFERENCES sessions (id),
    tool TEXT NOT NULL,
    allowed_at_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, tool)
);
