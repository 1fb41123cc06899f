//! Branches through the real daemon and gRPC: the cache read through the `anthropic` provider
//! against `forkd sim-server`, tenants, what 100 branches add to the database, SIGKILL and a
//! restart, and PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use forkd_proto::v1 as pb;
use forkd_provider::{SimConfig, SimProvider};
use forkd_server::TokenStore;
use forkd_sim_server::SimServerConfig;
use forkd_test_support::{
    Caller, create_session, run_turn, session_request, session_transcript, spawn_daemon,
    spawn_daemon_with,
};
use pb::branch_session_request::Point;
use tonic::Code;

mod binary;
mod pg;

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

type Client = pb::forkd_client::ForkdClient<tonic::transport::Channel>;

/// Turn `k`'s message: ~9k tokens of padding and a ~1.5k-token answer, so a branch that wrote
/// the last answer again would read well under 99% of its history from the cache.
fn long_message(k: usize) -> String {
    format!(
        "Turn {k}. {}\n@sim say answer {k}: {}",
        "word ".repeat(9_000),
        "reply ".repeat(1_500)
    )
}

fn send(session: &str, text: &str) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        session_id: session.into(),
        text: text.into(),
        ..Default::default()
    }
}

/// Runs a turn; its usage.
async fn turn(client: &mut Client, session: &str, text: &str) -> pb::Usage {
    let events = run_turn(client, send(session, text)).await.unwrap();
    events
        .iter()
        .find_map(|e| match e {
            pb::session_event::Event::TurnEnded(end) => end.usage,
            _ => None,
        })
        .unwrap_or_else(|| panic!("the turn ended: {events:?}"))
}

fn branch_at(session: &str, point: Option<Point>) -> pb::BranchSessionRequest {
    pb::BranchSessionRequest {
        session_id: session.into(),
        point,
        ..Default::default()
    }
}

async fn branch(client: &mut Client, request: pb::BranchSessionRequest) -> pb::Session {
    client
        .branch_session(request)
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
}

async fn get(client: &mut Client, id: &str) -> pb::Session {
    client
        .get_session(pb::GetSessionRequest {
            session_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
}

fn read_share(usage: &pb::Usage) -> f64 {
    let total =
        usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens;
    usage.cache_read_input_tokens as f64 / total as f64
}

#[tokio::test]
async fn a_branch_through_the_anthropic_provider_reads_what_its_origin_cached() {
    let base_url = forkd_test_support::sim_server(
        SimProvider::new(SimConfig::default()),
        SimServerConfig {
            api_key: Some("test-key".into()),
            ..SimServerConfig::default()
        },
    )
    .await
    .unwrap();
    let daemon = spawn_daemon_with(|c| forkd_test_support::use_anthropic(c, &base_url, "test-key"))
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    let origin = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let sid = origin.session_id.clone();
    for k in 1..=4 {
        turn(&mut client, &sid, &long_message(k)).await;
    }
    let at_two = branch(&mut client, branch_at(&sid, Some(Point::AtTurn(2)))).await;
    let shown = get(&mut client, &sid).await;
    assert_eq!(at_two.branch_of, sid);
    assert_eq!(at_two.branch_turn, 2);
    assert_eq!(at_two.branch_point, shown.turn_seqs[2]);
    assert_eq!(shown.branches, std::slice::from_ref(&at_two.session_id));
    assert_eq!(shown.finished_turns, 4);

    // Everything before its own message is read from what the origin's requests wrote.
    let usage = turn(&mut client, &at_two.session_id, "Instead.\n@sim say other").await;
    let share = read_share(&usage);
    assert!(share >= 0.99, "read {share:.4} of the request: {usage:?}");

    // Before turn 4's message, the same.
    let before_four = branch(
        &mut client,
        branch_at(&sid, Some(Point::BeforeSeq(shown.turn_seqs[3]))),
    )
    .await;
    assert_eq!(before_four.branch_turn, 3);
    let usage = turn(&mut client, &before_four.session_id, "Four.\n@sim say four").await;
    assert!(read_share(&usage) >= 0.99, "{usage:?}");

    // Its conclusion comes back to the origin.
    let merged = client
        .merge_branch(pb::MergeBranchRequest {
            session_id: at_two.session_id.clone(),
            summary: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(merged.origin_session_id, sid);
    assert!(merged.note.contains("<branch-report>"), "{}", merged.note);
    assert_eq!(get(&mut client, &sid).await.message_count, merged.seq + 1);
}

#[tokio::test]
async fn another_tenants_session_cannot_be_branched_or_merged() {
    let mut secrets = Vec::new();
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some(LOOPBACK);
        let tokens = TokenStore::in_home(&c.home);
        secrets.push(tokens.create("alpha").unwrap());
        secrets.push(tokens.create("beta").unwrap());
    })
    .await
    .unwrap();
    let mut alpha = Caller::new(&daemon, secrets[0].expose()).await.unwrap();
    let mut beta = Caller::new(&daemon, secrets[1].expose()).await.unwrap();
    let session = alpha
        .create_session(session_request(&daemon.tenant_workspace("alpha")))
        .await
        .unwrap();
    let sid = session.session_id;
    alpha
        .client
        .send_message(alpha.req(send(&sid, "One.\n@sim say one")))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap();
    let refused = beta
        .client
        .branch_session(beta.req(branch_at(&sid, None)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    // A point inside a turn names the nearest valid points.
    let inside = alpha
        .client
        .branch_session(alpha.req(branch_at(&sid, Some(Point::BeforeSeq(0)))))
        .await
        .unwrap_err();
    assert_eq!(inside.code(), Code::InvalidArgument, "{inside:?}");
    assert!(
        inside.message().contains("nearest valid point"),
        "{inside:?}"
    );

    let mine = alpha
        .client
        .branch_session(alpha.req(branch_at(&sid, Some(Point::AtTurn(0)))))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let not_yours = beta
        .client
        .merge_branch(beta.req(pb::MergeBranchRequest {
            session_id: mine.session_id.clone(),
            summary: false,
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(not_yours.code(), Code::NotFound, "{not_yours:?}");
    let nothing_yet = alpha
        .client
        .merge_branch(alpha.req(pb::MergeBranchRequest {
            session_id: mine.session_id,
            summary: false,
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(
        nothing_yet.code(),
        Code::FailedPrecondition,
        "{nothing_yet:?}"
    );
}

/// Bytes of a stopped daemon's database file, its WAL checkpointed into it first.
async fn database_bytes(home: &std::path::Path) -> u64 {
    let db = home.join("forkd.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(busy, 0, "the checkpoint finished");
    pool.close().await;
    std::fs::metadata(&db).unwrap().len()
}

#[tokio::test]
async fn a_hundred_branches_of_a_100k_token_session_add_at_most_16_kib_each() {
    let mut daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let origin = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let sid = origin.session_id;
    for k in 1..=10 {
        turn(&mut client, &sid, &long_message(k)).await;
    }
    drop(client);
    daemon.stop().await.unwrap();
    let before = database_bytes(daemon.home_path()).await;
    daemon.restart(|_| {}).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    for k in 0..100_u32 {
        branch(&mut client, branch_at(&sid, Some(Point::AtTurn(k % 11)))).await;
    }
    drop(client);
    daemon.stop().await.unwrap();
    let after = database_bytes(daemon.home_path()).await;
    let per_branch = after.saturating_sub(before) / 100;
    eprintln!("{per_branch} bytes per branch ({before} -> {after})");
    assert!(
        per_branch <= 16 * 1024,
        "{per_branch} bytes per branch ({before} -> {after})"
    );
}

#[tokio::test]
async fn a_branch_survives_a_sigkill_and_goes_on_after_the_restart() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let daemon = binary::Daemon::start(home.path(), "0");
    let mut client = binary::client(home.path()).await;
    let origin = create_session(&mut client, session_request(ws.path()))
        .await
        .unwrap();
    let sid = origin.session_id;
    turn(&mut client, &sid, "One.\n@sim say one").await;
    turn(&mut client, &sid, "Two.\n@sim say two").await;
    let at_one = branch(&mut client, branch_at(&sid, Some(Point::AtTurn(1)))).await;
    daemon.kill9();

    let _daemon = binary::Daemon::start(home.path(), "0");
    let mut client = binary::client(home.path()).await;
    let again = get(&mut client, &at_one.session_id).await;
    assert_eq!(
        (
            again.branch_of.as_str(),
            again.branch_point,
            again.branch_turn
        ),
        (sid.as_str(), at_one.branch_point, 1)
    );
    turn(
        &mut client,
        &at_one.session_id,
        "Two, again.\n@sim say again",
    )
    .await;
    let shown = get(&mut client, &at_one.session_id).await;
    assert_eq!(shown.turn_seqs.len(), 2);
    assert_eq!(shown.finished_turns, 2);
    let transcript = session_transcript(&mut client, &at_one.session_id)
        .await
        .unwrap();
    // Inherited messages are marked, and turns are numbered on from the origin's.
    assert!(
        transcript
            .iter()
            .take(at_one.branch_point as usize)
            .all(|m| m.shared)
    );
    let turns: Vec<u32> = transcript
        .iter()
        .map(|m| m.turn)
        .filter(|t| *t > 0)
        .collect();
    assert_eq!(turns, [1, 2]);
    assert!(
        client
            .merge_branch(pb::MergeBranchRequest {
                session_id: at_one.session_id,
                summary: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .note
            .contains("<summary>")
    );
}

#[tokio::test]
async fn branches_work_on_postgres_across_a_restart() {
    pg::with_scratch_database(branches_on_postgres).await;
}

async fn branches_on_postgres(url: String) {
    let database = |c: &mut forkd::daemon::DaemonConfig| {
        c.database_url = Some(forkd::daemon::DatabaseUrl::new(url.clone()));
    };
    let mut daemon = spawn_daemon_with(database).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let origin = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let sid = origin.session_id;
    for k in 1..=3 {
        turn(&mut client, &sid, &format!("Turn {k}.\n@sim say {k}")).await;
    }
    let at_two = branch(&mut client, branch_at(&sid, Some(Point::AtTurn(2)))).await;
    let grandchild = branch(&mut client, branch_at(&at_two.session_id, None)).await;
    assert_eq!(grandchild.branch_turn, 2);
    turn(
        &mut client,
        &grandchild.session_id,
        "Deeper.\n@sim say deeper",
    )
    .await;
    daemon.restart(database).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let shown = get(&mut client, &grandchild.session_id).await;
    assert_eq!(shown.turn_seqs.len(), 3);
    assert_eq!(get(&mut client, &at_two.session_id).await.branches.len(), 1);
    let merged = client
        .merge_branch(pb::MergeBranchRequest {
            session_id: grandchild.session_id,
            summary: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(merged.origin_session_id, at_two.session_id);
    // Its connections closed before the scratch database is dropped.
    drop(client);
    daemon.stop().await.unwrap();
}
