-- Compaction boundaries of agents' own transcripts (SQLite migration 0020): a fork child's part
-- after its fork point, a typed agent's after its prompt. A boundary sits right before the
-- agent's own assistant message at `to_seq`; later requests keep the agent's first message
-- with the summary's blocks after its own, then its messages from `to_seq` on. Nothing is
-- deleted. A session's main loop keeps its boundaries in `compactions`.
CREATE TABLE agent_compactions (
    agent_id      TEXT COLLATE "C" NOT NULL REFERENCES agents (id),
    to_seq        BIGINT NOT NULL CHECK (to_seq > 0),
    from_seq      BIGINT NOT NULL CHECK (from_seq >= 0 AND from_seq < to_seq),
    summary_json  TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (agent_id, to_seq),
    FOREIGN KEY (agent_id, to_seq) REFERENCES agent_messages (agent_id, seq)
);
