-- Tenants: every session belongs to one (the bearer token's tenant; `local` for the Unix socket's
-- owner). Agents, batches, transcripts and notifications belong to their session's tenant.
ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT 'local';

CREATE INDEX sessions_by_tenant ON sessions (tenant, id);

-- Idempotency keys, per tenant. A key names the first call made with it: what kind of call
-- (`session` or `batch`), a digest of its parameters, and what it created. The row is written in
-- the same transaction as the session or batch, so a key never points at nothing and nothing is
-- created twice under one key, across restarts and across daemons sharing the database.
CREATE TABLE idempotency_keys (
    tenant         TEXT    NOT NULL,
    key            TEXT    NOT NULL,
    kind           TEXT    NOT NULL CHECK (kind IN ('session', 'batch')),
    request_sha256 TEXT    NOT NULL,
    resource_id    TEXT    NOT NULL,
    created_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
) STRICT;

-- Budgets of a fork batch: a child that would start a request once the batch has spent this
-- much ends `failed`. NULL for none.
ALTER TABLE batches ADD COLUMN budget_usd REAL CHECK (budget_usd IS NULL OR budget_usd > 0);
ALTER TABLE batches ADD COLUMN budget_tokens INTEGER CHECK (budget_tokens IS NULL OR budget_tokens > 0);
