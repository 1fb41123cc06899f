//! A scratch PostgreSQL database for tests that run daemons on PostgreSQL: created on the server
//! `FORKD_TEST_DATABASE_URL` names, dropped at the end. Without that variable a test says so and
//! passes, unless `CI` is set: then it fails.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// A fresh database on the test server, and the server's URL to drop it through; `None` when
/// the PostgreSQL tests are skipped.
async fn scratch_database() -> Option<(String, String)> {
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    let server = match std::env::var("FORKD_TEST_DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => {
            assert!(
                !ci,
                "CI is set but FORKD_TEST_DATABASE_URL is not: the PostgreSQL tests must run in CI"
            );
            println!(
                "skipped: set FORKD_TEST_DATABASE_URL=postgres://… to run the PostgreSQL store tests"
            );
            return None;
        }
    };
    let name = format!(
        "forkd_daemon_test_{}_{}",
        std::process::id(),
        fastrand::u32(..)
    );
    let mut admin = PgConnection::connect(&server)
        .await
        .unwrap_or_else(|e| panic!("cannot reach FORKD_TEST_DATABASE_URL: {e}"));
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    admin.close().await.unwrap();
    // The server's URL with the database replaced (the path after the host).
    let (scheme, rest) = server.split_once("://").unwrap();
    let host_at = rest.rfind('@').map_or(0, |i| i + 1);
    let host_end = rest[host_at..]
        .find(['/', '?'])
        .map_or(rest.len(), |i| host_at + i);
    let query = rest[host_end..]
        .find('?')
        .map_or("", |i| &rest[host_end + i..]);
    let url = format!("{scheme}://{}/{name}{query}", &rest[..host_end]);
    Some((url, format!("{server}\n{name}")))
}

/// Drops the test's database. A plain `DROP DATABASE` waits for an autovacuum worker to leave
/// (`WITH (FORCE)` would fail on it without the right to signal it); `FORCE` is the fallback for
/// a connection of the test that is still open.
async fn drop_database(handle: &str) {
    let (server, name) = handle.split_once('\n').unwrap();
    let mut admin = PgConnection::connect(server).await.unwrap();
    let plain = sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
        .execute(&mut admin)
        .await;
    if plain.is_err() {
        sqlx::query(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut admin)
        .await
        .unwrap();
    }
    admin.close().await.unwrap();
}

/// Runs `test` on a scratch database's URL, then drops the database, whether the test passed or
/// panicked. Does nothing when the PostgreSQL tests are skipped.
pub async fn with_scratch_database<F, Fut>(test: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some((url, handle)) = scratch_database().await else {
        return;
    };
    let outcome = tokio::spawn(test(url)).await;
    drop_database(&handle).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}
