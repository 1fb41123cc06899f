-- Compaction boundaries of sessions' transcripts (SQLite migration 0016): a boundary sits right
-- before the assistant message at `to_seq`; later requests are the system prompt, the summary
-- (the exact content bytes sent) and the transcript from `to_seq` on. `from_seq` is where the
-- range it newly replaces begins. Nothing of the transcript is deleted.
CREATE TABLE compactions (
    session_id    TEXT COLLATE "C" NOT NULL REFERENCES sessions (id),
    to_seq        BIGINT NOT NULL CHECK (to_seq > 0),
    from_seq      BIGINT NOT NULL CHECK (from_seq >= 0 AND from_seq < to_seq),
    summary_json  TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, to_seq),
    FOREIGN KEY (session_id, to_seq) REFERENCES session_messages (session_id, seq)
);

-- The compaction boundary a batch's fork point was taken after; NULL: the transcript from its
-- start.
ALTER TABLE batches ADD COLUMN compacted_to BIGINT CHECK (compacted_to IS NULL OR compacted_to > 0);
