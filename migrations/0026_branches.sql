-- Branches (docs/contracts.md, "Branches"): a session whose history is another session's
-- transcript up to a point. It stores none of that history: `branch_of` names its origin and
-- `branch_point` how many of the origin's messages it inherits (transcripts are append-only, so
-- they never change under it); its own messages start at seq `branch_point`. A branch of a
-- branch inherits through both. `branch_compacted_to` is the origin's compaction boundary in
-- force at the point when the branch was made (NULL: none): the branch sees the history the
-- origin's requests saw there, whatever the origin compacts later. `params_of` names the session
-- whose system prompt and tools the row uses (its own columns then hold ''), so a branch that
-- keeps them stores them once; NULL: its own.
ALTER TABLE sessions ADD COLUMN branch_of TEXT REFERENCES sessions (id);
ALTER TABLE sessions ADD COLUMN branch_point INTEGER
    CHECK (branch_point IS NULL OR branch_point > 0);
ALTER TABLE sessions ADD COLUMN branch_compacted_to INTEGER
    CHECK (branch_compacted_to IS NULL OR branch_compacted_to > 0);
ALTER TABLE sessions ADD COLUMN params_of TEXT REFERENCES sessions (id);

-- Sessions created from now on also mark the end of the last assistant reply in their main
-- loop's requests (a breakpoint that lets a branch read that reply from the cache); sessions
-- stored before keep the bytes their requests always had.
ALTER TABLE sessions ADD COLUMN reply_breakpoint INTEGER NOT NULL DEFAULT 0
    CHECK (reply_breakpoint IN (0, 1));

CREATE INDEX sessions_by_origin ON sessions (branch_of, id) WHERE branch_of IS NOT NULL;

-- The user's message of each parent turn: turn K is the K-th such message of a transcript (its
-- origin's included, for a branch). Every other message (the first, tool results, notes) is 0.
ALTER TABLE session_messages ADD COLUMN starts_turn INTEGER NOT NULL DEFAULT 0
    CHECK (starts_turn IN (0, 1));

-- Messages stored before: a user message after the first is a turn's unless it holds tool
-- results or is one of forkd's notes, which begin with their tags.
UPDATE session_messages SET starts_turn = 1
WHERE seq > 0 AND role = 'user'
  AND content_json NOT LIKE '%"type":"tool_result"%'
  AND content_json NOT LIKE '[{"type":"text","text":"<batch-launched>%'
  AND content_json NOT LIKE '[{"type":"text","text":"<batch-notification>%'
  AND content_json NOT LIKE '[{"type":"text","text":"<task-notification>%';
