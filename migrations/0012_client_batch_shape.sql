-- A client's batch takes a per-child shape: its children inherit the parent's history and read the
-- boilerplate and their own directive, with no fork message invented for them (so a child's request
-- does not grow with its siblings, and thinking sessions get no assistant message without a
-- thinking block). `model`: a model's reply forked, `assistant_json` is that reply (the seed's
-- shape, and every batch stored before this migration). `client`: no fork message;
-- `assistant_json` is an empty content array. A client batch's children's reports reach its
-- parent's transcript as one digest, in the transaction that ends its last child.
ALTER TABLE batches ADD COLUMN shape TEXT NOT NULL DEFAULT 'model'
    CHECK (shape IN ('model', 'client'));
