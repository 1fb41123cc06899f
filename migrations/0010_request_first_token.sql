-- Time to first token of each model request, in milliseconds from the request being sent
-- (retries included) to the response's first content block; NULL for records made before it
-- was kept, or for a response that never started a block.
ALTER TABLE requests ADD COLUMN first_token_ms INTEGER CHECK (first_token_ms IS NULL OR first_token_ms >= 0);
