-- When the agent's model request was first refused by the provider's limits (a 429, 529 or
-- 503 it is waiting out), while it waits; NULL otherwise. Shown by `ps`, `top` and the web view
-- on every daemon sharing the database. A batch whose first child is throttled under a live
-- lease keeps its warm-up gate shut past the gate's timeout: its siblings would miss the cache.
ALTER TABLE agents ADD COLUMN throttled_since_ms INTEGER;
