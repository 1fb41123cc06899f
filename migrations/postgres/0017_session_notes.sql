-- A note forkd appended to a session's transcript for its model (a task notification, a client
-- batch's launch note or digest, a branch's report) is marked as forkd's, so a view draws it as
-- forkd's by this mark and never by its text: a message whose text merely begins with one of
-- these tags (a model's fork prompt, a user's message) is drawn as the text it is.
ALTER TABLE session_messages ADD COLUMN note BOOLEAN NOT NULL DEFAULT FALSE;

-- Messages stored before: forkd's notes are the user messages that begin no turn and begin
-- with one of its tags (a turn's own message is never one, whatever its text).
UPDATE session_messages SET note = TRUE
WHERE seq > 0 AND role = 'user' AND NOT starts_turn
  AND (content_json LIKE '[{"type":"text","text":"<batch-launched>%'
    OR content_json LIKE '[{"type":"text","text":"<batch-notification>%'
    OR content_json LIKE '[{"type":"text","text":"<task-notification>%'
    OR content_json LIKE '[{"type":"text","text":"<branch-report>%');
