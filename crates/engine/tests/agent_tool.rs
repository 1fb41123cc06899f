//! The `Agent` tool a session offers lists the agent types a `subagent_type` may name — built-in
//! ones and those defined in files — and the list is fixed when the session is created.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use forkd_core::tools::AGENT_TOOL;

fn agent_description(session: &forkd_core::session::Session) -> String {
    let tools: serde_json::Value =
        serde_json::from_str(session.params.tools.raw().as_str()).unwrap();
    tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == AGENT_TOOL)
        .unwrap()["description"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn the_agent_tool_lists_the_types_as_they_were_when_the_session_was_created() {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join(".forkd/agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(
        agents.join("reviewer.md"),
        "---\nname: reviewer\ndescription: Reviews a diff; use after every change.\n---\nYou review.\n",
    )
    .unwrap();
    let engine = common::engine(dir.path()).await;
    let session = engine
        .create_session(common::new_session(dir.path(), "Sys."))
        .await
        .unwrap();
    let text = agent_description(&session);
    assert!(
        text.contains("Available agent types (subagent_type):"),
        "{text}"
    );
    for ty in ["general-purpose", "Explore", "Plan"] {
        assert!(
            text.contains(&format!("\n- {ty}: ")),
            "{ty} missing: {text}"
        );
    }
    assert!(
        text.contains("\n- reviewer: Reviews a diff; use after every change."),
        "{text}"
    );

    // A type defined later changes neither the stored session's tools nor its cache.
    std::fs::write(
        agents.join("late.md"),
        "---\nname: late\ndescription: Came later.\n---\nLate.\n",
    )
    .unwrap();
    let stored = engine.get_session(session.id).await.unwrap();
    assert_eq!(stored.params.tools.raw(), session.params.tools.raw());
    assert!(!agent_description(&stored).contains("late"));
    // A session created now lists it.
    let newer = engine
        .create_session(common::new_session(dir.path(), "Sys."))
        .await
        .unwrap();
    assert!(agent_description(&newer).contains("\n- late: Came later."));
}
