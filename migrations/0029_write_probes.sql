-- A row `Store::probe_write` inserts and deletes in one transaction, to learn whether the
-- database takes writes again after a fault (a full disk). Empty between probes.
CREATE TABLE write_probes (
    id INTEGER PRIMARY KEY,
    pad BLOB NOT NULL
);
