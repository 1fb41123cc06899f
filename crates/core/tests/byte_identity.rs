//! Property tests (docs/contracts.md, “The fork request”): siblings agree byte for byte up to
//! their directive, stored bytes reload unchanged, template changes never reach a child, a child's
//! later turns keep its first request's prefix, and the recursion guard recognises every child.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use forkd_core::agent::{Directive, FORK_QUERY_SOURCE};
use forkd_core::fork::{
    self, BOILERPLATE_TAG, FORK_PLACEHOLDER_RESULT, ForkBatch, ForkRefusal, ForkShape,
};
use forkd_core::ids::{AgentId, BatchId, SessionId};
use forkd_core::json::RawJson;
use forkd_core::message::{Block, Message, Role};
use forkd_core::output::OutputSchema;
use forkd_core::request::{self, BlockPos, Conversation, MAX_BREAKPOINTS, SerializedRequest};
use forkd_core::session::{
    CacheSafeParams, RenderedSystem, SystemTemplate, ThinkingConfig, ToolDef, ToolsJson,
};
use forkd_core::tools::{self, AGENT_TOOL};
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value, json};
use uuid::Uuid;

/// What the serializer splices into a block that carries a breakpoint.
const CACHE_CONTROL: &str = r#","cache_control":{"type":"ephemeral"}"#;

/// Cases per property: enough to cover the shapes, few enough for a 2-core CI box. Set
/// `PROPTEST_CASES` for a deeper run.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64)
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// Characters that stress JSON escaping and byte handling: quotes, backslashes, control
/// characters, JSON-hostile line separators, BOM, emoji and ZWJ, RTL letters and overrides.
const TRICKY: &[char] = &[
    '"',
    '\\',
    '/',
    '\n',
    '\r',
    '\t',
    '\u{0}',
    '\u{1}',
    '\u{8}',
    '\u{c}',
    '\u{1b}',
    '\u{1f}',
    '\u{7f}',
    '\u{85}',
    '\u{a0}',
    '\u{2028}',
    '\u{2029}',
    '\u{200d}',
    '\u{200f}',
    '\u{202e}',
    '\u{feff}',
    '\u{fffd}',
    '🦀',
    '🎉',
    '👩',
    '\u{1f3fd}',
    'ש',
    'ל',
    'ו',
    'م',
    'ر',
    'ح',
    'é',
    'ß',
    '中',
    '文',
    '<',
    '>',
    '&',
    '\'',
    '{',
    '}',
    '[',
    ']',
    ',',
    ':',
];

/// Strings that look like the fork tag without being it (the guard must not fire on them).
const NEAR_MISSES: &[&str] = &[
    "forkd-fork-child",
    "<forkd-fork-child",
    "</forkd-fork-child>",
    "< forkd-fork-child>",
    "<FORKD-FORK-CHILD>",
    "<forkd-fork-children>",
    "Fork started -- processing in background",
];

/// Tool names for history calls (the Agent tool included: earlier forks).
const CALL_NAMES: &[&str] = &[
    "Read",
    "Bash",
    "Grep",
    "Write",
    "mcp__db__query",
    AGENT_TOOL,
];

/// External tool names, some colliding with built-ins (the built-in must win).
const EXTERNAL_NAMES: &[&str] = &[
    "Read",
    AGENT_TOOL,
    "Bash",
    "alpha",
    "zeta",
    "mcp__gh__issue",
];

/// First characters of a non-blank directive.
const NONBLANK_FIRST: &[char] = &['🦀', 'ש', 'م', '中', '"', '\\', '\u{202e}'];

const MODELS: &[&str] = &[
    "claude-sonnet-4-5",
    "claude-opus-4-1",
    "claude-haiku-4-5",
    "sim",
];

fn tricky_char() -> impl Strategy<Value = char> {
    prop_oneof![
        5 => prop::char::range(' ', '~'),
        3 => select(TRICKY),
        1 => any::<char>(),
    ]
}

/// Up to `max` characters (so up to `4 * max` bytes).
fn text(max: usize) -> impl Strategy<Value = String> {
    vec(tricky_char(), 0..=max).prop_map(String::from_iter)
}

/// A large block, 1 KB to 50 KB: a random seed repeated, so it stays cheap to generate and shrink.
fn big_text() -> impl Strategy<Value = String> {
    (vec(tricky_char(), 1..48), 1_000usize..50_000).prop_map(|(seed, len)| {
        let seed = String::from_iter(seed);
        let mut s = String::with_capacity(len + seed.len());
        while s.len() < len {
            s.push_str(&seed);
        }
        s
    })
}

/// The text of one history block: mostly short, sometimes large, sometimes a near-miss of the tag.
fn block_text() -> impl Strategy<Value = String> {
    prop_oneof![
        16 => text(160),
        2 => big_text(),
        1 => select(NEAR_MISSES).prop_map(str::to_owned),
    ]
}

/// Text that is not blank (a valid directive prompt), of varied lengths.
fn nonblank() -> impl Strategy<Value = String> {
    let first = prop_oneof![prop::char::range('!', '~'), select(NONBLANK_FIRST),];
    let rest = prop_oneof![4 => text(40), 2 => text(400), 1 => text(3_000)];
    (first, rest).prop_map(|(c, rest)| format!("{c}{rest}"))
}

prop_compose! {
    fn directive()(description in text(40), prompt in nonblank()) -> Directive {
        Directive { description, prompt }
    }
}

prop_compose! {
    fn thinking()(thought in text(200), signature in "[A-Za-z0-9+/]{8,64}") -> (String, String) {
        (thought, signature)
    }
}

/// One tool call of the history: a tool_use and its tool_result.
#[derive(Debug, Clone)]
struct Call {
    name: String,
    arg: String,
    result: String,
    is_error: bool,
}

prop_compose! {
    fn call()(
        name in select(CALL_NAMES),
        arg in block_text(),
        result in block_text(),
        is_error in any::<bool>(),
    ) -> Call {
        Call { name: name.to_owned(), arg, result, is_error }
    }
}

/// One step of a parent's history: one message, or a tool round (two messages).
#[derive(Debug, Clone)]
enum Step {
    /// A user message of text blocks (possibly none: an empty message is skipped on the wire).
    User(Vec<String>),
    /// An assistant answer: optional thinking, then text blocks.
    Assistant {
        thinking: Option<(String, String)>,
        texts: Vec<String>,
    },
    /// An assistant message with tool_uses, then a user message with their tool_results.
    Tools {
        thinking: Option<(String, String)>,
        text: Option<String>,
        calls: Vec<Call>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        vec(block_text(), 0..=3).prop_map(Step::User),
        (option::of(thinking()), vec(block_text(), 0..=2))
            .prop_map(|(thinking, texts)| Step::Assistant { thinking, texts }),
        (
            option::of(thinking()),
            option::of(text(120)),
            vec(call(), 1..=4)
        )
            .prop_map(|(thinking, text, calls)| Step::Tools {
                thinking,
                text,
                calls,
            }),
    ]
}

/// A parent history: at most 6 steps, so at most 12 messages.
fn history() -> impl Strategy<Value = Vec<Step>> {
    vec(step(), 0..=6)
}

fn tool_input(arg: &str, n: usize) -> RawJson {
    RawJson::encode(&json!({ "arg": arg, "n": n }))
}

/// The assistant message and the user message of one tool round; ids are `toolu_{tag}_{i}`.
fn tool_round(
    tag: &str,
    thinking: &Option<(String, String)>,
    text: &Option<String>,
    calls: &[Call],
) -> [Message; 2] {
    let mut blocks = Vec::new();
    if let Some((t, s)) = thinking {
        blocks.push(Block::thinking(t, s));
    }
    if let Some(t) = text {
        blocks.push(Block::text(t));
    }
    let mut results = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        let id = format!("toolu_{tag}_{i}");
        blocks.push(Block::tool_use(&id, &c.name, &tool_input(&c.arg, i)).unwrap());
        results.push(Block::tool_result(&id, &c.result, c.is_error));
    }
    [Message::assistant(blocks), Message::user(results)]
}

fn materialize(steps: &[Step]) -> Vec<Message> {
    let mut out = Vec::new();
    for (si, step) in steps.iter().enumerate() {
        match step {
            Step::User(texts) => {
                out.push(Message::user(
                    texts.iter().map(|t| Block::text(t)).collect(),
                ));
            }
            Step::Assistant { thinking, texts } => {
                let mut blocks: Vec<Block> = thinking
                    .iter()
                    .map(|(t, s)| Block::thinking(t, s))
                    .collect();
                blocks.extend(texts.iter().map(|t| Block::text(t)));
                out.push(Message::assistant(blocks));
            }
            Step::Tools {
                thinking,
                text,
                calls,
            } => out.extend(tool_round(&format!("h{si:02}"), thinking, text, calls)),
        }
    }
    out
}

fn external_tool() -> impl Strategy<Value = ToolDef> {
    let name = prop_oneof![select(EXTERNAL_NAMES).prop_map(str::to_owned), text(24),];
    (name, text(120), any::<bool>()).prop_map(|(name, description, strict)| {
        let def = json!({
            "name": name,
            "description": description,
            "input_schema": {
                "type": "object",
                "properties": {"q": {"type": "string", "description": description}},
                "additionalProperties": strict,
            },
        });
        ToolDef::parse(&def.to_string()).unwrap()
    })
}

fn model() -> impl Strategy<Value = String> {
    prop_oneof![3 => select(MODELS).prop_map(str::to_owned), 1 => text(30)]
}

prop_compose! {
    /// A session's cache-safe params, as if rendered and assembled when it was created.
    fn params()(
        system in prop_oneof![4 => text(2_000), 1 => big_text()],
        model in model(),
        external in vec(external_tool(), 0..6),
        thinking in option::of(1_024u32..64_000),
        max_tokens in 1u32..128_000,
    ) -> CacheSafeParams {
        CacheSafeParams {
            model,
            system: RenderedSystem::from_stored(&system),
            tools: ToolsJson::assemble(tools::builtin_definitions(), external),
            thinking: thinking.map(|budget_tokens| ThinkingConfig { budget_tokens }),
            max_tokens,
        }
    }
}

/// One fork call written by the model: its directive and how the model spelled the input.
#[derive(Debug, Clone)]
struct ModelFork {
    directive: Directive,
    prompt_first: bool,
    null_subagent_type: bool,
}

/// Where the fork message `A` comes from.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant, reason = "test input, built once per case")]
enum Source {
    /// A client submitted the directives: forkd writes `A`.
    Client(Vec<Directive>),
    /// The parent model wrote `A`: thinking, text, Agent calls, perhaps other tool calls.
    Model {
        thinking: (String, String),
        text: String,
        forks: Vec<ModelFork>,
        /// A non-Agent tool_use, and whether it comes before the Agent calls.
        other: Option<(Call, bool)>,
        /// A typed Agent call (with `subagent_type`): not a child, but it gets a placeholder.
        typed: Option<Directive>,
    },
}

fn source() -> impl Strategy<Value = Source> {
    let model_fork = (directive(), any::<bool>(), any::<bool>()).prop_map(
        |(directive, prompt_first, null_subagent_type)| ModelFork {
            directive,
            prompt_first,
            null_subagent_type,
        },
    );
    prop_oneof![
        vec(directive(), 1..=32).prop_map(Source::Client),
        (
            thinking(),
            text(200),
            vec(model_fork, 1..=32),
            option::of((call(), any::<bool>())),
            option::of(directive()),
        )
            .prop_map(|(thinking, text, forks, other, typed)| Source::Model {
                thinking,
                text,
                forks,
                other,
                typed,
            }),
    ]
}

/// A schema a client might send: an object with a required enum, an array, a nested object.
fn output_schema() -> impl Strategy<Value = OutputSchema> {
    (vec("[a-z]{1,8}", 1..4), 0u64..5, any::<bool>()).prop_map(|(values, min_items, extra)| {
        let schema = json!({
            "type": "object",
            "required": ["verdict", "findings"],
            "properties": {
                "verdict": {"enum": values},
                "findings": {"type": "array", "minItems": min_items, "items": {"type": "string"}},
                "detail": {"type": "object", "properties": {"line": {"type": "integer"}}}
            },
            "additionalProperties": extra
        });
        OutputSchema::from_value(&schema).expect("a valid schema")
    })
}

/// Everything one fork case is built from.
#[derive(Debug, Clone)]
struct Case {
    steps: Vec<Step>,
    params: CacheSafeParams,
    source: Source,
    batch: u128,
    session: u128,
}

prop_compose! {
    fn case()(
        steps in history(),
        params in params(),
        source in source(),
        batch in any::<u128>(),
        session in any::<u128>(),
    ) -> Case {
        Case { steps, params, source, batch, session }
    }
}

/// A child's own later turns: tool rounds appended after its first request.
#[derive(Debug, Clone)]
struct OwnTurn {
    thinking: Option<(String, String)>,
    text: Option<String>,
    calls: Vec<Call>,
}

fn own_turns() -> impl Strategy<Value = Vec<OwnTurn>> {
    vec(
        (
            option::of(thinking()),
            option::of(text(120)),
            vec(call(), 1..=3),
        )
            .prop_map(|(thinking, text, calls)| OwnTurn {
                thinking,
                text,
                calls,
            }),
        1..=3,
    )
}

fn own_messages(turns: &[OwnTurn]) -> Vec<Message> {
    turns
        .iter()
        .enumerate()
        .flat_map(|(i, t)| tool_round(&format!("c{i:02}"), &t.thinking, &t.text, &t.calls))
        .collect()
}

/// A template edit that really changes the rendered text.
#[derive(Debug, Clone)]
enum Mutation {
    Base(String),
    Date(String),
    Workspace(String),
    Model(String),
    Coordinator,
    EnvInsert(String, String),
    EnvChange(usize, String),
    EnvRemove(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        nonblank().prop_map(Mutation::Base),
        nonblank().prop_map(Mutation::Date),
        nonblank().prop_map(Mutation::Workspace),
        nonblank().prop_map(Mutation::Model),
        Just(Mutation::Coordinator),
        (text(12), text(40)).prop_map(|(k, v)| Mutation::EnvInsert(k, v)),
        (any::<usize>(), nonblank()).prop_map(|(i, v)| Mutation::EnvChange(i, v)),
        any::<usize>().prop_map(Mutation::EnvRemove),
    ]
}

impl Mutation {
    /// Applies the edit. Every arm makes the rendered text longer, shorter or differently worded,
    /// so a re-render must differ (appending a non-blank suffix survives `base.trim_end()`).
    fn apply(&self, t: &mut SystemTemplate) {
        match self {
            Mutation::Base(s) => t.base.push_str(s),
            Mutation::Date(s) => t.date.push_str(s),
            Mutation::Workspace(s) => t.workspace.push_str(s),
            Mutation::Model(s) => t.model.push_str(s),
            Mutation::Coordinator => t.coordinator = !t.coordinator,
            Mutation::EnvInsert(k, v) => insert_new_key(&mut t.environment, k, v),
            Mutation::EnvChange(i, s) => {
                let n = i % t.environment.len().max(1);
                match t.environment.values_mut().nth(n) {
                    Some(v) => v.push_str(s),
                    None => insert_new_key(&mut t.environment, "changed", s),
                }
            }
            Mutation::EnvRemove(i) => match t
                .environment
                .keys()
                .nth(i % t.environment.len().max(1))
                .cloned()
            {
                Some(k) => {
                    t.environment.remove(&k);
                }
                None => insert_new_key(&mut t.environment, "removed", "none"),
            },
        }
    }
}

fn insert_new_key(env: &mut BTreeMap<String, String>, key: &str, value: &str) {
    let mut key = key.to_owned();
    while env.contains_key(&key) {
        key.push('+');
    }
    env.insert(key, value.to_owned());
}

prop_compose! {
    fn template()(
        base in prop_oneof![4 => text(600), 1 => big_text()],
        date in "20[0-9]{2}-[01][0-9]-[0-3][0-9]",
        workspace in text(40),
        model in model(),
        coordinator in any::<bool>(),
        environment in btree_map(text(12), text(40), 0..4),
    ) -> SystemTemplate {
        SystemTemplate { base, date, workspace, model, coordinator, environment }
    }
}

// ---------------------------------------------------------------------------------------------
// Building forks
// ---------------------------------------------------------------------------------------------

/// A built fork: the parent's history, the batch and the children's directives.
struct Fork {
    history: Vec<Message>,
    batch: ForkBatch,
    children: Vec<Directive>,
}

/// The fork message as the parent model would have written it.
fn model_fork_message(
    thinking: &(String, String),
    text: &str,
    forks: &[ModelFork],
    other: &Option<(Call, bool)>,
    typed: &Option<Directive>,
) -> Message {
    let mut calls = Vec::new();
    for (i, f) in forks.iter().enumerate() {
        let mut input = Map::new();
        let (d, p) = (
            Value::from(f.directive.description.as_str()),
            Value::from(f.directive.prompt.as_str()),
        );
        if f.prompt_first {
            input.insert("prompt".into(), p);
            input.insert("description".into(), d);
        } else {
            input.insert("description".into(), d);
            input.insert("prompt".into(), p);
        }
        if f.null_subagent_type {
            input.insert("subagent_type".into(), Value::Null);
        }
        let input = RawJson::encode(&Value::Object(input));
        calls.push(Block::tool_use(&format!("toolu_m{i:02}"), AGENT_TOOL, &input).unwrap());
    }
    if let Some(d) = typed {
        let input = RawJson::encode(&json!({
            "description": d.description,
            "prompt": d.prompt,
            "subagent_type": "Explore",
        }));
        calls.insert(
            calls.len() / 2,
            Block::tool_use("toolu_typed", AGENT_TOOL, &input).unwrap(),
        );
    }
    if let Some((c, before)) = other {
        // Not an Agent call: an Agent call without subagent_type would be one more child.
        let name = if c.name == AGENT_TOOL {
            "Read"
        } else {
            &c.name
        };
        let block = Block::tool_use("toolu_other", name, &tool_input(&c.arg, 0)).unwrap();
        if *before {
            calls.insert(0, block);
        } else {
            calls.push(block);
        }
    }
    let mut blocks = vec![Block::thinking(&thinking.0, &thinking.1), Block::text(text)];
    blocks.extend(calls);
    Message::assistant(blocks)
}

fn build(case: &Case) -> Result<Fork, TestCaseError> {
    let history = materialize(&case.steps);
    let batch_id = BatchId::from_uuid(Uuid::from_u128(case.batch));
    let (assistant, expected) = match &case.source {
        Source::Client(directives) => {
            fork::validate_directives(directives, usize::MAX)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            (
                fork::client_fork_message(batch_id, directives),
                directives.clone(),
            )
        }
        Source::Model {
            thinking,
            text,
            forks,
            other,
            typed,
        } => (
            model_fork_message(thinking, text, forks, other, typed),
            forks.iter().map(|f| f.directive.clone()).collect(),
        ),
    };
    let batch = ForkBatch::new(
        batch_id,
        SessionId::from_uuid(Uuid::from_u128(case.session)),
        history.len() as u64,
        assistant,
        0,
    )
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let children: Vec<Directive> = fork::fork_directives(batch.assistant().unwrap())
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    prop_assert_eq!(
        &children,
        &expected,
        "the batch's children are its fork calls"
    );
    prop_assert_eq!(
        batch.shared_user_blocks.len(),
        batch.assistant().unwrap().tool_uses().count() + 1,
        "a placeholder per tool_use, then the boilerplate"
    );
    Ok(Fork {
        history,
        batch,
        children,
    })
}

/// Where the directive block of a child's `U` sits (the boilerplate is the block before it).
fn directive_pos(fork: &Fork) -> BlockPos {
    BlockPos {
        message: fork.history.len() + 1,
        block: fork.batch.shared_user_blocks.len(),
    }
}

fn before(pos: BlockPos) -> BlockPos {
    BlockPos {
        message: pos.message,
        block: pos.block - 1,
    }
}

fn child_request(
    params: &CacheSafeParams,
    fork: &Fork,
    directive: &Directive,
    own: &[Message],
) -> (Conversation, SerializedRequest) {
    let block = ForkBatch::directive_block(directive);
    let conv = fork.batch.child_conversation(&fork.history, &block, own);
    let req = request::serialize(params, &conv, true);
    (conv, req)
}

/// A block's bytes with a breakpoint spliced in, as the serializer must write them.
fn with_breakpoint(raw: &str) -> String {
    format!("{}{CACHE_CONTROL}}}", &raw[..raw.len() - 1])
}

// ---------------------------------------------------------------------------------------------
// The store round trip: every value as the text forkd would persist, and back
// ---------------------------------------------------------------------------------------------

struct Stored {
    model: String,
    system: String,
    tools: String,
    thinking: Option<u32>,
    max_tokens: u32,
    history: Vec<(&'static str, String)>,
    assistant: String,
    shared_user_blocks: String,
    batch: (String, String, u64, i64),
}

fn store(params: &CacheSafeParams, fork: &Fork) -> Stored {
    Stored {
        model: params.model.clone(),
        system: params.system.as_str().to_owned(),
        tools: params.tools.raw().as_str().to_owned(),
        thinking: params.thinking.map(|t| t.budget_tokens),
        max_tokens: params.max_tokens,
        history: fork
            .history
            .iter()
            .map(|m| (m.role.as_str(), m.content_json()))
            .collect(),
        assistant: fork.batch.assistant().unwrap().content_json(),
        shared_user_blocks: Message::user(fork.batch.shared_user_blocks.clone()).content_json(),
        batch: (
            fork.batch.id.to_string(),
            fork.batch.session_id.to_string(),
            fork.batch.fork_point,
            fork.batch.created_at_ms,
        ),
    }
}

fn load_params(s: &Stored) -> CacheSafeParams {
    CacheSafeParams {
        model: s.model.clone(),
        system: RenderedSystem::from_stored(&s.system),
        tools: ToolsJson::from_stored(&s.tools).unwrap(),
        thinking: s
            .thinking
            .map(|budget_tokens| ThinkingConfig { budget_tokens }),
        max_tokens: s.max_tokens,
    }
}

fn load(s: &Stored, children: &[Directive]) -> Fork {
    let history = s
        .history
        .iter()
        .map(|(role, content)| Message::from_stored(Role::parse(role).unwrap(), content).unwrap())
        .collect();
    let shared = Message::from_stored(Role::User, &s.shared_user_blocks).unwrap();
    let batch = ForkBatch {
        id: BatchId::parse(&s.batch.0).unwrap(),
        session_id: SessionId::parse(&s.batch.1).unwrap(),
        fork_point: s.batch.2,
        compacted_to: None,
        shape: ForkShape::Model {
            assistant: Message::from_stored(Role::Assistant, &s.assistant).unwrap(),
        },
        shared_user_blocks: shared.blocks,
        output_schema: None,
        trace_parent: None,
        created_at_ms: s.batch.3,
    };
    Fork {
        history,
        batch,
        children: children.to_vec(),
    }
}

// ---------------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------------

/// Byte equality with a readable failure: the first differing byte and some context.
fn same_bytes(actual: &str, expected: &str, what: &str) -> Result<(), TestCaseError> {
    if actual == expected {
        return Ok(());
    }
    let at = actual
        .bytes()
        .zip(expected.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(actual.len().min(expected.len()));
    let around = |s: &str| {
        let b = s.as_bytes();
        String::from_utf8_lossy(&b[at.saturating_sub(40)..(at + 40).min(b.len())]).into_owned()
    };
    Err(TestCaseError::fail(format!(
        "{what}: bytes differ at {at} (lengths {} vs {}): {:?} vs {:?}",
        actual.len(),
        expected.len(),
        around(actual),
        around(expected),
    )))
}

/// How many objects in a JSON value carry `key`.
fn count_key(value: &Value, key: &str) -> usize {
    match value {
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| usize::from(k == key) + count_key(v, key))
            .sum(),
        Value::Array(items) => items.iter().map(|v| count_key(v, key)).sum(),
        _ => 0,
    }
}

/// The body is valid JSON with at most four breakpoints, one per planned block plus the system's.
fn check_body(params: &CacheSafeParams, req: &SerializedRequest) -> Result<Value, TestCaseError> {
    let value: Value = serde_json::from_str(&req.body)
        .map_err(|e| TestCaseError::fail(format!("body is not JSON: {e}")))?;
    let breakpoints = count_key(&value, "cache_control");
    prop_assert!(breakpoints <= MAX_BREAKPOINTS, "{breakpoints} breakpoints");
    prop_assert_eq!(breakpoints, req.breakpoints.len() + 1);
    prop_assert_eq!(req.body.matches(r#""cache_control":"#).count(), breakpoints);
    // Thinking blocks cannot carry a breakpoint, and roles alternate (same-role runs are merged).
    let messages = value["messages"].as_array().expect("messages array");
    for pair in messages.windows(2) {
        prop_assert_ne!(
            &pair[0]["role"],
            &pair[1]["role"],
            "consecutive messages share a role"
        );
    }
    for block in messages
        .iter()
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
    {
        if block["type"] == "thinking" || block["type"] == "redacted_thinking" {
            prop_assert!(
                block.get("cache_control").is_none(),
                "a thinking block carries a breakpoint"
            );
        }
    }
    prop_assert_eq!(value["model"].as_str(), Some(params.model.as_str()));
    prop_assert_eq!(
        value["system"][0]["text"].as_str(),
        Some(params.system.as_str())
    );
    prop_assert_eq!(&value["tools"], &params.tools.raw().value());
    Ok(value)
}

fn check_siblings(case: &Case) -> Result<(), TestCaseError> {
    let params = &case.params;
    let fork = build(case)?;
    let dir = directive_pos(&fork);
    let boiler = before(dir);
    // The parent's own last request: the request that produced `A`.
    let parent = request::serialize(params, &Conversation::plain(fork.history.clone()), true);
    // The same fork, stored as text and loaded back.
    let stored = store(params, &fork);
    let (params2, fork2) = (load_params(&stored), load(&stored, &fork.children));
    let rebuilt = ForkBatch::new(
        fork2.batch.id,
        fork2.batch.session_id,
        fork2.batch.fork_point,
        fork2.batch.assistant().unwrap().clone(),
        fork2.batch.created_at_ms,
    )
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(
        &rebuilt,
        &fork.batch,
        "a batch rebuilt from the stored A is the same"
    );

    let mut first: Option<String> = None;
    for d in &fork.children {
        let (conv, req) = child_request(params, &fork, d, &[]);
        let last = conv.messages.len() - 1;
        prop_assert_eq!(
            dir,
            BlockPos {
                message: last,
                block: conv.messages[last].blocks.len() - 1
            },
            "the directive is the last block of the last message"
        );
        let span = req.span(dir).expect("directive span");
        let boiler_span = req.span(boiler).expect("boilerplate span");

        // Byte identity with every sibling up to the directive's first byte.
        let prefix = &req.body[..span.start];
        match &first {
            None => first = Some(prefix.to_owned()),
            Some(p) => {
                prop_assert_eq!(span.start, p.len(), "directive offsets differ");
                same_bytes(prefix, p, "sibling prefix")?;
            }
        }
        prop_assert_eq!(
            req.prefix_fingerprint(dir),
            Some(request::fingerprint(prefix.as_bytes()))
        );

        // Only the directive follows: its own bytes with its breakpoint, then the closers.
        let block = ForkBatch::directive_block(d);
        same_bytes(
            &req.body[span.start..span.end],
            &with_breakpoint(block.raw().as_str()),
            "directive block",
        )?;
        prop_assert_eq!(&req.body[span.end..], "]}]}");

        // The boilerplate and the directive carry breakpoints.
        prop_assert!(req.breakpoints.contains(&dir));
        prop_assert!(req.breakpoints.contains(&boiler));
        same_bytes(
            &req.body[boiler_span.start..boiler_span.end],
            &with_breakpoint(fork.batch.shared_user_blocks[boiler.block].raw().as_str()),
            "boilerplate block",
        )?;

        let value = check_body(params, &req)?;
        let content = value["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_array())
            .expect("last message content");
        prop_assert_eq!(
            content.last().and_then(|b| b["text"].as_str()),
            Some(d.prompt.as_str())
        );
        let placeholders = content
            .iter()
            .filter(|b| b["content"].as_str() == Some(FORK_PLACEHOLDER_RESULT))
            .count();
        prop_assert_eq!(
            placeholders,
            fork.batch.assistant().unwrap().tool_uses().count()
        );

        // The parent's own last request is a byte prefix of the child's (its cache entry).
        if let Some(p) = parent.spans.last() {
            same_bytes(&req.body[..p.end], &parent.body[..p.end], "parent prefix")?;
        }

        // Storing and reloading changes nothing.
        let reloaded_block = Block::from_stored(block.raw().as_str()).unwrap();
        let conv2 = fork2
            .batch
            .child_conversation(&fork2.history, &reloaded_block, &[]);
        let req2 = request::serialize(&params2, &conv2, true);
        same_bytes(&req2.body[..span.start], prefix, "reloaded prefix")?;
        same_bytes(&req2.body, &req.body, "reloaded body")?;
    }

    // Ingesting forkd's own bytes (the client path) is a fixed point too.
    for block in fork.history.iter().flat_map(|m| m.blocks.iter()) {
        let ingested = Block::parse(block.raw().as_str()).unwrap();
        same_bytes(
            ingested.raw().as_str(),
            block.raw().as_str(),
            "ingested block",
        )?;
    }
    Ok(())
}

/// A session's params, rendered from its template once, at creation.
fn create_session(t: &SystemTemplate, external: Vec<ToolDef>, max_tokens: u32) -> CacheSafeParams {
    CacheSafeParams {
        model: t.model.clone(),
        system: t.render(),
        tools: ToolsJson::assemble(tools::builtin_definitions(), external),
        thinking: Some(ThinkingConfig {
            budget_tokens: 2_048,
        }),
        max_tokens,
    }
}

fn bodies(params: &CacheSafeParams, fork: &Fork) -> Vec<String> {
    fork.children
        .iter()
        .map(|d| child_request(params, fork, d, &[]).1.body)
        .collect()
}

/// Where the system prompt's text starts in a body.
fn system_text_range(body: &str) -> (usize, usize) {
    let start = body
        .find(r#""system":[{"type":"text","text":"#)
        .expect("system field")
        + r#""system":[{"type":"text","text":"#.len();
    let end = body.find(r#""messages":["#).expect("messages field");
    (start, end)
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Siblings agree byte for byte up to their directive block, the shared blocks and the
    /// directive carry breakpoints (at most four in all), the body is JSON, the parent's last
    /// request is a prefix of every child's, and a store round trip changes no byte.
    #[test]
    fn siblings_are_byte_identical_up_to_their_directive(case in case()) {
        check_siblings(&case)?;
    }

    /// An output schema keeps the cache: a client batch's children have the same bytes with and
    /// without one up to the end of the boilerplate; with one, siblings agree up to their
    /// directive, and the shared breakpoint sits on the schema block, which is the same for all.
    #[test]
    fn an_output_schema_keeps_the_shared_prefix(
        steps in history(),
        params in params(),
        directives in vec(directive(), 1..=16),
        schema in output_schema(),
        batch in any::<u128>(),
    ) {
        let history = materialize(&steps);
        let id = BatchId::from_uuid(Uuid::from_u128(batch));
        let session = SessionId::from_uuid(Uuid::from_u128(7));
        let plain = ForkBatch::client(id, session, history.len() as u64, 0);
        let shaped = plain.clone().with_output_schema(Some(schema.clone()));
        let dir = shaped.directive_pos(&history);
        let schema_pos = before(dir);
        let boiler = before(schema_pos);
        prop_assert_eq!(plain.directive_pos(&history), schema_pos);
        let mut first: Option<String> = None;
        for d in &directives {
            let block = ForkBatch::directive_block(d);
            let without = request::serialize(&params, &plain.child_conversation(&history, &block, &[]), true);
            let with = request::serialize(&params, &shaped.child_conversation(&history, &block, &[]), true);
            // The same bytes up to the boilerplate, and the boilerplate's own (its breakpoint
            // moved on to the schema block).
            let (b_without, b_with) = (without.span(boiler).expect("boilerplate"), with.span(boiler).expect("boilerplate"));
            same_bytes(&with.body[..b_with.start], &without.body[..b_without.start], "bytes before the boilerplate")?;
            same_bytes(
                &with.body[b_with.start..b_with.end],
                &without.body[b_without.start..b_without.end].replacen(CACHE_CONTROL, "", 1),
                "the boilerplate, breakpoint removed",
            )?;
            prop_assert!(with.breakpoints.contains(&schema_pos), "the schema block is the shared entry");
            prop_assert!(!with.breakpoints.contains(&boiler));
            let span = with.span(schema_pos).expect("schema block");
            same_bytes(&with.body[span.start..span.end], &with_breakpoint(schema.block().raw().as_str()), "schema block")?;
            let dir_span = with.span(dir).expect("directive");
            let prefix = &with.body[..dir_span.start];
            match &first {
                None => first = Some(prefix.to_owned()),
                Some(p) => same_bytes(prefix, p, "sibling prefix with a schema")?,
            }
            check_body(&params, &with)?;
        }
    }

    /// The system prompt is rendered once: editing any template input later changes no child's
    /// bytes, while a re-render would.
    #[test]
    fn template_changes_never_reach_a_child(
        template in template(),
        mutation in mutation(),
        steps in vec(step(), 0..=3),
        directives in vec(directive(), 1..=4),
        external in vec(external_tool(), 0..3),
        max_tokens in 1u32..128_000,
        batch in any::<u128>(),
    ) {
        let params = create_session(&template, external, max_tokens);
        let case = Case {
            steps,
            params: params.clone(),
            source: Source::Client(directives),
            batch,
            session: 7,
        };
        let fork = build(&case)?;
        let before = bodies(&params, &fork);

        let mut edited = template.clone();
        mutation.apply(&mut edited);
        prop_assert_ne!(&edited, &template);
        let stored = load_params(&store(&params, &fork));
        for (after, before) in bodies(&stored, &fork).iter().zip(&before) {
            same_bytes(after, before, "child after a template edit")?;
        }

        // The contrast: re-rendering the edited template would change every child's bytes, and
        // the first change would be inside the system prompt.
        let rerendered = CacheSafeParams { system: edited.render(), ..params.clone() };
        prop_assert_ne!(rerendered.system.as_str(), params.system.as_str());
        for (after, before) in bodies(&rerendered, &fork).iter().zip(&before) {
            prop_assert_ne!(after, before);
            let at = after
                .bytes()
                .zip(before.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(after.len().min(before.len()));
            let (start, end) = system_text_range(before);
            prop_assert!(start <= at && at < end, "first change at {at}, system is {start}..{end}");
        }
    }

    /// A child's later turns keep its first request's bytes up to its directive, and the
    /// directive block's own bytes (the breakpoint moves on to the newest block).
    #[test]
    fn later_turns_keep_the_first_requests_prefix(
        case in case(),
        turns in own_turns(),
        pick in any::<prop::sample::Index>(),
    ) {
        let params = &case.params;
        let fork = build(&case)?;
        let d = pick.get(&fork.children);
        let own = own_messages(&turns);
        let dir = directive_pos(&fork);
        let boiler = before(dir);
        let block = ForkBatch::directive_block(d);

        let (_, first) = child_request(params, &fork, d, &[]);
        let first_span = first.span(dir).expect("directive span");
        let mut previous = first.clone();
        // One request per own turn: after each tool round's results.
        for upto in (2..=own.len()).step_by(2) {
            let (conv, later) = child_request(params, &fork, d, &own[..upto]);
            let span = later.span(dir).expect("directive span");
            prop_assert_eq!(span.start, first_span.start);
            same_bytes(&later.body[..span.start], &first.body[..span.start], "prefix before the directive")?;
            same_bytes(&later.body[span.start..span.end], block.raw().as_str(), "directive without breakpoint")?;
            same_bytes(
                &first.body[first_span.start..first_span.end].replacen(CACHE_CONTROL, "", 1),
                &later.body[span.start..span.end],
                "first request's directive, breakpoint removed",
            )?;

            // Each turn's request extends the previous one up to the previous last block.
            let prev_last = *previous.spans.last().expect("spans");
            same_bytes(
                &later.body[..prev_last.start],
                &previous.body[..prev_last.start],
                "previous turn's prefix",
            )?;

            // The breakpoints: the shared ones stay, the directive's moves to the newest block.
            let last = BlockPos {
                message: conv.messages.len() - 1,
                block: conv.messages[conv.messages.len() - 1].blocks.len() - 1,
            };
            prop_assert!(later.breakpoints.contains(&last));
            prop_assert!(later.breakpoints.contains(&boiler));
            prop_assert!(!later.breakpoints.contains(&dir));
            let shared_before: Vec<_> = first.breakpoints.iter().filter(|p| **p != dir).collect();
            let shared_after: Vec<_> = later.breakpoints.iter().filter(|p| **p != last).collect();
            prop_assert_eq!(shared_before, shared_after);
            check_body(params, &later)?;
            previous = later;
        }
    }

    /// The recursion guard: every child's conversation holds the boilerplate tag (at its first
    /// request, at later turns, after a store round trip); the parent's never does.
    #[test]
    fn the_guard_refuses_every_child_and_no_parent(case in case(), turns in own_turns()) {
        let fork = build(&case)?;
        let open = format!("<{BOILERPLATE_TAG}>");
        let tagged = |m: &Message| m.content_json().contains(&open);
        prop_assume!(!fork.history.iter().any(tagged));

        prop_assert_eq!(fork::fork_refusal(None, &fork.history), None);
        prop_assert_eq!(
            fork::fork_refusal(Some(FORK_QUERY_SOURCE), &fork.history),
            Some(ForkRefusal::QuerySource)
        );
        // The parent's own transcript after the fork: A, then async_launched results.
        let launched: Vec<(String, AgentId)> = fork::fork_directives(fork.batch.assistant().unwrap())
            .into_iter()
            .map(|(id, _)| (id, AgentId::from_uuid(Uuid::from_u128(1))))
            .collect();
        let mut parent = fork.history.clone();
        parent.push(fork.batch.assistant().unwrap().clone());
        parent.push(fork.batch.parent_results(&launched));
        prop_assert_eq!(fork::fork_refusal(None, &parent), None);

        let own = own_messages(&turns);
        let stored = store(&case.params, &fork);
        let reloaded = load(&stored, &fork.children);
        for d in &fork.children {
            for own in [&[][..], &own[..]] {
                let (conv, _) = child_request(&case.params, &fork, d, own);
                prop_assert_eq!(
                    fork::fork_refusal(None, &conv.messages),
                    Some(ForkRefusal::BoilerplateInMessages)
                );
                let (conv, _) = child_request(&case.params, &reloaded, d, own);
                prop_assert_eq!(
                    fork::fork_refusal(None, &conv.messages),
                    Some(ForkRefusal::BoilerplateInMessages)
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A concrete example, spelled out
// ---------------------------------------------------------------------------------------------

/// Three children of a one-message session: the exact wire bytes before the first message (model,
/// max_tokens, stream, thinking, tools, system) and the exact `U` message of each child.
#[test]
fn three_children_wire_format() {
    let agent = tools::builtin_definitions()
        .into_iter()
        .find(|t| t.name == AGENT_TOOL)
        .unwrap();
    let search = ToolDef::parse(
        r#"{"name": "mcp__docs__search", "description": "Search the docs.",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}"#,
    )
    .unwrap();
    let params = CacheSafeParams {
        model: "claude-sonnet-4-5".into(),
        system: RenderedSystem::from_stored("You are a careful engineer.\nToday: 2026-01-02"),
        tools: ToolsJson::assemble(vec![agent], vec![search]),
        thinking: None,
        max_tokens: 8_192,
    };
    let batch_id = BatchId::from_uuid(Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001));
    let directives: Vec<Directive> = ["Fix \"parser\" tests", "Review src/io.rs", "Ünïcödé 🦀"]
        .iter()
        .enumerate()
        .map(|(i, p)| Directive {
            description: format!("part {i}"),
            prompt: (*p).to_owned(),
        })
        .collect();
    let a = fork::client_fork_message(batch_id, &directives);
    let batch =
        ForkBatch::new(batch_id, SessionId::from_uuid(Uuid::from_u128(2)), 1, a, 0).unwrap();
    let history = vec![Message::user(vec![Block::text("Split the work in three.")])];

    let expected_prefix = concat!(
        r#"{"model":"claude-sonnet-4-5","max_tokens":8192,"stream":true,"tools":["#,
        r#"{"name":"Agent","description":"Start an agent. Without subagent_type the agent is a fork "#,
        r#"of you: it inherits your whole context and works in the background. Call it several "#,
        r#"times in one message to fork a batch. With subagent_type it is a typed agent with its "#,
        r#"own prompt and tools; you get its report as the call's result.","#,
        r#""input_schema":{"type":"object","properties":{"description":"#,
        r#"{"type":"string","description":"A short (3-5 word) description of the task."},"#,
        r#""prompt":{"type":"string","description":"The task for the agent."},"subagent_type":"#,
        r#"{"type":"string"},"isolation":{"type":"string","enum":["copy","none"],"description":"#,
        r#""copy: the agent works in its own copy of the workspace, at the same path; its edits are "#,
        r#"kept apart until applied. Default none."},"output_schema":{"type":"object","description":"#,
        r#""With subagent_type only: a JSON Schema (draft 2020-12) the agent's final reply must be "#,
        r#"an object valid against; its report then carries that object."},"timeout":"#,
        r#"{"type":"integer","description":"Seconds the agent may run; past them it ends timed_out "#,
        r#"with what it has so far. Default: the daemon's."}},"#,
        r#""required":["description","prompt"]}},"#,
        r#"{"name":"mcp__docs__search","description":"Search the docs.","input_schema":"#,
        r#"{"type":"object","properties":{"q":{"type":"string"}}}}],"#,
        r#""system":[{"type":"text","text":"You are a careful engineer.\nToday: 2026-01-02","#,
        r#""cache_control":{"type":"ephemeral"}}],"messages":["#,
    );
    let expected_history_and_a = concat!(
        r#"{"role":"user","content":[{"type":"text","text":"Split the work in three.","#,
        r#""cache_control":{"type":"ephemeral"}}]},"#,
        r#"{"role":"assistant","content":["#,
        r#"{"type":"tool_use","id":"toolu_01900000000070008000000000000001_000","name":"Agent","#,
        r#""input":{"description":"part 0","prompt":"Fix \"parser\" tests"}},"#,
        r#"{"type":"tool_use","id":"toolu_01900000000070008000000000000001_001","name":"Agent","#,
        r#""input":{"description":"part 1","prompt":"Review src/io.rs"}},"#,
        r#"{"type":"tool_use","id":"toolu_01900000000070008000000000000001_002","name":"Agent","#,
        r#""input":{"description":"part 2","prompt":"Ünïcödé 🦀"}}]},"#,
        r#"{"role":"user","content":["#,
        r#"{"type":"tool_result","tool_use_id":"toolu_01900000000070008000000000000001_000","#,
        r#""content":"Fork started -- processing in background"},"#,
        r#"{"type":"tool_result","tool_use_id":"toolu_01900000000070008000000000000001_001","#,
        r#""content":"Fork started -- processing in background"},"#,
        r#"{"type":"tool_result","tool_use_id":"toolu_01900000000070008000000000000001_002","#,
        r#""content":"Fork started -- processing in background"},"#,
    );
    let boilerplate = format!(
        r#"{{"type":"text","text":{},"cache_control":{{"type":"ephemeral"}}}},"#,
        serde_json::to_string(&fork::boilerplate_text()).unwrap()
    );
    let expected_directives = [
        r#"{"type":"text","text":"Fix \"parser\" tests","cache_control":{"type":"ephemeral"}}]}]}"#,
        r#"{"type":"text","text":"Review src/io.rs","cache_control":{"type":"ephemeral"}}]}]}"#,
        r#"{"type":"text","text":"Ünïcödé 🦀","cache_control":{"type":"ephemeral"}}]}]}"#,
    ];

    for (d, tail) in directives.iter().zip(expected_directives) {
        let block = ForkBatch::directive_block(d);
        let conv = batch.child_conversation(&history, &block, &[]);
        let req = request::serialize(&params, &conv, true);
        let expected = format!("{expected_prefix}{expected_history_and_a}{boilerplate}{tail}");
        assert_eq!(req.body, expected);
        assert_eq!(req.body.matches("cache_control").count(), MAX_BREAKPOINTS);
    }
}
