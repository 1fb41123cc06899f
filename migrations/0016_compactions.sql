-- Compaction boundaries of sessions' transcripts. A boundary sits right before the assistant
-- message at `to_seq`: later requests are the system prompt, the summary (a user message, stored
-- here as the exact content bytes sent) and the transcript from `to_seq` on. `from_seq` is where
-- the range it newly replaces begins (the previous boundary's `to_seq`, or 0). Nothing of the
-- transcript is deleted; the boundary is written in one transaction, so a crash leaves either no
-- boundary or the whole of it.
CREATE TABLE compactions (
    session_id    TEXT    NOT NULL REFERENCES sessions (id),
    to_seq        INTEGER NOT NULL CHECK (to_seq > 0),
    from_seq      INTEGER NOT NULL CHECK (from_seq >= 0 AND from_seq < to_seq),
    summary_json  TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (session_id, to_seq),
    FOREIGN KEY (session_id, to_seq) REFERENCES session_messages (session_id, seq)
) STRICT;

-- The compaction boundary a batch's fork point was taken after: its children's history is that
-- compaction's summary and the messages from there to the fork point, as the parent's requests
-- saw it. NULL: the transcript from its start (every batch stored before).
ALTER TABLE batches ADD COLUMN compacted_to INTEGER CHECK (compacted_to IS NULL OR compacted_to > 0);
