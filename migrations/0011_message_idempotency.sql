-- SendMessage takes an idempotency key too (kind `message`): its resource is the user message it
-- stored, as `SESSION_ID/SEQ`, written in the same transaction as that message, so a client that
-- retries after UNAVAILABLE never stores its message twice. SQLite cannot change a CHECK
-- constraint in place: the table is rebuilt with the wider one.
CREATE TABLE idempotency_keys_new (
    tenant         TEXT    NOT NULL,
    key            TEXT    NOT NULL,
    kind           TEXT    NOT NULL CHECK (kind IN ('session', 'batch', 'message')),
    request_sha256 TEXT    NOT NULL,
    resource_id    TEXT    NOT NULL,
    created_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
) STRICT;

INSERT INTO idempotency_keys_new (tenant, key, kind, request_sha256, resource_id, created_at_ms)
    SELECT tenant, key, kind, request_sha256, resource_id, created_at_ms FROM idempotency_keys;

DROP TABLE idempotency_keys;

ALTER TABLE idempotency_keys_new RENAME TO idempotency_keys;
