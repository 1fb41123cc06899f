-- Schedules (docs/operations.md, "Webhooks and schedules"): the tables as in the SQLite schema's
-- 0037_schedules.sql, which says what each column holds.
CREATE TABLE schedules (
    tenant           TEXT COLLATE "C" NOT NULL,
    name             TEXT COLLATE "C" NOT NULL,
    cron             TEXT    NOT NULL,
    timezone         TEXT    NOT NULL,
    overlap          TEXT    NOT NULL CHECK (overlap IN ('skip', 'allow')),
    catch_up         TEXT    NOT NULL CHECK (catch_up IN ('once', 'none')),
    paused           BOOLEAN NOT NULL DEFAULT FALSE,
    spec             BYTEA   NOT NULL,
    created_at_ms    BIGINT NOT NULL,
    next_fire_at_ms  BIGINT,
    upload_id        TEXT,
    PRIMARY KEY (tenant, name)
);

CREATE INDEX schedules_due ON schedules (next_fire_at_ms) WHERE NOT paused;

CREATE TABLE schedule_firings (
    tenant           TEXT COLLATE "C" NOT NULL,
    name             TEXT COLLATE "C" NOT NULL,
    fire_at_ms       BIGINT NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('firing', 'fired', 'skipped', 'failed')),
    manual           BOOLEAN NOT NULL DEFAULT FALSE,
    session_id       TEXT,
    batch_id         TEXT,
    reason           TEXT,
    at_ms            BIGINT NOT NULL,
    claimed_by       TEXT,
    claim_until_ms   BIGINT,
    PRIMARY KEY (tenant, name, fire_at_ms)
);

CREATE INDEX schedule_firings_open ON schedule_firings (claim_until_ms) WHERE state = 'firing';

-- The schedule a batch was forked by, and each of its notifications' copy of it (webhooks and
-- subscribers see which schedule a notification comes from).
ALTER TABLE batches ADD COLUMN schedule TEXT;
ALTER TABLE notifications ADD COLUMN schedule TEXT;
