//! Isolated batches keep the cache: whatever N and whatever each child edits in its copy, every
//! request of the batch carries one prefix fingerprint, and each child's changes are its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use forkd_core::Directive;
use forkd_core::isolation::Isolation;
use forkd_core::query::RequestFilter;
use forkd_core::session::PermissionMode;
use forkd_engine::{BatchOptions, EngineConfig};
use proptest::prelude::*;

fn run(n: usize, edits: &[String]) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("notes.txt"), "first line\n").unwrap();
        let mut config = EngineConfig::default();
        config.isolation.root = dir.path().join("isolation");
        let engine = common::engine_with(dir.path(), config).await;
        let session = engine
            .create_session(forkd_engine::NewSession {
                permission_mode: PermissionMode::BypassPermissions,
                ..common::new_session(&ws, "Sys.")
            })
            .await
            .unwrap();
        let directives: Vec<Directive> = (0..n)
            .map(|i| Directive {
                description: format!("child {i}"),
                prompt: format!(
                    "Append your line.\n@sim tool Bash {{\"command\":\"echo '{}' >> notes.txt\"}}\n@sim say done",
                    edits[i]
                ),
            })
            .collect();
        let batch = engine
            .fork_batch(
                session.id,
                directives,
                BatchOptions {
                    isolation: Isolation::Copy,
                    ..BatchOptions::default()
                },
            )
            .await
            .unwrap();
        for agent in &batch.agent_ids {
            common::ended(&engine, *agent).await;
        }
        let records = engine
            .list_requests(&RequestFilter {
                batch_id: Some(batch.batch_id),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(records.len(), 2 * n, "two requests a child");
        assert!(
            records
                .iter()
                .all(|r| r.prefix_fingerprint == records[0].prefix_fingerprint),
            "siblings' prefixes differ"
        );
        for (i, agent) in batch.agent_ids.iter().enumerate() {
            let changes = engine.changes(*agent).await.unwrap();
            assert_eq!(changes.files.len(), 1);
            assert!(changes.diff.contains(&format!("+{}\n", edits[i])), "{}", changes.diff);
            for (j, other) in edits.iter().enumerate() {
                if j != i && other != &edits[i] {
                    assert!(!changes.diff.contains(&format!("+{other}\n")));
                }
            }
        }
        assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "first line\n");
        engine.shutdown(std::time::Duration::from_millis(100)).await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn isolated_siblings_keep_one_prefix(
        edits in proptest::collection::vec("[a-z]{1,12}", 1..6)
    ) {
        run(edits.len(), &edits);
    }
}
