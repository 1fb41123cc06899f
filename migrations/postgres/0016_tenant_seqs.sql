-- A tenant's cursor is its own: each notification also gets its tenant's own number
-- (`tenant_seq`: 1, 2, 3… for a new tenant), which clients see as `seq` and resume from, so a
-- tenant's numbers say nothing of how busy the others are. `seq` stays the daemons' order.
--
-- The notifications stored before keep their numbers as their tenant's (tenant_seq = seq), and
-- each tenant that has any continues above the last number given out so far: a cursor a
-- client kept from before never skips a notification. A tenant's counter row is locked after
-- `notification_seq`'s, in the same transaction (postgres.rs's lock order).
ALTER TABLE notifications ADD COLUMN tenant TEXT;
ALTER TABLE notifications ADD COLUMN tenant_seq BIGINT;
UPDATE notifications n
    SET tenant = s.tenant, tenant_seq = n.seq
    FROM sessions s WHERE s.id = n.session_id;
ALTER TABLE notifications ALTER COLUMN tenant SET NOT NULL;
ALTER TABLE notifications ALTER COLUMN tenant_seq SET NOT NULL;
CREATE UNIQUE INDEX notifications_by_tenant ON notifications (tenant, tenant_seq);

CREATE TABLE tenant_notification_seqs (
    tenant TEXT NOT NULL PRIMARY KEY,
    last   BIGINT NOT NULL CHECK (last >= 0)
);
INSERT INTO tenant_notification_seqs (tenant, last)
    SELECT DISTINCT n.tenant, (SELECT last FROM notification_seq)
    FROM notifications n;
