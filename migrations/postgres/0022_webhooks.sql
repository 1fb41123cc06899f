-- Webhooks (docs/operations.md, "Webhooks and schedules"): the tables as in the SQLite schema's
-- 0036_webhooks.sql, which says what each column holds.
CREATE TABLE webhooks (
    id                      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    tenant                  TEXT    NOT NULL,
    url                     TEXT    NOT NULL,
    kinds                   TEXT    NOT NULL DEFAULT '',
    session_id              TEXT,
    named_only              BOOLEAN NOT NULL DEFAULT FALSE,
    secret_sealed           TEXT    NOT NULL,
    previous_secret_sealed  TEXT,
    previous_secret_until_ms BIGINT,
    created_at_ms           BIGINT NOT NULL,
    failing_since_ms        BIGINT,
    disabled_at_ms          BIGINT,
    disabled_reason         TEXT
);

CREATE INDEX webhooks_by_tenant ON webhooks (tenant, created_at_ms);

CREATE TABLE webhook_deliveries (
    id                      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    webhook_id              TEXT    NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event                   TEXT    NOT NULL CHECK (event IN ('notification', 'ping')),
    notification_seq        BIGINT,
    state                   TEXT    NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts                BIGINT NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    created_at_ms           BIGINT NOT NULL,
    next_attempt_at_ms      BIGINT NOT NULL,
    claimed_by              TEXT,
    claim_until_ms          BIGINT,
    CHECK ((event = 'notification') = (notification_seq IS NOT NULL))
);

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at_ms)
    WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook_id);
-- A notification is delivered to a webhook once (its retries are attempts of one delivery).
CREATE UNIQUE INDEX webhook_deliveries_once ON webhook_deliveries (webhook_id, notification_seq)
    WHERE notification_seq IS NOT NULL;

CREATE TABLE webhook_attempts (
    delivery_id             TEXT    NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    number                  BIGINT NOT NULL CHECK (number > 0),
    webhook_id              TEXT    NOT NULL,
    at_ms                   BIGINT NOT NULL,
    status                  BIGINT,
    error                   TEXT,
    latency_ms              BIGINT NOT NULL CHECK (latency_ms >= 0),
    PRIMARY KEY (delivery_id, number)
);

CREATE INDEX webhook_attempts_by_webhook ON webhook_attempts (webhook_id, at_ms);

ALTER TABLE batches ADD COLUMN webhook_id TEXT;
