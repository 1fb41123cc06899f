-- Schedules (docs/operations.md, "Webhooks and schedules"): a tenant's batches on a clock.
--
-- - `schedules.spec`: the session and batch each firing creates, as the server encoded them
--   (the wire's requests, protobuf).
-- - `upload_id`: the upload the spec's session starts from, if any: kept while a schedule names
--   it (uploads otherwise expire with `[isolation] retention`).
-- - `next_fire_at_ms`: the next firing due (NULL when the expression has no future time); a
--   daemon that claims a firing moves it on in the same transaction, so two daemons never both
--   claim one.
-- - `schedule_firings`: one row per firing (its key's time), claimed by a daemon until
--   `claim_until_ms` while `state = 'firing'`; a firing whose claim lapsed is fired again under
--   the same idempotency key, so it forks once.
CREATE TABLE schedules (
    tenant           TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    cron             TEXT    NOT NULL,
    timezone         TEXT    NOT NULL,
    overlap          TEXT    NOT NULL CHECK (overlap IN ('skip', 'allow')),
    catch_up         TEXT    NOT NULL CHECK (catch_up IN ('once', 'none')),
    paused           INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    spec             BLOB    NOT NULL,
    created_at_ms    INTEGER NOT NULL,
    next_fire_at_ms  INTEGER,
    upload_id        TEXT,
    PRIMARY KEY (tenant, name)
) STRICT;

CREATE INDEX schedules_due ON schedules (next_fire_at_ms) WHERE NOT paused;

CREATE TABLE schedule_firings (
    tenant           TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    fire_at_ms       INTEGER NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('firing', 'fired', 'skipped', 'failed')),
    manual           INTEGER NOT NULL DEFAULT 0 CHECK (manual IN (0, 1)),
    session_id       TEXT,
    batch_id         TEXT,
    reason           TEXT,
    at_ms            INTEGER NOT NULL,
    claimed_by       TEXT,
    claim_until_ms   INTEGER,
    PRIMARY KEY (tenant, name, fire_at_ms)
) STRICT;

CREATE INDEX schedule_firings_open ON schedule_firings (claim_until_ms) WHERE state = 'firing';

-- The schedule a batch was forked by, and each of its notifications' copy of it (webhooks and
-- subscribers see which schedule a notification comes from).
ALTER TABLE batches ADD COLUMN schedule TEXT;
ALTER TABLE notifications ADD COLUMN schedule TEXT;
