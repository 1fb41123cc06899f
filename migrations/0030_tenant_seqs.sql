-- A tenant's cursor is its own: each notification also gets its tenant's own number
-- (`tenant_seq`: 1, 2, 3… for a new tenant), which clients see as `seq` and resume from, so a
-- tenant's numbers say nothing of how busy the others are. `seq` stays the daemon's order.
--
-- The notifications stored before keep their numbers as their tenant's (tenant_seq = seq), and
-- each tenant that has any continues above the last number given out so far: a cursor a
-- client kept from before never skips a notification.
ALTER TABLE notifications ADD COLUMN tenant TEXT;
ALTER TABLE notifications ADD COLUMN tenant_seq INTEGER;
UPDATE notifications
    SET tenant = (SELECT s.tenant FROM sessions s WHERE s.id = notifications.session_id),
        tenant_seq = seq;
CREATE UNIQUE INDEX notifications_by_tenant ON notifications (tenant, tenant_seq);

CREATE TABLE tenant_notification_seqs (
    tenant TEXT NOT NULL PRIMARY KEY,
    last   INTEGER NOT NULL CHECK (last >= 0)
);
-- The last number given out: AUTOINCREMENT's, which a deleted row's number stays counted in.
INSERT INTO tenant_notification_seqs (tenant, last)
    SELECT DISTINCT tenant, MAX(
        COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'notifications'), 0),
        COALESCE((SELECT MAX(seq) FROM notifications), 0))
    FROM notifications;
