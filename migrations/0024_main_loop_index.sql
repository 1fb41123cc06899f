-- A session's main-loop agent (its parent), found by the session on every turn without reading
-- the session's other agents.
CREATE INDEX agents_main_loop ON agents (session_id, id) WHERE kind = 'parent';
