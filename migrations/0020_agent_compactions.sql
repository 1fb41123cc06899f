-- Compaction boundaries of agents' own transcripts: a fork child's part after its fork point, a
-- typed agent's after its prompt. A boundary sits right before the agent's own assistant
-- message at `to_seq`: later requests keep the agent's first message (a child's fork message,
-- a typed agent's prompt) with the summary's blocks after its own, then the agent's messages
-- from `to_seq` on. `from_seq` is where the range it newly replaces begins (the previous
-- boundary's `to_seq`, or 0). Nothing is deleted; a boundary is written in one transaction.
-- A session's main loop keeps its boundaries in `compactions`.
CREATE TABLE agent_compactions (
    agent_id      TEXT    NOT NULL REFERENCES agents (id),
    to_seq        INTEGER NOT NULL CHECK (to_seq > 0),
    from_seq      INTEGER NOT NULL CHECK (from_seq >= 0 AND from_seq < to_seq),
    summary_json  TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (agent_id, to_seq),
    FOREIGN KEY (agent_id, to_seq) REFERENCES agent_messages (agent_id, seq)
) STRICT;
