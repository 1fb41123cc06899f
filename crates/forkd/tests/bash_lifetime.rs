//! No Bash process group outlives the daemon that started it: the real `forkd serve` binary is
//! killed with SIGKILL while a child's Bash call runs a background job, and the job dies with it
//! (the group's sentinel sees the daemon's end of its pipe close). Should the sentinel itself be
//! gone, the next daemon stops the group it recorded before telling the model the call was
//! interrupted. Either way the job never does its work behind the model's back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use binary::{Client, Daemon, client};
use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, eventually, fork, transcript_text, trusted_session_request, wait_for_batch,
};

mod binary;

/// A process's state and start time (clock ticks since boot), from `/proc/PID/stat`.
fn stat(pid: i32) -> Option<(char, u64)> {
    let line = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = line.rsplit_once(')')?.1.split_whitespace().collect();
    Some((fields[0].chars().next()?, fields[19].parse().ok()?))
}

/// Whether the process that had `pid` and started at `ticks` can still run: not gone, not a
/// zombie waiting to be reaped, and not another process that reused its pid.
fn alive(pid: i32, ticks: u64) -> bool {
    stat(pid).is_some_and(|(state, start)| start == ticks && !matches!(state, 'Z' | 'X'))
}

/// The process the command wrote the pid of, as this (the host's) PID namespace numbers it, and
/// its start time. A sandboxed command runs in a PID namespace of its own, so the pid it writes
/// is the namespace's: the process is the one working in `ws` whose innermost pid it is.
async fn recorded_pid(path: &Path) -> (i32, u64) {
    let ws = std::fs::canonicalize(path.parent().unwrap()).unwrap();
    eventually(
        Duration::from_secs(20),
        "the command's pid file",
        || async {
            let inner: i32 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
            let pid = forkd_test_support::host_pid(inner, &ws)?;
            Some((pid, stat(pid)?.1))
        },
    )
    .await
}

/// A session whose agents run Bash without asking, and a batch of one child running `command`
/// then saying "finished". Returns the batch.
async fn child_running(c: &mut Client, ws: &Path, command: &str) -> pb::ForkBatchResponse {
    let session = create_session(c, trusted_session_request(ws))
        .await
        .unwrap();
    let input = serde_json::json!({ "command": command });
    let script = format!("Run it.\n@sim tool Bash {input}\n@sim say finished");
    fork(c, &session.session_id, &[script.as_str()], None)
        .await
        .unwrap()
}

/// Restarts the daemon and waits for the child to end: completed, its Bash call answered as
/// interrupted.
async fn resumed_child_completes(home: &Path, batch: &pb::ForkBatchResponse) -> Daemon {
    let daemon = Daemon::start(home, "0.05");
    let mut c = client(home).await;
    let done = wait_for_batch(&mut c, &batch.batch_id, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        done[0].status,
        pb::NotificationStatus::Completed as i32,
        "{done:?}"
    );
    assert_eq!(done[0].report.clone().unwrap().result, "finished");
    let log = transcript_text(&mut c, &batch.agent_ids[0]).await.unwrap();
    assert!(log.contains("Interrupted: this call was started"), "{log}");
    daemon
}

#[tokio::test]
async fn a_sigkilled_daemon_takes_its_bash_process_groups_with_it() {
    let home = tempfile::Builder::new()
        .prefix("forkd-bash-")
        .tempdir()
        .unwrap();
    // Beside the home, never in it: the home is never a workspace.
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let daemon = Daemon::start(home.path(), "0.05");
    let mut c = client(home.path()).await;
    let batch = child_running(
        &mut c,
        &ws,
        "(sleep 5; echo done > after.txt) & echo $! > pid.txt; wait",
    )
    .await;
    let (pid, ticks) = recorded_pid(&ws.join("pid.txt")).await;
    assert!(alive(pid, ticks));

    daemon.kill9();
    eventually(
        Duration::from_secs(10),
        "the background job to die with its daemon",
        || async { !alive(pid, ticks) },
    )
    .await;
    // The job died before it could write: it never will.
    assert!(!ws.join("after.txt").exists());

    let daemon = resumed_child_completes(home.path(), &batch).await;
    assert!(!ws.join("after.txt").exists());
    daemon.kill9();
}

/// The second line: a command that killed its group's sentinel (the one child its shell has
/// when the command starts) survives its daemon's SIGKILL, and the next daemon stops the group
/// it recorded before it reports the call as interrupted.
#[tokio::test]
async fn the_next_daemon_stops_a_recorded_group_that_outlived_its_daemon() {
    let home = tempfile::Builder::new()
        .prefix("forkd-bash-")
        .tempdir()
        .unwrap();
    // Beside the home, never in it: the home is never a workspace.
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let daemon = Daemon::start(home.path(), "0.05");
    let mut c = client(home.path()).await;
    let command = "read -r sentinel < /proc/$$/task/$$/children; kill -KILL $sentinel; \
                   (sleep 15; echo done > after.txt) & echo $! > pid.txt; wait";
    let batch = child_running(&mut c, &ws, command).await;
    let (pid, ticks) = recorded_pid(&ws.join("pid.txt")).await;

    // The group is recorded with the call (the shell's pid and start time) before the kill.
    let url = format!(
        "sqlite://{}?mode=ro",
        home.path().join("forkd.db").display()
    );
    let (pgid, leader_ticks) = eventually(
        Duration::from_secs(20),
        "the call's process group to be recorded",
        || async {
            use sqlx::Connection as _;
            let mut db = sqlx::SqliteConnection::connect(&url).await.ok()?;
            let row: (Option<i64>, Option<i64>) = sqlx::query_as(
                "SELECT process_pgid, process_start_ticks FROM tool_calls WHERE name = 'Bash'",
            )
            .fetch_one(&mut db)
            .await
            .ok()?;
            Some((i32::try_from(row.0?).ok()?, u64::try_from(row.1?).ok()?))
        },
    )
    .await;
    assert!(
        alive(pgid, leader_ticks),
        "the recorded leader is the shell"
    );

    daemon.kill9();
    // Without its sentinel the group outlives the daemon…
    assert!(alive(pid, ticks));
    assert!(alive(pgid, leader_ticks));

    // …until the next daemon resumes the child: the group is gone before the call is answered.
    let daemon = resumed_child_completes(home.path(), &batch).await;
    assert!(!alive(pid, ticks), "the background job survived");
    assert!(!alive(pgid, leader_ticks), "the shell survived");
    assert!(!ws.join("after.txt").exists());
    daemon.kill9();
}
