//! Write probes: whether the database takes writes (see `Store::probe_write`).

use forkd_core::store::PROBE_BYTES;

use super::dialect::Conn;
use crate::error::Result;

/// Inserts a row of [`PROBE_BYTES`] and deletes it again, in the caller's transaction.
pub(crate) async fn probe(conn: &mut Conn) -> Result<()> {
    let id: i64 = sqlx::query_scalar("INSERT INTO write_probes (pad) VALUES ($1) RETURNING id")
        .bind(vec![0_u8; PROBE_BYTES])
        .fetch_one(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM write_probes WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}
