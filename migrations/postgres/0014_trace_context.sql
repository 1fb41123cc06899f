-- Traces: see ../0028_trace_context.sql.
ALTER TABLE batches ADD COLUMN trace_parent TEXT;
ALTER TABLE sessions ADD COLUMN trace_parent TEXT;
