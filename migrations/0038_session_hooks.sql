-- A session's own hooks (docs/contracts.md, "Hooks"): the `hooks` block of a `settings.json`
-- its client sent, sealed with the daemon's secret key for the session, and the events it is
-- for, as JSON (`SessionHooks`); NULL for a session without hooks of its own.
ALTER TABLE sessions ADD COLUMN hooks_json TEXT;
