-- A session's allow and deny rules (`Bash(cargo test:*)`, `Write(src/**)`), as JSON arrays of
-- rule strings. Checked when the session is created; every agent of the session obeys them.
ALTER TABLE sessions ADD COLUMN allow_rules TEXT NOT NULL DEFAULT '[]';
ALTER TABLE sessions ADD COLUMN deny_rules TEXT NOT NULL DEFAULT '[]';
