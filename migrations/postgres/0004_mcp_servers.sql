-- A session's MCP servers and the tools it got from them, fixed at creation (the tools'
-- definitions are in tools_json): JSON `{"servers": [{"name", "origin"}], "tools": [{"name",
-- "server", "tool", "read_only"}]}`. Names only: a server's definition (which may hold secrets)
-- is the operator's mcp.json, or the daemon's memory for a session's own. Sessions stored before
-- have none.
ALTER TABLE sessions ADD COLUMN mcp_json TEXT NOT NULL DEFAULT '{"servers":[],"tools":[]}';
