-- Leases: a run of an agent claims it by incrementing `generation`, and every write the run makes
-- afterwards checks that the generation is still its own. A second run of the same agent (a
-- handoff, a resume, a second daemon on the same database) thus fences the first: the older run's
-- next write is refused instead of interleaving with the newer run's transcript.
ALTER TABLE agents ADD COLUMN generation INTEGER NOT NULL DEFAULT 0 CHECK (generation >= 0);

-- Where an agent's report goes when it ends: 'transcript' appends its <task-notification> to the
-- parent's transcript; 'caller' means a parent turn waits for it and carries the report in the
-- calling tool_use's result. A turn that never stores that result hands the report back to the
-- transcript ('caller' -> 'transcript', appending the notification if the agent already ended).
ALTER TABLE agents ADD COLUMN report_to TEXT NOT NULL DEFAULT 'transcript'
    CHECK (report_to IN ('transcript', 'caller'));

CREATE INDEX agents_reporting_to_caller ON agents (id) WHERE report_to = 'caller';
