-- Which blobs each upload names, so that a blob no upload names any more can be found and
-- removed (an interrupted upload's, or an expired upload's), and uploads by age.
CREATE TABLE upload_blobs (
    upload_id TEXT NOT NULL REFERENCES uploads (id) ON DELETE CASCADE,
    tenant    TEXT NOT NULL,
    sha256    TEXT NOT NULL,
    PRIMARY KEY (upload_id, sha256)
) STRICT;
CREATE INDEX upload_blobs_by_blob ON upload_blobs (tenant, sha256);
