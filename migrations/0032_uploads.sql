-- Uploaded workspaces. A blob is a file's content, kept per tenant under its SHA-256: what one
-- tenant has never tells another anything. An upload is a tree (its manifest, JSON) whose every
-- blob its tenant has; it is stored only once they all are, so a tree is never partial.
CREATE TABLE blobs (
    tenant        TEXT    NOT NULL,
    sha256        TEXT    NOT NULL,
    size          INTEGER NOT NULL CHECK (size >= 0),
    content       BLOB    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, sha256)
) STRICT;

CREATE TABLE uploads (
    id            TEXT    NOT NULL PRIMARY KEY,
    tenant        TEXT    NOT NULL,
    manifest_json TEXT    NOT NULL,
    files         INTEGER NOT NULL CHECK (files >= 0),
    bytes         INTEGER NOT NULL CHECK (bytes >= 0),
    created_at_ms INTEGER NOT NULL
) STRICT;
CREATE INDEX uploads_by_tenant ON uploads (tenant, created_at_ms);
