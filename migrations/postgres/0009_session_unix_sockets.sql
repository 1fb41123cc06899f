-- The `unix_sockets` grant: a session whose sandboxed commands may create Unix sockets, and with
-- them reach any pathname-socket listener the daemon's user can (seccomp cannot see a connect
-- address). Given by the operator as `full-access` is, and as strong. Sessions stored before
-- have none.
ALTER TABLE sessions ADD COLUMN unix_sockets BOOLEAN NOT NULL DEFAULT FALSE;
