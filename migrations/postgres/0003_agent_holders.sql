-- Leases between daemons. A run's claim also makes its daemon the agent's holder until
-- `lease_expires_at_ms` (on the database's clock), which the daemon pushes back by heartbeat;
-- while it has not passed, no other daemon may claim the running agent. Once it has (the holder
-- died), any daemon may adopt the agent.
ALTER TABLE agents ADD COLUMN held_by TEXT;
ALTER TABLE agents ADD COLUMN lease_expires_at_ms BIGINT;
-- A kill asked through a daemon that does not hold the agent: its holder finds it at its next
-- heartbeat, and any later claim sees it.
ALTER TABLE agents ADD COLUMN kill_requested BOOLEAN NOT NULL DEFAULT FALSE;

CREATE INDEX agents_held ON agents (held_by) WHERE state IN ('pending', 'running');

-- When a batch's warm-up gate opened (its first child's response started, or the batch was not
-- gated): from then on any daemon with free slots may take its pending children.
ALTER TABLE batches ADD COLUMN gate_opened_at_ms BIGINT;

CREATE INDEX agents_pending ON agents (batch_id, idx) WHERE state = 'pending';
