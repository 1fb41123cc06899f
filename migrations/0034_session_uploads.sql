-- Where an uploaded session's files came from: its upload and what the tree was (kept with the
-- session, so it is still shown once the upload itself has expired).
CREATE TABLE session_uploads (
    session_id TEXT    NOT NULL PRIMARY KEY REFERENCES sessions (id),
    upload_id  TEXT    NOT NULL,
    files      INTEGER NOT NULL,
    bytes      INTEGER NOT NULL,
    git_commit TEXT
) STRICT;
