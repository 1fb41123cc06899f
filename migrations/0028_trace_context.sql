-- Traces (docs/operations.md, "Tracing"): the W3C trace context (`traceparent`) of the span that
-- forked a batch, so its children's spans stay in that trace when they are resumed after a
-- restart or adopted by another daemon. NULL when traces were off.
ALTER TABLE batches ADD COLUMN trace_parent TEXT;
-- The same for a session's latest turn: a turn a daemon resumes goes on in its trace.
ALTER TABLE sessions ADD COLUMN trace_parent TEXT;
