-- When a model request was first sent (its record is made when the response ends): a batch's
-- timeline shows each child's request from its start, so warm-up gating is visible. NULL for
-- records made before it was kept.
ALTER TABLE requests ADD COLUMN sent_at_ms INTEGER;
