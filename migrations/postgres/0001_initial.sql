-- forkd's schema on PostgreSQL: the SQLite schema of migrations ../0001 to ../0015, as it stands
-- after them, in one migration. The conventions are SQLite's (see ../0001_initial.sql): ids are
-- UUID v7 strings, so ordering by id is creation order; `*_json` columns hold the exact bytes
-- forkd sends to the model, never re-encoded; timestamps are Unix milliseconds given by the
-- caller. Types: BIGINT for SQLite's INTEGER, DOUBLE PRECISION for REAL, BOOLEAN for its 0/1
-- columns. Id columns (and the workspace, which is listed in order) use the "C" collation, so
-- they sort byte by byte as in SQLite whatever the database's own collation.
--
-- A later schema change gets a migration in each directory: ../00NN_*.sql for SQLite, and the
-- next number here.

CREATE TABLE sessions (
    id              TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    model           TEXT    NOT NULL,
    system_prompt   TEXT    NOT NULL,
    tools_json      TEXT    NOT NULL,
    thinking_budget BIGINT  CHECK (thinking_budget IS NULL OR thinking_budget >= 0),
    max_tokens      BIGINT  NOT NULL CHECK (max_tokens >= 0),
    workspace       TEXT COLLATE "C" NOT NULL,
    coordinator     BOOLEAN NOT NULL,
    interactive     BOOLEAN NOT NULL,
    permission_mode TEXT    NOT NULL,
    created_at_ms   BIGINT  NOT NULL,
    allow_rules     TEXT    NOT NULL DEFAULT '[]',
    deny_rules      TEXT    NOT NULL DEFAULT '[]',
    tenant          TEXT    NOT NULL DEFAULT 'local',
    sandbox         TEXT    NOT NULL DEFAULT 'workspace-write'
        CHECK (sandbox IN ('workspace-write', 'read-only', 'full-access')),
    allow_network   BOOLEAN NOT NULL DEFAULT FALSE
);

CREATE INDEX sessions_by_tenant ON sessions (tenant, id);

-- A session's transcript. `seq` is the 0-based position; gaps never occur because every append
-- takes MAX(seq) + 1 while it holds the session's row lock (see crates/store/src/postgres.rs).
CREATE TABLE session_messages (
    session_id    TEXT COLLATE "C" NOT NULL REFERENCES sessions (id),
    seq           BIGINT NOT NULL CHECK (seq >= 0),
    role          TEXT   NOT NULL CHECK (role IN ('user', 'assistant')),
    content_json  TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

-- A fork batch. A model's batch: its assistant message is also the parent's message at
-- `fork_point`; a client's: `assistant_json` is an empty array. The composite foreign key makes a
-- batch without its fork point's message impossible (the messages are inserted first, in the
-- same transaction, so it need not be deferred).
CREATE TABLE batches (
    id                      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    session_id              TEXT COLLATE "C" NOT NULL REFERENCES sessions (id),
    fork_point              BIGINT NOT NULL CHECK (fork_point >= 0),
    assistant_json          TEXT   NOT NULL,
    shared_user_blocks_json TEXT   NOT NULL,
    created_at_ms           BIGINT NOT NULL,
    budget_usd              DOUBLE PRECISION CHECK (budget_usd IS NULL OR budget_usd > 0),
    budget_tokens           BIGINT CHECK (budget_tokens IS NULL OR budget_tokens > 0),
    shape                   TEXT   NOT NULL DEFAULT 'model' CHECK (shape IN ('model', 'client')),
    FOREIGN KEY (session_id, fork_point) REFERENCES session_messages (session_id, seq)
);

CREATE INDEX batches_by_session ON batches (session_id, id);

CREATE TABLE agents (
    id                          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    session_id                  TEXT COLLATE "C" NOT NULL REFERENCES sessions (id),
    batch_id                    TEXT COLLATE "C" REFERENCES batches (id),
    kind                        TEXT   NOT NULL CHECK (kind IN ('parent', 'fork', 'typed')),
    idx                         BIGINT NOT NULL CHECK (idx >= 0),
    state                       TEXT   NOT NULL
        CHECK (state IN ('pending', 'running', 'idle', 'completed', 'failed', 'killed')),
    -- The directive: both set or both absent.
    description                 TEXT,
    prompt                      TEXT,
    directive_block_json        TEXT,
    query_source                TEXT,
    -- Totals over the agent's recorded requests.
    input_tokens                BIGINT NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    cache_creation_input_tokens BIGINT NOT NULL DEFAULT 0
        CHECK (cache_creation_input_tokens >= 0),
    cache_read_input_tokens     BIGINT NOT NULL DEFAULT 0 CHECK (cache_read_input_tokens >= 0),
    output_tokens               BIGINT NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    cost_usd                    DOUBLE PRECISION NOT NULL DEFAULT 0,
    error                       TEXT,
    created_at_ms               BIGINT NOT NULL,
    updated_at_ms               BIGINT NOT NULL,
    -- A run's claim: every write of the run checks it (see `Lease`).
    generation                  BIGINT NOT NULL DEFAULT 0 CHECK (generation >= 0),
    -- 'caller': a parent turn waits for the report and carries it in its tool result.
    report_to                   TEXT   NOT NULL DEFAULT 'transcript'
        CHECK (report_to IN ('transcript', 'caller')),
    CHECK ((description IS NULL) = (prompt IS NULL)),
    -- Only a main-loop agent idles; only it is never queued.
    CHECK (state <> 'idle' OR kind = 'parent')
);

CREATE INDEX agents_by_session ON agents (session_id, id);
CREATE INDEX agents_by_batch ON agents (batch_id, id) WHERE batch_id IS NOT NULL;
CREATE INDEX agents_live ON agents (id) WHERE state IN ('pending', 'running', 'idle');
CREATE INDEX agents_reporting_to_caller ON agents (id) WHERE report_to = 'caller';
CREATE INDEX agents_by_kind_state ON agents (kind, state);
CREATE INDEX agents_in_batches_by_update ON agents (updated_at_ms) WHERE batch_id IS NOT NULL;

-- An agent's own transcript (a fork child's: the messages after its first user message).
CREATE TABLE agent_messages (
    agent_id      TEXT COLLATE "C" NOT NULL REFERENCES agents (id),
    seq           BIGINT NOT NULL CHECK (seq >= 0),
    role          TEXT   NOT NULL CHECK (role IN ('user', 'assistant')),
    content_json  TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (agent_id, seq)
);

-- The cache-safe params of an agent that does not share its session's (a typed agent).
CREATE TABLE agent_params (
    agent_id        TEXT COLLATE "C" NOT NULL PRIMARY KEY REFERENCES agents (id),
    model           TEXT   NOT NULL,
    system_prompt   TEXT   NOT NULL,
    tools_json      TEXT   NOT NULL,
    thinking_budget BIGINT CHECK (thinking_budget IS NULL OR thinking_budget >= 0),
    max_tokens      BIGINT NOT NULL CHECK (max_tokens >= 0),
    permission_mode TEXT   NOT NULL
);

-- Notification seqs are taken from this one row (`UPDATE … SET last = last + 1 RETURNING last`)
-- in the transaction that inserts the notification, not from a sequence: a sequence hands its
-- values out before commit, so a reader could see seq n + 1 committed while n is not yet. The
-- row stays locked until its transaction ends, so seqs commit in the order they are taken; and
-- the counter only goes up, so a seq is never reused, even one whose row is gone.
CREATE TABLE notification_seq (
    only_row BOOLEAN NOT NULL PRIMARY KEY DEFAULT TRUE CHECK (only_row),
    last     BIGINT  NOT NULL CHECK (last >= 0)
);

INSERT INTO notification_seq (last) VALUES (0);

CREATE TABLE notifications (
    seq                         BIGINT NOT NULL PRIMARY KEY CHECK (seq > 0),
    session_id                  TEXT COLLATE "C" NOT NULL REFERENCES sessions (id),
    batch_id                    TEXT COLLATE "C" REFERENCES batches (id),
    agent_id                    TEXT COLLATE "C" NOT NULL REFERENCES agents (id),
    kind                        TEXT   NOT NULL CHECK (kind IN ('fork', 'typed', 'turn')),
    status                      TEXT   NOT NULL CHECK (status IN ('completed', 'failed', 'killed')),
    summary                     TEXT   NOT NULL,
    report_json                 TEXT   NOT NULL,
    input_tokens                BIGINT NOT NULL CHECK (input_tokens >= 0),
    cache_creation_input_tokens BIGINT NOT NULL CHECK (cache_creation_input_tokens >= 0),
    cache_read_input_tokens     BIGINT NOT NULL CHECK (cache_read_input_tokens >= 0),
    output_tokens               BIGINT NOT NULL CHECK (output_tokens >= 0),
    cost_usd                    DOUBLE PRECISION NOT NULL,
    created_at_ms               BIGINT NOT NULL
);

CREATE INDEX notifications_by_session ON notifications (session_id, seq);
CREATE INDEX notifications_by_batch ON notifications (batch_id, seq) WHERE batch_id IS NOT NULL;
CREATE INDEX notifications_by_agent ON notifications (agent_id, seq);
-- An agent that ends is notified once; a main loop's turns each have one.
CREATE UNIQUE INDEX notifications_once_per_agent ON notifications (agent_id) WHERE kind <> 'turn';

CREATE TABLE requests (
    id                          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    agent_id                    TEXT COLLATE "C" NOT NULL REFERENCES agents (id),
    session_id                  TEXT COLLATE "C" NOT NULL REFERENCES sessions (id),
    batch_id                    TEXT COLLATE "C" REFERENCES batches (id),
    turn                        BIGINT NOT NULL CHECK (turn >= 0),
    model                       TEXT   NOT NULL,
    input_tokens                BIGINT NOT NULL CHECK (input_tokens >= 0),
    cache_creation_input_tokens BIGINT NOT NULL CHECK (cache_creation_input_tokens >= 0),
    cache_read_input_tokens     BIGINT NOT NULL CHECK (cache_read_input_tokens >= 0),
    output_tokens               BIGINT NOT NULL CHECK (output_tokens >= 0),
    cost_usd                    DOUBLE PRECISION NOT NULL,
    prefix_fingerprint          TEXT   NOT NULL,
    body_bytes                  BIGINT NOT NULL CHECK (body_bytes >= 0),
    stop_reason                 TEXT,
    created_at_ms               BIGINT NOT NULL,
    prefix_parts                TEXT   NOT NULL DEFAULT '[]',
    message_count               BIGINT,
    first_token_ms              BIGINT CHECK (first_token_ms IS NULL OR first_token_ms >= 0)
);

CREATE INDEX requests_by_session ON requests (session_id, id);
CREATE INDEX requests_by_batch ON requests (batch_id, id) WHERE batch_id IS NOT NULL;
CREATE INDEX requests_by_agent ON requests (agent_id, id);

-- A tool call: its intent before it runs, its result after.
CREATE TABLE tool_calls (
    agent_id            TEXT COLLATE "C" NOT NULL REFERENCES agents (id),
    tool_use_id         TEXT    NOT NULL,
    name                TEXT    NOT NULL,
    input_json          TEXT    NOT NULL,
    read_only           BOOLEAN NOT NULL,
    result_json         TEXT,
    -- The whole output when the model was shown a shortened form: bytes (UTF-8 text), since a
    -- command's output may hold NUL bytes, which TEXT cannot.
    full_output         BYTEA,
    started_at_ms       BIGINT  NOT NULL,
    finished_at_ms      BIGINT,
    -- The process group a Bash call started: all three set or all NULL.
    process_pgid        BIGINT,
    process_start_ticks BIGINT,
    process_boot_id     TEXT,
    -- Insertion order, which lists calls that started in the same millisecond (SQLite's rowid).
    ord                 BIGINT  GENERATED ALWAYS AS IDENTITY,
    CHECK ((result_json IS NULL) = (finished_at_ms IS NULL)),
    PRIMARY KEY (agent_id, tool_use_id)
);

-- Idempotency keys, per tenant, written in the same transaction as what they name.
CREATE TABLE idempotency_keys (
    tenant         TEXT   NOT NULL,
    key            TEXT   NOT NULL,
    kind           TEXT   NOT NULL CHECK (kind IN ('session', 'batch', 'message')),
    request_sha256 TEXT   NOT NULL,
    resource_id    TEXT   NOT NULL,
    created_at_ms  BIGINT NOT NULL,
    PRIMARY KEY (tenant, key)
);

-- The reply a parent turn is answering, until it is stored with its results.
CREATE TABLE pending_replies (
    session_id    TEXT COLLATE "C" NOT NULL PRIMARY KEY REFERENCES sessions (id),
    agent_id      TEXT COLLATE "C" NOT NULL REFERENCES agents (id),
    reply_json    TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL
);
