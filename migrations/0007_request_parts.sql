-- Cache diagnostics: each request's prefix (everything before the agent's own first block) cut
-- into its parts (the request head, tools, system, each message block), each with its label, its
-- byte offset in the body and a short digest, as a compact JSON array. Two requests that should
-- share a prefix but do not are told apart by the first part whose digest differs.
ALTER TABLE requests ADD COLUMN prefix_parts TEXT NOT NULL DEFAULT '[]';
