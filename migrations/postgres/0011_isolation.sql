-- Isolated children (docs/contracts.md, "Isolation"). A batch forked with `isolation: copy`
-- has a snapshot of its session's workspace: the copy its children's layers lie over, on the
-- machine of the daemon that forked it, and for a git workspace the commit kept by a ref.
-- `agents_json`: the children that work in copies (a model's batch may isolate some of its
-- calls only); NULL for all of them.
CREATE TABLE batch_snapshots (
    batch_id TEXT PRIMARY KEY,
    dir TEXT NOT NULL,
    agents_json TEXT,
    git_ref TEXT,
    git_commit TEXT,
    files BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    took_ms BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL
);

-- What each isolated child changed, read from its layer when it ended: the files (JSON), the
-- unified diff, and where its copy stands (kept, applied, conflicted, discarded).
CREATE TABLE agent_changes (
    agent_id TEXT PRIMARY KEY,
    batch_id TEXT NOT NULL,
    files_json TEXT NOT NULL,
    diff TEXT NOT NULL,
    outside_possible BOOLEAN NOT NULL DEFAULT FALSE,
    state TEXT NOT NULL,
    conflicts_json TEXT NOT NULL DEFAULT '[]',
    updated_at_ms BIGINT NOT NULL
);
CREATE INDEX agent_changes_batch ON agent_changes (batch_id);
