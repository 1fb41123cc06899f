-- no-transaction
-- The parent turn's lifecycle (the handoff that frees the parent model).
--
-- A session's main-loop agent is `idle` between turns (it was stored as `pending`, which reads as
-- "queued to start"), and a parent turn handed to the background ends with a notification of kind
-- `turn`, so notifications gain a kind (`fork`, `typed`, `turn`) and a main-loop agent may have
-- many (one per backgrounded turn); a fork or typed agent is still notified exactly once.
--
-- SQLite cannot change a CHECK or UNIQUE constraint in place, so both tables are rebuilt, the way
-- SQLite's documentation prescribes for a table others reference: foreign keys off (outside any
-- transaction, hence `no-transaction` above), then one transaction that creates, copies, drops,
-- renames and recreates the indexes.
PRAGMA foreign_keys = OFF;

BEGIN;

CREATE TABLE agents_new (
    id                          TEXT    NOT NULL PRIMARY KEY,
    session_id                  TEXT    NOT NULL REFERENCES sessions (id),
    batch_id                    TEXT    REFERENCES batches (id),
    kind                        TEXT    NOT NULL CHECK (kind IN ('parent', 'fork', 'typed')),
    idx                         INTEGER NOT NULL CHECK (idx >= 0),
    state                       TEXT    NOT NULL
        CHECK (state IN ('pending', 'running', 'idle', 'completed', 'failed', 'killed')),
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
    generation                  INTEGER NOT NULL DEFAULT 0 CHECK (generation >= 0),
    report_to                   TEXT    NOT NULL DEFAULT 'transcript'
        CHECK (report_to IN ('transcript', 'caller')),
    CHECK ((description IS NULL) = (prompt IS NULL)),
    -- Only a main-loop agent idles; only it is never queued.
    CHECK ((state = 'idle') <= (kind = 'parent'))
) STRICT;

INSERT INTO agents_new
    SELECT id, session_id, batch_id, kind, idx,
           CASE WHEN kind = 'parent' AND state = 'pending' THEN 'idle' ELSE state END,
           description, prompt, directive_block_json, query_source, input_tokens,
           cache_creation_input_tokens, cache_read_input_tokens, output_tokens, cost_usd, error,
           created_at_ms, updated_at_ms, generation, report_to
    FROM agents;

DROP TABLE agents;
ALTER TABLE agents_new RENAME TO agents;

CREATE INDEX agents_by_session ON agents (session_id, id);
CREATE INDEX agents_by_batch ON agents (batch_id, id) WHERE batch_id IS NOT NULL;
-- Not ended: what `ps` lists and the resume scan reads.
CREATE INDEX agents_live ON agents (id) WHERE state IN ('pending', 'running', 'idle');
CREATE INDEX agents_reporting_to_caller ON agents (id) WHERE report_to = 'caller';
CREATE INDEX agents_by_kind_state ON agents (kind, state);
CREATE INDEX agents_in_batches_by_update ON agents (updated_at_ms) WHERE batch_id IS NOT NULL;

CREATE TABLE notifications_new (
    seq                         INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id                  TEXT    NOT NULL REFERENCES sessions (id),
    batch_id                    TEXT    REFERENCES batches (id),
    agent_id                    TEXT    NOT NULL REFERENCES agents (id),
    kind                        TEXT    NOT NULL CHECK (kind IN ('fork', 'typed', 'turn')),
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

INSERT INTO notifications_new
    SELECT n.seq, n.session_id, n.batch_id, n.agent_id,
           CASE a.kind WHEN 'typed' THEN 'typed' ELSE 'fork' END,
           n.status, n.summary, n.report_json, n.input_tokens, n.cache_creation_input_tokens,
           n.cache_read_input_tokens, n.output_tokens, n.cost_usd, n.created_at_ms
    FROM notifications n JOIN agents a ON a.id = n.agent_id;

-- Keep the sequence where it was: a seq is never reused, even one whose row is gone.
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'notifications_new', seq FROM sqlite_sequence WHERE name = 'notifications'
    AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'notifications_new');
UPDATE sqlite_sequence
    SET seq = MAX(seq, (SELECT seq FROM sqlite_sequence WHERE name = 'notifications'))
    WHERE name = 'notifications_new'
    AND EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'notifications');

DROP TABLE notifications;
ALTER TABLE notifications_new RENAME TO notifications;

CREATE INDEX notifications_by_session ON notifications (session_id, seq);
CREATE INDEX notifications_by_batch ON notifications (batch_id, seq) WHERE batch_id IS NOT NULL;
-- A fork or typed agent ends once and is notified once; a main loop, once per backgrounded turn.
CREATE UNIQUE INDEX notifications_once_per_agent ON notifications (agent_id) WHERE kind != 'turn';
CREATE INDEX notifications_by_agent ON notifications (agent_id, seq);

-- The parent reply a turn is answering, stored before any of its tool calls runs (a typed agent
-- started, a Bash command run) and deleted in the transaction that appends the reply with its
-- results: a turn resumed after a crash answers this same reply — same tool_use ids, so a typed
-- agent it started is found again, not started twice — instead of asking the model anew.
CREATE TABLE pending_replies (
    session_id    TEXT    NOT NULL PRIMARY KEY REFERENCES sessions (id),
    agent_id      TEXT    NOT NULL REFERENCES agents (id),
    reply_json    TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL
) STRICT;

COMMIT;

PRAGMA foreign_keys = ON;
