//! Model request records and the agents' running totals.

use forkd_core::RequestId;
use sqlx::QueryBuilder;

use super::dialect::{Conn, Db, Pool};
use crate::StoreError;
use crate::error::Result;
use crate::rows::convert::conflict_if_duplicate;
use crate::rows::requests::{
    ADD_TO_TOTALS, INSERT_REQUEST, RequestRow, RequestValues, SELECT_REQUESTS, bind_request,
    bind_totals,
};
use crate::{DbError, RequestFilter, RequestRecord};

/// Runs inside the caller's write transaction, so the record and the totals never disagree. The
/// totals are added in place (`x = x + $n`), so concurrent records of one agent all count.
pub(crate) async fn record(conn: &mut Conn, r: &RequestRecord) -> Result<()> {
    let values = RequestValues::new(r)?;
    // Updating first doubles as the existence check, with a clear NotFound instead of a foreign
    // key failure from the insert.
    let updated = bind_totals!(sqlx::query(ADD_TO_TOTALS), &values)
        .execute(&mut *conn)
        .await?;
    if updated.rows_affected() == 0 {
        return Err(DbError::Store(StoreError::NotFound {
            kind: "agent",
            id: values.agent_id,
        }));
    }
    bind_request!(sqlx::query(INSERT_REQUEST), &values)
        .execute(conn)
        .await
        .map_err(|e| {
            conflict_if_duplicate(e, || format!("request {} already recorded", values.id))
        })?;
    Ok(())
}

pub(crate) async fn get(pool: &Pool, id: RequestId) -> Result<Option<RequestRecord>> {
    let mut q = QueryBuilder::<Db>::new(SELECT_REQUESTS);
    q.push(" WHERE id = ").push_bind(id.to_string());
    let row: Option<RequestRow> = q.build_query_as().fetch_optional(pool).await?;
    row.map(RequestRecord::try_from).transpose()
}

/// Requests in id (creation) order.
pub(crate) async fn list(pool: &Pool, filter: &RequestFilter) -> Result<Vec<RequestRecord>> {
    let mut q = QueryBuilder::<Db>::new(SELECT_REQUESTS);
    q.push(" WHERE TRUE");
    if let Some(session_id) = filter.session_id {
        q.push(" AND session_id = ")
            .push_bind(session_id.to_string());
    }
    if let Some(batch_id) = filter.batch_id {
        q.push(" AND batch_id = ").push_bind(batch_id.to_string());
    }
    if let Some(agent_id) = filter.agent_id {
        q.push(" AND agent_id = ").push_bind(agent_id.to_string());
    }
    q.push(" ORDER BY id");
    let rows: Vec<RequestRow> = q.build_query_as().fetch_all(pool).await?;
    rows.into_iter().map(RequestRecord::try_from).collect()
}
