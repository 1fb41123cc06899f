-- no-transaction
-- Limits on a child's run (docs/contracts.md, "Limits"): an agent may end `timed_out`, its
-- limits are stored with it, and the clock of its wall-time limit counts from a stored start.
--
-- - `limits_json`: the limits the agent runs under, resolved when it was created (its own, its
--   batch's, its tenant's and the daemon's defaults); NULL for an agent created before limits
--   existed, which runs under the daemon's defaults.
-- - `started_at_ms`: when a run first claimed it (not its creation: time queued for a slot is
--   not run time); kept across restarts.
-- - `throttled_ms`: time its requests waited out the provider's limits, summed as each wait ends
--   (a `timeout` may exclude it).
--
-- SQLite cannot change a CHECK constraint in place, so `agents` and `notifications` are rebuilt
-- as 0014 rebuilt them: foreign keys off (outside any transaction, hence `no-transaction`
-- above), then one transaction that creates, copies, drops, renames and recreates the indexes.
PRAGMA foreign_keys = OFF;

BEGIN;

CREATE TABLE agents_new (
    id                          TEXT    NOT NULL PRIMARY KEY,
    session_id                  TEXT    NOT NULL REFERENCES sessions (id),
    batch_id                    TEXT    REFERENCES batches (id),
    kind                        TEXT    NOT NULL CHECK (kind IN ('parent', 'fork', 'typed')),
    idx                         INTEGER NOT NULL CHECK (idx >= 0),
    state                       TEXT    NOT NULL
        CHECK (state IN ('pending', 'running', 'idle', 'completed', 'failed', 'killed',
                         'timed_out')),
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
    held_by                     TEXT,
    lease_expires_at_ms         INTEGER,
    kill_requested              INTEGER NOT NULL DEFAULT 0 CHECK (kill_requested IN (0, 1)),
    throttled_since_ms          INTEGER,
    limits_json                 TEXT,
    started_at_ms               INTEGER,
    throttled_ms                INTEGER NOT NULL DEFAULT 0 CHECK (throttled_ms >= 0),
    CHECK ((description IS NULL) = (prompt IS NULL)),
    -- Only a main-loop agent idles; only it is never queued.
    CHECK ((state = 'idle') <= (kind = 'parent'))
) STRICT;

INSERT INTO agents_new (
    id, session_id, batch_id, kind, idx, state, description, prompt, directive_block_json,
    query_source, input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
    output_tokens, cost_usd, error, created_at_ms, updated_at_ms, generation, report_to,
    held_by, lease_expires_at_ms, kill_requested, throttled_since_ms)
    SELECT id, session_id, batch_id, kind, idx, state, description, prompt, directive_block_json,
           query_source, input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
           output_tokens, cost_usd, error, created_at_ms, updated_at_ms, generation, report_to,
           held_by, lease_expires_at_ms, kill_requested, throttled_since_ms
    FROM agents;

DROP TABLE agents;
ALTER TABLE agents_new RENAME TO agents;

CREATE INDEX agents_by_session ON agents (session_id, id);
CREATE INDEX agents_by_batch ON agents (batch_id, id) WHERE batch_id IS NOT NULL;
CREATE INDEX agents_live ON agents (id) WHERE state IN ('pending', 'running', 'idle');
CREATE INDEX agents_reporting_to_caller ON agents (id) WHERE report_to = 'caller';
CREATE INDEX agents_by_kind_state ON agents (kind, state);
CREATE INDEX agents_in_batches_by_update ON agents (updated_at_ms) WHERE batch_id IS NOT NULL;
CREATE INDEX agents_held ON agents (held_by) WHERE state IN ('pending', 'running');
CREATE INDEX agents_pending ON agents (batch_id, idx) WHERE state = 'pending';
CREATE INDEX agents_main_loop ON agents (session_id, id) WHERE kind = 'parent';

CREATE TABLE notifications_new (
    seq                         INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id                  TEXT    NOT NULL REFERENCES sessions (id),
    batch_id                    TEXT    REFERENCES batches (id),
    agent_id                    TEXT    NOT NULL REFERENCES agents (id),
    kind                        TEXT    NOT NULL CHECK (kind IN ('fork', 'typed', 'turn')),
    status                      TEXT    NOT NULL
        CHECK (status IN ('completed', 'failed', 'killed', 'timed_out')),
    summary                     TEXT    NOT NULL,
    report_json                 TEXT    NOT NULL,
    input_tokens                INTEGER NOT NULL CHECK (input_tokens >= 0),
    cache_creation_input_tokens INTEGER NOT NULL CHECK (cache_creation_input_tokens >= 0),
    cache_read_input_tokens     INTEGER NOT NULL CHECK (cache_read_input_tokens >= 0),
    output_tokens               INTEGER NOT NULL CHECK (output_tokens >= 0),
    cost_usd                    REAL    NOT NULL,
    created_at_ms               INTEGER NOT NULL,
    tenant                      TEXT,
    tenant_seq                  INTEGER
) STRICT;

INSERT INTO notifications_new (
    seq, session_id, batch_id, agent_id, kind, status, summary, report_json, input_tokens,
    cache_creation_input_tokens, cache_read_input_tokens, output_tokens, cost_usd,
    created_at_ms, tenant, tenant_seq)
    SELECT seq, session_id, batch_id, agent_id, kind, status, summary, report_json, input_tokens,
           cache_creation_input_tokens, cache_read_input_tokens, output_tokens, cost_usd,
           created_at_ms, tenant, tenant_seq
    FROM notifications;

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
CREATE UNIQUE INDEX notifications_by_tenant ON notifications (tenant, tenant_seq);

COMMIT;

PRAGMA foreign_keys = ON;
