-- Uploaded workspaces. A blob is a file's content, kept per tenant under its SHA-256: what one
-- tenant has never tells another anything. An upload is a tree (its manifest, JSON) whose every
-- blob its tenant has; it is stored only once they all are, so a tree is never partial.
CREATE TABLE blobs (
    tenant        TEXT   NOT NULL,
    sha256        TEXT   NOT NULL,
    size          BIGINT NOT NULL CHECK (size >= 0),
    content       BYTEA  NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, sha256)
);

CREATE TABLE uploads (
    id            TEXT   NOT NULL PRIMARY KEY,
    tenant        TEXT   NOT NULL,
    manifest_json TEXT   NOT NULL,
    files         BIGINT NOT NULL CHECK (files >= 0),
    bytes         BIGINT NOT NULL CHECK (bytes >= 0),
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX uploads_by_tenant ON uploads (tenant, created_at_ms);
