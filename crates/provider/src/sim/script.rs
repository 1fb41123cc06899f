//! The sim's script language (docs/contracts.md): parsing `@sim` lines into turns, and the modifiers
//! (`think`, `sleep`, `fail`) that attach to the response of the turn that follows them.

use std::time::Duration;

use forkd_core::RawJson;

/// The tool name of `@sim agent` lines.
const AGENT: &str = "Agent";

/// One tool_use the script asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub name: String,
    /// The input object, compact JSON.
    pub input: String,
}

/// A scripted failure: the first `times` requests at its step fail with `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fail {
    /// Index of the script line, part of the key its consumed count is kept under.
    pub line: usize,
    pub status: u16,
    pub times: u32,
    /// The `retry-after` the failure carries: as the script says, else one second for a 429
    /// and none for the others.
    pub retry_after: Option<Duration>,
}

/// What shapes one response besides its content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Mods {
    /// Thinking text the response starts with (several `think` lines joined by newlines).
    pub think: Option<String>,
    /// The response streams over this long, whatever the speed.
    pub sleep: Option<Duration>,
    pub fails: Vec<Fail>,
    /// The response stops sending after its first token and never ends (a stalled stream).
    pub stall: bool,
}

/// One assistant turn of tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Turn {
    pub calls: Vec<Call>,
    pub mods: Mods,
}

/// A parsed script: its tool turns, then the final answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Script {
    pub turns: Vec<Turn>,
    pub final_mods: Mods,
    /// The `say` lines, for the final answer's Result.
    pub say: Vec<String>,
    /// The `json` lines, in order, as compact JSON objects: the k-th final answer (the first
    /// after the tool turns is k = 0; one after a follow-up is k = 1) is the k-th, clamped to the
    /// last.
    pub json: Vec<String>,
}

/// A script that cannot be run: which line (1-based) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScriptError {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// The `@sim` lines of a text: (line index, what follows `@sim `).
pub(crate) fn sim_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| Some((i, l.trim().strip_prefix("@sim ")?.trim())))
}

/// Whether a text holds a script.
pub(crate) fn has_script(text: &str) -> bool {
    sim_lines(text).next().is_some()
}

fn object(json: &str) -> Result<String, String> {
    let json = if json.is_empty() { "{}" } else { json };
    let raw = RawJson::parse(json).map_err(|e| format!("bad JSON: {e}"))?;
    raw.expect_object().map_err(|e| format!("bad JSON: {e}"))?;
    Ok(raw.as_str().to_owned())
}

fn duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("bad duration {text:?} (use e.g. 500ms, 3s, 2m)");
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" | "" => number,
        "m" => number * 60.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| bad())
}

fn fail(line: usize, args: &str) -> Result<Fail, String> {
    let mut words = args.split_whitespace();
    let status = words
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|s| (400..600).contains(s))
        .ok_or_else(|| format!("bad fail status in {args:?} (use e.g. 529 x2)"))?;
    let mut next = words.next();
    let times = match next.filter(|w| *w != "retry-after") {
        None => 1,
        Some(w) => {
            next = words.next();
            w.strip_prefix('x')
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("bad fail count {w:?} (use e.g. x2)"))?
        }
    };
    let retry_after = match next {
        None => (status == 429).then_some(Duration::from_secs(1)),
        Some("retry-after") => {
            let d = words
                .next()
                .ok_or("retry-after needs a duration (use e.g. retry-after 3s)")?;
            Some(duration(d)?)
        }
        Some(extra) => return Err(format!("unexpected {extra:?} after fail count")),
    };
    if let Some(extra) = words.next() {
        return Err(format!("unexpected {extra:?} after retry-after"));
    }
    Ok(Fail {
        line,
        status,
        times,
        retry_after,
    })
}

/// Which kind of line extends the open turn: consecutive lines of one kind form one turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    Tool,
    Agent,
}

/// Parses a script text. Lines without `@sim ` are ignored (they are the directive's prose).
pub(crate) fn parse(text: &str) -> Result<Script, ScriptError> {
    let mut script = Script::default();
    let mut pending = Mods::default();
    let mut open: Option<(Group, Turn)> = None;
    for (line, rest) in sim_lines(text) {
        let err = |message: String| ScriptError {
            line: line + 1,
            message,
        };
        let (verb, args) = rest
            .split_once(char::is_whitespace)
            .map_or((rest, ""), |(v, a)| (v, a.trim()));
        let call = match verb {
            "tool" => {
                let (name, json) = args
                    .split_once(char::is_whitespace)
                    .map_or((args, ""), |(n, j)| (n, j.trim()));
                if name.is_empty() {
                    return Err(err("tool needs a NAME".into()));
                }
                let input = object(json).map_err(&err)?;
                Some((
                    Group::Tool,
                    Call {
                        name: name.into(),
                        input,
                    },
                ))
            }
            "agent" => Some((
                Group::Agent,
                Call {
                    name: AGENT.into(),
                    input: object(args).map_err(&err)?,
                },
            )),
            _ => None,
        };
        if let Some((group, call)) = call {
            match &mut open {
                Some((g, turn)) if *g == group => turn.calls.push(call),
                _ => {
                    if let Some((_, turn)) = open.take() {
                        script.turns.push(turn);
                    }
                    let mods = std::mem::take(&mut pending);
                    open = Some((
                        group,
                        Turn {
                            calls: vec![call],
                            mods,
                        },
                    ));
                }
            }
            continue;
        }
        // Any other line ends the open turn: what follows belongs to the next response.
        if let Some((_, turn)) = open.take() {
            script.turns.push(turn);
        }
        match verb {
            "think" => {
                let think = pending.think.get_or_insert_with(String::new);
                if !think.is_empty() {
                    think.push('\n');
                }
                think.push_str(args);
            }
            "sleep" => pending.sleep = Some(duration(args).map_err(err)?),
            "stall" if args.is_empty() => pending.stall = true,
            "stall" => return Err(err(format!("stall takes nothing, not {args:?}"))),
            "fail" => pending.fails.push(fail(line, args).map_err(err)?),
            "say" => script.say.push(args.to_owned()),
            "json" => script.json.push(object(args).map_err(err)?),
            other => return Err(err(format!("unknown verb {other:?}"))),
        }
    }
    if let Some((_, turn)) = open.take() {
        script.turns.push(turn);
    }
    script.final_mods = pending;
    Ok(script)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, input: &str) -> Call {
        Call {
            name: name.into(),
            input: input.into(),
        }
    }

    #[test]
    fn consecutive_lines_of_one_kind_form_one_turn() {
        let text = "Fix the bug.\n\
                    @sim think look first\n\
                    @sim tool Read {\"file_path\": \"a.rs\"}\n\
                    @sim tool Grep {\"pattern\":\"x\"}\n\
                    @sim agent {\"prompt\":\"p1\"}\n\
                    @sim agent {\"prompt\":\"p2\"}\n\
                    @sim sleep 500ms\n\
                    @sim fail 529 x2\n\
                    @sim tool Edit\n\
                    @sim say all good\n\
                    @sim say really";
        let Ok(script) = parse(text) else {
            panic!("script should parse");
        };
        let calls: Vec<Vec<Call>> = script.turns.iter().map(|t| t.calls.clone()).collect();
        assert_eq!(
            calls,
            vec![
                vec![
                    call("Read", r#"{"file_path":"a.rs"}"#),
                    call("Grep", r#"{"pattern":"x"}"#)
                ],
                vec![
                    call("Agent", r#"{"prompt":"p1"}"#),
                    call("Agent", r#"{"prompt":"p2"}"#)
                ],
                vec![call("Edit", "{}")],
            ]
        );
        assert_eq!(script.turns[0].mods.think.as_deref(), Some("look first"));
        assert_eq!(script.turns[1].mods, Mods::default());
        assert_eq!(script.turns[2].mods.sleep, Some(Duration::from_millis(500)));
        assert_eq!(
            script.turns[2].mods.fails,
            vec![Fail {
                line: 7,
                status: 529,
                times: 2,
                retry_after: None,
            }]
        );
        assert_eq!(script.say, vec!["all good", "really"]);
        assert_eq!(script.final_mods, Mods::default());
    }

    #[test]
    fn a_stall_marks_the_next_response() {
        let Ok(script) = parse("Go.\n@sim stall\n@sim tool Bash {}\n@sim say ok") else {
            panic!("script should parse");
        };
        assert!(script.turns[0].mods.stall);
        assert!(!script.final_mods.stall);
        let Ok(last) = parse("Go.\n@sim stall") else {
            panic!("script should parse");
        };
        assert!(last.final_mods.stall);
        assert!(parse("@sim stall 3s").is_err());
    }

    #[test]
    fn json_lines_are_kept_in_order_and_end_a_turn() {
        let text = "Check it.\n\
                    @sim tool Read {\"file_path\": \"a.rs\"}\n\
                    @sim json {\"verdict\": \"fail\", \"findings\": [\"x\"]}\n\
                    @sim tool Read {\"file_path\": \"b.rs\"}\n\
                    @sim say checked\n\
                    @sim json   { \"verdict\" : \"pass\" }  ";
        let script = parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            script.json,
            vec![
                r#"{"verdict":"fail","findings":["x"]}"#,
                r#"{"verdict":"pass"}"#
            ]
        );
        // A json line ends the open tool turn, as a say line does.
        assert_eq!(script.turns.len(), 2);
        assert_eq!(script.say, vec!["checked"]);
        assert_eq!(parse("@sim say x").map(|s| s.json), Ok(Vec::new()));
    }

    #[test]
    fn a_failure_carries_the_retry_after_it_names() {
        let cases = [
            ("@sim fail 429", 1, Some(1000)),
            ("@sim fail 529", 1, None),
            ("@sim fail 429 x3 retry-after 600s", 3, Some(600_000)),
            ("@sim fail 503 retry-after 250ms", 1, Some(250)),
        ];
        for (text, times, after_ms) in cases {
            let script = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let fail = script.final_mods.fails[0];
            assert_eq!(fail.times, times, "{text}");
            assert_eq!(
                fail.retry_after,
                after_ms.map(Duration::from_millis),
                "{text}"
            );
        }
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("@sim frob", 1, "unknown verb"),
            ("prose\n@sim tool Read {nope", 2, "bad JSON"),
            ("@sim agent [1]", 1, "bad JSON"),
            ("prose\n@sim say hi\n@sim json {\"a\": }", 3, "bad JSON"),
            ("@sim json [1, 2]", 1, "bad JSON"),
            ("@sim json \"verdict\"", 1, "bad JSON"),
            ("@sim tool", 1, "NAME"),
            ("@sim sleep 3h", 1, "bad duration"),
            ("@sim fail 200", 1, "bad fail status"),
            ("@sim fail 529 2", 1, "bad fail count"),
            ("@sim fail 429 retry-after", 1, "needs a duration"),
            (
                "@sim fail 429 x2 retry-after 3s soon",
                1,
                "unexpected \"soon\"",
            ),
        ];
        for (text, line, needle) in cases {
            match parse(text) {
                Err(e) => {
                    assert_eq!(e.line, line, "{text}");
                    assert!(e.message.contains(needle), "{text}: {e}");
                }
                Ok(s) => panic!("{text} parsed: {s:?}"),
            }
        }
    }

    #[test]
    fn durations() {
        let cases = [
            ("3s", 3000),
            ("500ms", 500),
            ("2m", 120_000),
            ("1.5s", 1500),
        ];
        for (text, ms) in cases {
            assert_eq!(duration(text), Ok(Duration::from_millis(ms)), "{text}");
        }
    }
}
