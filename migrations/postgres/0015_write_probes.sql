-- A row `Store::probe_write` inserts and deletes in one transaction, to learn whether the
-- database takes writes again after a fault (a full disk, a restart). Empty between probes.
-- Stored uncompressed, so the probe takes the space it claims to.
CREATE TABLE write_probes (
    id BIGSERIAL PRIMARY KEY,
    pad BYTEA NOT NULL
);
ALTER TABLE write_probes ALTER COLUMN pad SET STORAGE EXTERNAL;
