-- Output schemas: see ../0027_output_schemas.sql.
ALTER TABLE batches ADD COLUMN output_schema TEXT;
ALTER TABLE agent_params ADD COLUMN output_schema TEXT;
