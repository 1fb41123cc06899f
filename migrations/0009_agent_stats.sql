-- The metrics endpoint counts agents by kind and state on every scrape, and lists the fork
-- batches that still run or ended recently: both read these indexes instead of every agent row.
CREATE INDEX agents_by_kind_state ON agents (kind, state);
CREATE INDEX agents_in_batches_by_update ON agents (updated_at_ms) WHERE batch_id IS NOT NULL;
