-- forkd's initial schema.
--
-- Conventions:
-- * Ids are UUID v7 strings, lowercase and hyphenated, so ordering by id is creation order.
-- * `*_json` columns hold the exact bytes forkd sends to the model. They are never re-encoded:
--   prompt caching is byte-exact.
-- * Timestamps are Unix milliseconds, given by the caller.
-- * Tables are STRICT so a wrong type is an error, not a silent coercion.
-- * The shared prefix of a fork batch is stored once: the parent's transcript (session_messages) up
--   to and including the batch's assistant message, plus the batch row. A child stores only its
--   directive block and its own later messages.

CREATE TABLE sessions (
    id              TEXT    NOT NULL PRIMARY KEY,
    model           TEXT    NOT NULL,
    system_prompt   TEXT    NOT NULL,
    tools_json      TEXT    NOT NULL,
    thinking_budget INTEGER CHECK (thinking_budget IS NULL OR thinking_budget >= 0),
    max_tokens      INTEGER NOT NULL CHECK (max_tokens >= 0),
    workspace       TEXT    NOT NULL,
    coordinator     INTEGER NOT NULL CHECK (coordinator IN (0, 1)),
    interactive     INTEGER NOT NULL CHECK (interactive IN (0, 1)),
    permission_mode TEXT    NOT NULL,
    created_at_ms   INTEGER NOT NULL
) STRICT;

-- A parent session's transcript. `seq` is the 0-based position; gaps never occur because every
-- append takes MAX(seq) + 1 inside a write transaction.
CREATE TABLE session_messages (
    session_id    TEXT    NOT NULL REFERENCES sessions (id),
    seq           INTEGER NOT NULL CHECK (seq >= 0),
    role          TEXT    NOT NULL CHECK (role IN ('user', 'assistant')),
    content_json  TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
) STRICT;

-- A fork batch. Its assistant message `A` is also the parent's message at `fork_point`; the
-- composite foreign key makes a batch without that message impossible.
CREATE TABLE batches (
    id                      TEXT    NOT NULL PRIMARY KEY,
    session_id              TEXT    NOT NULL REFERENCES sessions (id),
    fork_point              INTEGER NOT NULL CHECK (fork_point >= 0),
    assistant_json          TEXT    NOT NULL,
    shared_user_blocks_json TEXT    NOT NULL,
    created_at_ms           INTEGER NOT NULL,
    FOREIGN KEY (session_id, fork_point) REFERENCES session_messages (session_id, seq)
) STRICT;

CREATE INDEX batches_by_session ON batches (session_id, id);

CREATE TABLE agents (
    id                          TEXT    NOT NULL PRIMARY KEY,
    session_id                  TEXT    NOT NULL REFERENCES sessions (id),
    batch_id                    TEXT    REFERENCES batches (id),
    kind                        TEXT    NOT NULL CHECK (kind IN ('parent', 'fork', 'typed')),
    idx                         INTEGER NOT NULL CHECK (idx >= 0),
    state                       TEXT    NOT NULL
        CHECK (state IN ('pending', 'running', 'completed', 'failed', 'killed')),
    -- The directive: both set or both absent.
    description                 TEXT,
    prompt                      TEXT,
    directive_block_json        TEXT,
    query_source                TEXT,
    -- Totals over the agent's recorded requests.
    input_tokens                INTEGER NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    cache_creation_input_tokens INTEGER NOT NULL DEFAULT 0
        CHECK (cache_creation_input_tokens >= 0),
    cache_read_input_tokens     INTEGER NOT NULL DEFAULT 0 CHECK (cache_read_input_tokens >= 0),
    output_tokens               INTEGER NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    cost_usd                    REAL    NOT NULL DEFAULT 0,
    error                       TEXT,
    created_at_ms               INTEGER NOT NULL,
    updated_at_ms               INTEGER NOT NULL,
    CHECK ((description IS NULL) = (prompt IS NULL))
) STRICT;

-- list_agents filters by session or batch and pages by id; the partial index serves the common
-- "what is still live" listing (and the resume scan at start-up) without touching ended agents.
CREATE INDEX agents_by_session ON agents (session_id, id);
CREATE INDEX agents_by_batch ON agents (batch_id, id) WHERE batch_id IS NOT NULL;
CREATE INDEX agents_live ON agents (id) WHERE state IN ('pending', 'running');

-- An agent's own (sidechain) transcript.
CREATE TABLE agent_messages (
    agent_id      TEXT    NOT NULL REFERENCES agents (id),
    seq           INTEGER NOT NULL CHECK (seq >= 0),
    role          TEXT    NOT NULL CHECK (role IN ('user', 'assistant')),
    content_json  TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (agent_id, seq)
) STRICT;

-- Task notifications. AUTOINCREMENT (not a plain rowid) so a seq is never reused, even after the
-- highest row is deleted: subscribers resume with `since_seq` and must never miss or re-see one.
CREATE TABLE notifications (
    seq                         INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id                  TEXT    NOT NULL REFERENCES sessions (id),
    batch_id                    TEXT    REFERENCES batches (id),
    agent_id                    TEXT    NOT NULL UNIQUE REFERENCES agents (id),
    status                      TEXT    NOT NULL CHECK (status IN ('completed', 'failed', 'killed')),
    summary                     TEXT    NOT NULL,
    report_json                 TEXT    NOT NULL,
    input_tokens                INTEGER NOT NULL CHECK (input_tokens >= 0),
    cache_creation_input_tokens INTEGER NOT NULL CHECK (cache_creation_input_tokens >= 0),
    cache_read_input_tokens     INTEGER NOT NULL CHECK (cache_read_input_tokens >= 0),
    output_tokens               INTEGER NOT NULL CHECK (output_tokens >= 0),
    cost_usd                    REAL    NOT NULL,
    created_at_ms               INTEGER NOT NULL
) STRICT;

CREATE INDEX notifications_by_session ON notifications (session_id, seq);
CREATE INDEX notifications_by_batch ON notifications (batch_id, seq) WHERE batch_id IS NOT NULL;

-- One row per model request, for cache statistics and cost accounting.
CREATE TABLE requests (
    id                          TEXT    NOT NULL PRIMARY KEY,
    agent_id                    TEXT    NOT NULL REFERENCES agents (id),
    session_id                  TEXT    NOT NULL REFERENCES sessions (id),
    batch_id                    TEXT    REFERENCES batches (id),
    turn                        INTEGER NOT NULL CHECK (turn >= 0),
    model                       TEXT    NOT NULL,
    input_tokens                INTEGER NOT NULL CHECK (input_tokens >= 0),
    cache_creation_input_tokens INTEGER NOT NULL CHECK (cache_creation_input_tokens >= 0),
    cache_read_input_tokens     INTEGER NOT NULL CHECK (cache_read_input_tokens >= 0),
    output_tokens               INTEGER NOT NULL CHECK (output_tokens >= 0),
    cost_usd                    REAL    NOT NULL,
    prefix_fingerprint          TEXT    NOT NULL,
    body_bytes                  INTEGER NOT NULL CHECK (body_bytes >= 0),
    stop_reason                 TEXT,
    created_at_ms               INTEGER NOT NULL
) STRICT;

CREATE INDEX requests_by_agent ON requests (agent_id, id);
CREATE INDEX requests_by_session ON requests (session_id, id);
CREATE INDEX requests_by_batch ON requests (batch_id, id) WHERE batch_id IS NOT NULL;
