-- Cache diagnostics: how many conversation messages a request carried. A session's main loop
-- sends its whole transcript, which moves on after the request; with the count, `ExplainCache`
-- rebuilds the body from the transcript's first messages. NULL for requests recorded before it
-- was kept (their explanations stop at the recorded part).
ALTER TABLE requests ADD COLUMN message_count INTEGER;
