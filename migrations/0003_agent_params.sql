-- The cache-safe params of agents that do not share their session's: typed agents have their
-- own system prompt, tools and possibly model. Rendered once when the agent is created and
-- stored as the exact bytes every request of the agent carries, like a session's.
CREATE TABLE agent_params (
    agent_id        TEXT    NOT NULL PRIMARY KEY REFERENCES agents (id),
    model           TEXT    NOT NULL,
    system_prompt   TEXT    NOT NULL,
    tools_json      TEXT    NOT NULL,
    thinking_budget INTEGER CHECK (thinking_budget IS NULL OR thinking_budget >= 0),
    max_tokens      INTEGER NOT NULL CHECK (max_tokens >= 0),
    permission_mode TEXT    NOT NULL
) STRICT;
