-- Webhooks (docs/operations.md, "Webhooks and schedules"): a tenant's endpoints, the outbox of
-- deliveries the store writes in each notification's own transaction, and every attempt.
--
-- - `webhooks.kinds`: the notification kinds it receives, comma-separated ('' for all);
--   `session_id` narrows it to one session; `named_only` to the batches that name it.
-- - `secret_sealed` / `previous_secret_sealed`: signing secrets sealed with the daemon's secret
--   key (never in the clear); the previous one signs too until `previous_secret_until_ms`.
-- - `failing_since_ms`: the start of its current run of failures; `disabled_*` once that run
--   lasted longer than the daemon allows.
-- - `webhook_deliveries`: one event for one webhook. Its id is the `webhook-id` header of every
--   attempt. `claimed_by`/`claim_until_ms`: the daemon attempting it now, until when (on the
--   database's clock): no other daemon attempts it meanwhile.
-- - `batches.webhook_id`: the webhook a batch named, which receives its notifications whatever
--   its own filter says.
CREATE TABLE webhooks (
    id                      TEXT    NOT NULL PRIMARY KEY,
    tenant                  TEXT    NOT NULL,
    url                     TEXT    NOT NULL,
    kinds                   TEXT    NOT NULL DEFAULT '',
    session_id              TEXT,
    named_only              INTEGER NOT NULL DEFAULT 0 CHECK (named_only IN (0, 1)),
    secret_sealed           TEXT    NOT NULL,
    previous_secret_sealed  TEXT,
    previous_secret_until_ms INTEGER,
    created_at_ms           INTEGER NOT NULL,
    failing_since_ms        INTEGER,
    disabled_at_ms          INTEGER,
    disabled_reason         TEXT
) STRICT;

CREATE INDEX webhooks_by_tenant ON webhooks (tenant, created_at_ms);

CREATE TABLE webhook_deliveries (
    id                      TEXT    NOT NULL PRIMARY KEY,
    webhook_id              TEXT    NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event                   TEXT    NOT NULL CHECK (event IN ('notification', 'ping')),
    notification_seq        INTEGER,
    state                   TEXT    NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts                INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    created_at_ms           INTEGER NOT NULL,
    next_attempt_at_ms      INTEGER NOT NULL,
    claimed_by              TEXT,
    claim_until_ms          INTEGER,
    CHECK ((event = 'notification') = (notification_seq IS NOT NULL))
) STRICT;

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at_ms)
    WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook_id);
-- A notification is delivered to a webhook once (its retries are attempts of one delivery).
CREATE UNIQUE INDEX webhook_deliveries_once ON webhook_deliveries (webhook_id, notification_seq)
    WHERE notification_seq IS NOT NULL;

CREATE TABLE webhook_attempts (
    delivery_id             TEXT    NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    number                  INTEGER NOT NULL CHECK (number > 0),
    webhook_id              TEXT    NOT NULL,
    at_ms                   INTEGER NOT NULL,
    status                  INTEGER,
    error                   TEXT,
    latency_ms              INTEGER NOT NULL CHECK (latency_ms >= 0),
    PRIMARY KEY (delivery_id, number)
) STRICT;

CREATE INDEX webhook_attempts_by_webhook ON webhook_attempts (webhook_id, at_ms);

ALTER TABLE batches ADD COLUMN webhook_id TEXT;
