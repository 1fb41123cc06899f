-- Output schemas (docs/contracts.md, "Output schemas"): the JSON Schema a batch's children, or a
-- typed agent, end with an object valid against, as compact JSON; NULL for none. A batch's schema
-- block is also among its shared user blocks (the bytes its children were sent); the column is
-- what their final replies are checked against.
ALTER TABLE batches ADD COLUMN output_schema TEXT;
ALTER TABLE agent_params ADD COLUMN output_schema TEXT;
