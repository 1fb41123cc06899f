//! Uploaded workspaces: blobs per tenant, and trees made of them (see `Store::create_upload`).

use forkd_core::UploadId;
use forkd_core::upload::{BlobsStored, Manifest, Upload};

use super::dialect::{Conn, Db, lock_tenant_blobs};
use crate::StoreError;
use crate::error::Result;
use crate::rows::convert::{corrupt, from_i64};

/// Of `hashes`, those `tenant` has no blob for, in their order.
pub(crate) async fn missing<'c>(
    conn: impl sqlx::Executor<'c, Database = Db>,
    tenant: &str,
    hashes: &[String],
) -> Result<Vec<String>> {
    if hashes.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = sqlx::QueryBuilder::<Db>::new("SELECT sha256 FROM blobs WHERE tenant = ");
    q.push_bind(tenant.to_owned()).push(" AND sha256 IN (");
    let mut list = q.separated(", ");
    for hash in hashes {
        list.push_bind(hash.clone());
    }
    q.push(")");
    let present: std::collections::HashSet<String> = q
        .build_query_scalar()
        .fetch_all(conn)
        .await?
        .into_iter()
        .collect();
    Ok(hashes
        .iter()
        .filter(|h| !present.contains(*h))
        .cloned()
        .collect())
}

/// Stores `tenant`'s blobs (a second copy of one it has is no change); with a `quota`, only if
/// what the tenant holds with them stays within it, counted under the tenant's blob lock
/// (`lock_tenant_blobs`), so two uploads at once cannot both pass it.
pub(crate) async fn put_blobs(
    conn: &mut Conn,
    tenant: &str,
    blobs: &[(&str, &[u8])],
    quota: Option<u64>,
    at_ms: i64,
) -> Result<BlobsStored> {
    if let Some(quota) = quota {
        lock_tenant_blobs(&mut *conn, tenant).await?;
        let hashes: Vec<String> = blobs.iter().map(|(h, _)| (*h).to_owned()).collect();
        let missing: std::collections::HashSet<String> = missing(&mut *conn, tenant, &hashes)
            .await?
            .into_iter()
            .collect();
        let mut seen = std::collections::HashSet::new();
        let adds: u64 = blobs
            .iter()
            .filter(|(h, _)| missing.contains(*h) && seen.insert(*h))
            .map(|(_, content)| content.len() as u64)
            .sum();
        let held = held(&mut *conn, tenant).await?;
        if held.saturating_add(adds) > quota {
            return Ok(BlobsStored::OverQuota { held, adds });
        }
    }
    for (sha256, content) in blobs {
        sqlx::query(
            "INSERT INTO blobs (tenant, sha256, size, content, created_at_ms) VALUES ($1, $2, \
             $3, $4, $5) ON CONFLICT (tenant, sha256) DO NOTHING",
        )
        .bind(tenant)
        .bind(*sha256)
        .bind(i64::try_from(content.len()).unwrap_or(i64::MAX))
        .bind(*content)
        .bind(at_ms)
        .execute(&mut *conn)
        .await?;
    }
    Ok(BlobsStored::Stored)
}

/// A blob of `tenant`'s.
pub(crate) async fn blob<'c>(
    conn: impl sqlx::Executor<'c, Database = Db>,
    tenant: &str,
    sha256: &str,
) -> Result<Option<Vec<u8>>> {
    Ok(
        sqlx::query_scalar("SELECT content FROM blobs WHERE tenant = $1 AND sha256 = $2")
            .bind(tenant)
            .bind(sha256)
            .fetch_optional(conn)
            .await?,
    )
}

/// Stores `upload` once every blob its tree needs is its tenant's; else `Conflict` naming how
/// many are missing, and nothing is stored.
pub(crate) async fn create(conn: &mut Conn, upload: &Upload) -> Result<()> {
    let needed: Vec<String> = upload
        .manifest
        .blobs()
        .keys()
        .map(|h| (*h).to_owned())
        .collect();
    let mut lacking = 0;
    for chunk in needed.chunks(1000) {
        lacking += missing(&mut *conn, &upload.tenant, chunk).await?.len();
    }
    if lacking > 0 {
        return Err(crate::DbError::Store(StoreError::Conflict(format!(
            "{lacking} of the tree's {} blobs were never received; nothing was stored",
            needed.len()
        ))));
    }
    let manifest = serde_json::to_string(&upload.manifest)
        .map_err(|e| corrupt("upload manifest", e.to_string()))?;
    sqlx::query(
        "INSERT INTO uploads (id, tenant, manifest_json, files, bytes, created_at_ms) VALUES \
         ($1, $2, $3, $4, $5, $6)",
    )
    .bind(upload.id.to_string())
    .bind(&upload.tenant)
    .bind(manifest)
    .bind(i64::try_from(upload.files).unwrap_or(i64::MAX))
    .bind(i64::try_from(upload.bytes).unwrap_or(i64::MAX))
    .bind(upload.created_at_ms)
    .execute(&mut *conn)
    .await?;
    for hash in &needed {
        sqlx::query("INSERT INTO upload_blobs (upload_id, tenant, sha256) VALUES ($1, $2, $3)")
            .bind(upload.id.to_string())
            .bind(&upload.tenant)
            .bind(hash)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Records an uploaded session's origin.
pub(crate) async fn record_origin(
    conn: &mut Conn,
    session: forkd_core::SessionId,
    origin: &forkd_core::upload::Origin,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO session_uploads (session_id, upload_id, files, bytes, git_commit) VALUES \
         ($1, $2, $3, $4, $5)",
    )
    .bind(session.to_string())
    .bind(origin.upload_id.to_string())
    .bind(i64::try_from(origin.files).unwrap_or(i64::MAX))
    .bind(i64::try_from(origin.bytes).unwrap_or(i64::MAX))
    .bind(origin.git_commit.as_deref())
    .execute(conn)
    .await?;
    Ok(())
}

/// An uploaded session's origin.
pub(crate) async fn origin<'c>(
    conn: impl sqlx::Executor<'c, Database = Db>,
    session: forkd_core::SessionId,
) -> Result<Option<forkd_core::upload::Origin>> {
    let row: Option<(String, i64, i64, Option<String>)> = sqlx::query_as(
        "SELECT upload_id, files, bytes, git_commit FROM session_uploads WHERE session_id = $1",
    )
    .bind(session.to_string())
    .fetch_optional(conn)
    .await?;
    let Some((upload_id, files, bytes, git_commit)) = row else {
        return Ok(None);
    };
    Ok(Some(forkd_core::upload::Origin {
        upload_id: upload_id
            .parse()
            .map_err(|e| corrupt("upload id", format!("{e}")))?,
        files: from_i64(files, "upload files")?,
        bytes: from_i64(bytes, "upload bytes")?,
        git_commit,
    }))
}

/// The bytes of the blobs `tenant` holds.
pub(crate) async fn held<'c>(
    conn: impl sqlx::Executor<'c, Database = Db>,
    tenant: &str,
) -> Result<u64> {
    let bytes: Option<i64> =
        sqlx::query_scalar("SELECT CAST(SUM(size) AS BIGINT) FROM blobs WHERE tenant = $1")
            .bind(tenant)
            .fetch_one(conn)
            .await?;
    from_i64(bytes.unwrap_or(0), "blob bytes")
}

/// Removes the uploads made before `uploads_before_ms`, then the blobs that arrived before
/// `blobs_before_ms` and that no upload names; how many of each.
pub(crate) async fn expire(
    conn: &mut Conn,
    uploads_before_ms: i64,
    blobs_before_ms: i64,
) -> Result<(u64, u64)> {
    sqlx::query(
        "DELETE FROM upload_blobs WHERE upload_id IN \
         (SELECT id FROM uploads WHERE created_at_ms < $1 AND id NOT IN \
          (SELECT upload_id FROM schedules WHERE upload_id IS NOT NULL))",
    )
    .bind(uploads_before_ms)
    .execute(&mut *conn)
    .await?;
    // A schedule's firings start from its upload: kept while the schedule names it.
    let uploads = sqlx::query(
        "DELETE FROM uploads WHERE created_at_ms < $1 AND id NOT IN \
         (SELECT upload_id FROM schedules WHERE upload_id IS NOT NULL)",
    )
    .bind(uploads_before_ms)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    let blobs = sqlx::query(
        "DELETE FROM blobs WHERE created_at_ms < $1 AND NOT EXISTS \
         (SELECT 1 FROM upload_blobs u WHERE u.tenant = blobs.tenant AND u.sha256 = blobs.sha256)",
    )
    .bind(blobs_before_ms)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok((uploads, blobs))
}

#[derive(sqlx::FromRow)]
struct UploadRow {
    id: String,
    tenant: String,
    manifest_json: String,
    files: i64,
    bytes: i64,
    created_at_ms: i64,
}

/// `tenant`'s upload `id`; another tenant's is not found.
pub(crate) async fn get<'c>(
    conn: impl sqlx::Executor<'c, Database = Db>,
    tenant: &str,
    id: UploadId,
) -> Result<Option<Upload>> {
    let row: Option<UploadRow> = sqlx::query_as(
        "SELECT id, tenant, manifest_json, files, bytes, created_at_ms FROM uploads \
         WHERE id = $1 AND tenant = $2",
    )
    .bind(id.to_string())
    .bind(tenant)
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let manifest: Manifest = serde_json::from_str(&row.manifest_json)
        .map_err(|e| corrupt("upload manifest", e.to_string()))?;
    Ok(Some(Upload {
        id: row
            .id
            .parse()
            .map_err(|e| corrupt("upload id", format!("{e}")))?,
        tenant: row.tenant,
        manifest,
        files: from_i64(row.files, "upload files")?,
        bytes: from_i64(row.bytes, "upload bytes")?,
        created_at_ms: row.created_at_ms,
    }))
}
