-- A session's sandbox: what its Bash commands may touch. `workspace-write` (writes only in the
-- workspace and a private temporary directory; the daemon's home, other sessions' workspaces and
-- a deny list hidden), `read-only` (writes only in the private temporary directory) or
-- `full-access` (no sandbox). `allow_network`: the commands may use the network. Sessions stored
-- before get the default, `workspace-write` without network: a daemon upgraded in place confines
-- what it used to leave open.
ALTER TABLE sessions ADD COLUMN sandbox TEXT NOT NULL DEFAULT 'workspace-write'
    CHECK (sandbox IN ('workspace-write', 'read-only', 'full-access'));
ALTER TABLE sessions ADD COLUMN allow_network INTEGER NOT NULL DEFAULT 0
    CHECK (allow_network IN (0, 1));
