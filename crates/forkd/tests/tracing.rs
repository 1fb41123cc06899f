//! OpenTelemetry traces end to end (docs/operations.md, "Tracing"): a daemon whose spans are
//! exported over OTLP/gRPC to a receiver in the test, a batch forked by a caller that sent a W3C
//! `traceparent`, and the trace that arrives: the caller's trace id, the batch's span under the
//! call's, its children's spans under it, their model requests with the GenAI attributes (cache
//! reads on children 2 and 3), their tool calls, and no message text anywhere; after a restart
//! mid-batch, the resumed child's spans and a resumed parent turn's in their callers' traces,
//! and with content capture on, a request's messages and reply; the links from children 2 and 3
//! to the request that wrote their prefix.
//!
//! The exporter's layer is global to the process, so this file holds one test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd::telemetry::{OtlpProtocol, Telemetry, TracingConfig, span_filter};
use forkd_proto::v1 as pb;
use forkd_test_support::otlp::{OtlpReceiver, Span, Value};
use forkd_test_support::{
    create_session, directives, eventually, session_request, spawn_daemon, spawn_daemon_with,
    trusted_session_request, wait_for_batch, wait_for_path,
};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
/// The second caller's, whose batch a restart cuts in two.
const RESTARTED_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
/// The third caller's, whose parent turn a restart cuts in two.
const TURN_TRACE: &str = "5e1ec7ed5e1ec7ed5e1ec7ed5e1ec7ed";
/// The fourth caller's, whose batch a daemon running one agent at a time runs.
const ONE_SLOT_TRACE: &str = "0e51075107e51075107e51075107e510";

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key)? {
        Value::IntValue(n) => Some(*n),
        _ => None,
    }
}

fn text<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key)? {
        Value::StringValue(s) => Some(s),
        _ => None,
    }
}

/// A batch of `prompts` forked by a caller in the trace `trace`.
async fn fork_in_trace(
    client: &mut pb::forkd_client::ForkdClient<tonic::transport::Channel>,
    session_id: String,
    prompts: &[&str],
    trace: &str,
) -> pb::ForkBatchResponse {
    let mut request = tonic::Request::new(pb::ForkBatchRequest {
        session_id,
        directives: directives(prompts),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace}-{CALLER_SPAN}-01").parse().unwrap(),
    );
    client.fork_batch(request).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_joins_its_callers_trace_with_the_genai_attributes() {
    let mut receiver = OtlpReceiver::start().await.unwrap();
    let telemetry = Telemetry::start(&TracingConfig {
        endpoint: receiver.endpoint.clone(),
        protocol: OtlpProtocol::Grpc,
        headers: Vec::new(),
        service_name: "forkd-test".into(),
        capture_content: false,
    })
    .unwrap();
    tracing_subscriber::registry()
        .with(telemetry.layer().with_filter(span_filter()))
        .try_init()
        .unwrap();

    let mut daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("notes.md"), "Secret notes.").unwrap();
    let session = create_session(&mut client, session_request(workspace.path()))
        .await
        .unwrap();
    let prompts = [
        "Look at part one.\n@sim tool Read {\"file_path\":\"notes.md\"}\n@sim say read",
        "Look at part two.",
        "Look at part three.",
    ];
    let batch = fork_in_trace(&mut client, session.session_id, &prompts, CALLER_TRACE).await;
    wait_for_batch(&mut client, &batch.batch_id, 3, Duration::from_secs(30))
        .await
        .unwrap();

    // Spans end as their work does; the exporter batches them. A parent's span closes only after
    // its last child's, so the call's span (the batch's parent, closed last) may reach the
    // exporter a flush after the agents' spans: wait for it too.
    let spans = eventually(
        Duration::from_secs(20),
        "the agents' and the call's spans",
        || {
            telemetry.flush();
            let spans = receiver.spans();
            let agents = spans.iter().filter(|s| s.name == "agent").count();
            let call = spans.iter().any(|s| s.name == "forkd.v1.Forkd/ForkBatch");
            async move { (agents >= 3 && call).then_some(spans) }
        },
    )
    .await;
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let ours: Vec<&Span> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == CALLER_TRACE)
        .collect();
    let named =
        |name: &str| -> Vec<&Span> { ours.iter().copied().filter(|s| s.name == name).collect() };

    let rpc = named("forkd.v1.Forkd/ForkBatch");
    assert_eq!(
        rpc.len(),
        1,
        "{:?}",
        ours.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    assert_eq!(
        hex(&rpc[0].parent_span_id),
        CALLER_SPAN,
        "the call's span is the caller's child"
    );
    // The batch keeps its span's context, for its children's later runs and the web view.
    let stored = daemon
        .daemon()
        .unwrap()
        .engine
        .get_batch(batch.batch_id.parse().unwrap())
        .await
        .unwrap();
    assert!(
        stored
            .trace_parent
            .as_deref()
            .is_some_and(|t| t.contains(CALLER_TRACE)),
        "{stored:?}"
    );
    let fork = named("fork_batch");
    assert_eq!(fork.len(), 1);
    assert_eq!(fork[0].parent_span_id, rpc[0].span_id);
    assert_eq!(
        text(fork[0], "forkd.batch.id"),
        Some(batch.batch_id.as_str())
    );
    let agents = named("agent");
    assert_eq!(
        agents.len(),
        3,
        "every child's span is in the caller's trace"
    );
    assert!(agents.iter().all(|a| a.parent_span_id == fork[0].span_id));

    let requests: Vec<&Span> = ours
        .iter()
        .copied()
        .filter(|s| text(s, "gen_ai.operation.name") == Some("chat"))
        .collect();
    assert!(requests.len() >= 3, "{requests:?}");
    for r in &requests {
        assert!(agents.iter().any(|a| a.span_id == r.parent_span_id));
        assert!(text(r, "gen_ai.request.model").is_some());
        assert!(text(r, "gen_ai.provider.name").is_some());
        assert!(
            int(r, "gen_ai.request.max_tokens").is_some_and(|n| n > 0),
            "{:?}",
            attr(r, "gen_ai.request.max_tokens")
        );
        assert!(int(r, "gen_ai.usage.input_tokens").is_some_and(|n| n > 0));
        assert!(int(r, "gen_ai.usage.output_tokens").is_some_and(|n| n > 0));
        assert!(text(r, "gen_ai.response.finish_reasons").is_some());
        assert!(
            r.events.iter().any(|e| e.name == "gen_ai.first_token"),
            "time to first token is an event: {:?}",
            r.events
        );
    }
    // Children 2 and 3 read what child 1 wrote, and their first requests link to the one that
    // wrote it.
    let writer = {
        let agent = agents
            .iter()
            .find(|a| text(a, "forkd.agent.id") == Some(batch.agent_ids[0].as_str()))
            .expect("child 1's span");
        requests
            .iter()
            .filter(|r| r.parent_span_id == agent.span_id)
            .min_by_key(|r| r.start_time_unix_nano)
            .expect("child 1's first request")
    };
    for agent_id in &batch.agent_ids[1..] {
        let agent = agents
            .iter()
            .find(|a| text(a, "forkd.agent.id") == Some(agent_id.as_str()))
            .expect("the child's span");
        let first = requests
            .iter()
            .find(|r| r.parent_span_id == agent.span_id)
            .expect("its request");
        assert!(
            int(first, "gen_ai.usage.cache_read.input_tokens").is_some_and(|n| n > 1000),
            "{first:?}"
        );
        assert!(
            first.links.iter().any(|l| l.span_id == writer.span_id),
            "{:?}",
            first.links
        );
    }
    let tools = named("execute_tool Read");
    assert_eq!(tools.len(), 1);
    assert!(agents.iter().any(|a| a.span_id == tools[0].parent_span_id));
    assert_eq!(text(tools[0], "gen_ai.tool.name"), Some("Read"));
    assert_eq!(text(tools[0], "forkd.sandbox"), Some("workspace-write"));
    // Children 2 and 3 waited at the warm-up gate for child 1's response to start.
    assert!(
        agents
            .iter()
            .filter(|a| int(a, "forkd.gate_wait_ms").is_some())
            .count()
            >= 2
    );

    // One running agent at a time: child 1 has ended (and dropped the batch's context) before
    // children 2 and 3 load theirs, and their first requests still link to its first.
    one_at_a_time_links_to_the_first_request(&telemetry, &receiver).await;

    // A restart mid-batch: the resumed child's span stays in its caller's trace.
    let ws = tempfile::tempdir().unwrap();
    let session = create_session(&mut client, trusted_session_request(ws.path()))
        .await
        .unwrap();
    let script = "Count the runs.\n@sim tool Bash {\"command\":\"echo run >> runs.txt; sleep 1\"}\n\
                  @sim say resumed";
    let cut = fork_in_trace(&mut client, session.session_id, &[script], RESTARTED_TRACE).await;
    wait_for_path(&ws.path().join("runs.txt")).await;
    // And a parent turn, cut at its own Bash call.
    let turn_ws = tempfile::tempdir().unwrap();
    let turn_session = create_session(&mut client, trusted_session_request(turn_ws.path()))
        .await
        .unwrap();
    let mut request = tonic::Request::new(pb::SendMessageRequest {
        session_id: turn_session.session_id.clone(),
        text:
            "Turn.\n@sim tool Bash {\"command\":\"echo run >> turn.txt; sleep 1\"}\n@sim say turned"
                .into(),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TURN_TRACE}-{CALLER_SPAN}-01").parse().unwrap(),
    );
    let _stream = client.send_message(request).await.unwrap();
    wait_for_path(&turn_ws.path().join("turn.txt")).await;
    drop(client);
    // The daemon comes back with content capture on.
    daemon
        .restart(|c| c.engine.trace_content = true)
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    wait_for_batch(&mut client, &cut.batch_id, 1, Duration::from_secs(30))
        .await
        .unwrap();
    let child = cut.agent_ids[0].clone();
    let runs = eventually(Duration::from_secs(20), "the resumed child's span", || {
        telemetry.flush();
        let runs: Vec<Span> = receiver
            .spans()
            .into_iter()
            .filter(|s| s.name == "agent" && text(s, "forkd.agent.id") == Some(child.as_str()))
            .collect();
        async move { (runs.len() >= 2).then_some(runs) }
    })
    .await;
    for run in &runs {
        assert_eq!(hex(&run.trace_id), RESTARTED_TRACE, "{run:?}");
    }
    let turns = eventually(Duration::from_secs(20), "the resumed turn's span", || {
        telemetry.flush();
        let turns: Vec<Span> = receiver
            .spans()
            .into_iter()
            .filter(|s| s.name == "parent_turn" && hex(&s.trace_id) == TURN_TRACE)
            .collect();
        async move { (turns.len() >= 2).then_some(turns) }
    })
    .await;
    assert!(
        turns
            .iter()
            .any(|t| attr(t, "forkd.resumed") == Some(&Value::BoolValue(true))),
        "the resumed turn is in the trace its turn began in: {turns:?}"
    );
    let spans = receiver.spans();
    // With content capture on, the resumed child's request carries its messages and its reply.
    let captured = spans
        .iter()
        .filter(|s| runs.iter().any(|r| r.span_id == s.parent_span_id))
        .find(|s| text(s, "gen_ai.input.messages").is_some())
        .expect("a request with its messages");
    assert!(
        text(captured, "gen_ai.input.messages")
            .unwrap()
            .contains("Count the runs.")
    );
    assert!(
        text(captured, "gen_ai.output.messages")
            .unwrap()
            .contains("resumed")
    );

    // No message text: not the directives, not the file the tool read.
    for span in &spans {
        for kv in &span.attributes {
            let value = format!("{:?}", kv.value);
            assert!(
                !value.contains("Look at part") && !value.contains("Secret notes"),
                "{} carries {}: {value}",
                span.name,
                kv.key
            );
        }
    }

    // The collector goes down: a batch still completes, and what cannot be exported is counted.
    receiver.stop();
    let before = telemetry.dropped();
    let session = create_session(&mut client, session_request(workspace.path()))
        .await
        .unwrap();
    let down = client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id,
            directives: directives(&["While the collector is down."]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let done = wait_for_batch(&mut client, &down.batch_id, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(done[0].status, pb::NotificationStatus::Completed as i32);
    eventually(
        Duration::from_secs(30),
        "the dropped spans to be counted",
        || {
            telemetry.flush();
            let dropped = telemetry.dropped();
            async move { (dropped > before).then_some(()) }
        },
    )
    .await;
}

/// A batch on a daemon that runs one agent at a time: its children run one after another, each
/// loading the batch after the one before ended, and children 2 and 3's first requests link to
/// child 1's first request all the same.
async fn one_at_a_time_links_to_the_first_request(telemetry: &Telemetry, receiver: &OtlpReceiver) {
    let daemon = spawn_daemon_with(|c| c.engine.max_running_agents = Some(1))
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let session = create_session(&mut client, session_request(workspace.path()))
        .await
        .unwrap();
    let prompts = ["One.", "Two.", "Three."];
    let batch = fork_in_trace(&mut client, session.session_id, &prompts, ONE_SLOT_TRACE).await;
    wait_for_batch(&mut client, &batch.batch_id, 3, Duration::from_secs(30))
        .await
        .unwrap();
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let spans = eventually(
        Duration::from_secs(20),
        "the one-slot batch's spans",
        || {
            telemetry.flush();
            let spans: Vec<Span> = receiver
                .spans()
                .into_iter()
                .filter(|s| hex(&s.trace_id) == ONE_SLOT_TRACE)
                .collect();
            let agents = spans.iter().filter(|s| s.name == "agent").count();
            async move { (agents >= 3).then_some(spans) }
        },
    )
    .await;
    let first_request_of = |agent_id: &str| {
        let agent = spans
            .iter()
            .find(|s| s.name == "agent" && text(s, "forkd.agent.id") == Some(agent_id))
            .expect("the child's span");
        spans
            .iter()
            .filter(|s| {
                s.parent_span_id == agent.span_id
                    && text(s, "gen_ai.operation.name") == Some("chat")
            })
            .min_by_key(|s| s.start_time_unix_nano)
            .expect("the child's first request")
    };
    let writer = first_request_of(&batch.agent_ids[0]);
    for agent_id in &batch.agent_ids[1..] {
        let first = first_request_of(agent_id);
        assert!(
            first.links.iter().any(|l| l.span_id == writer.span_id),
            "{agent_id}'s first request links to child 1's: {:?}",
            first.links
        );
    }
}
