//! Agent types: definitions parsed, loaded from their folders (a workspace's read beneath it,
//! symlinks not followed), and the built-ins.

use super::*;
use forkd_core::RawJson;
use forkd_core::report::Report;

fn known() -> Vec<String> {
    forkd_core::tools::builtin_definitions()
        .into_iter()
        .map(|t| t.name)
        .collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The type a file `x.md` defines with only its name, description and prompt set.
fn plain(name: &str, description: &str, prompt: &str) -> AgentType {
    AgentType {
        name: name.into(),
        description: description.into(),
        system_prompt: prompt.into(),
        tools: None,
        disallowed_tools: Vec::new(),
        model: None,
        permission_mode: None,
        source: AgentTypeSource::File(PathBuf::from("x.md")),
    }
}

#[test]
fn mcp_tools_may_be_listed_by_name_or_by_server() {
    let text = "---\nname: triage\ndescription: d\ntools: Read, mcp__github__*, mcp__docs\n\
                disallowedTools: mcp__github__delete_repo\n---\nP\n";
    let t = match parse_type(Path::new("x.md"), text, &known()) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    };
    let def = |name: &str| ToolDef {
        name: name.into(),
        raw: RawJson::encode(name),
    };
    let pool = [
        def("Agent"),
        def("Bash"),
        def("Read"),
        def("mcp__docs__search"),
        def("mcp__docsx__search"),
        def("mcp__github__create_issue"),
        def("mcp__github__delete_repo"),
    ];
    let names: Vec<String> = t.tool_defs(&pool).into_iter().map(|d| d.name).collect();
    assert_eq!(
        names,
        ["Read", "mcp__docs__search", "mcp__github__create_issue"]
    );
}

#[test]
fn valid_files_parse_to_their_types() {
    let cases: Vec<(&str, AgentType)> = vec![
        (
            "---\nname: reviewer\ndescription: Reviews diffs\ntools: Read, Grep, Glob\n\
             disallowedTools: Bash\nmodel: claude-haiku-4-5\npermissionMode: plan\n---\n\
             You review code.\n",
            AgentType {
                tools: Some(strings(&["Read", "Grep", "Glob"])),
                disallowed_tools: strings(&["Bash"]),
                model: Some("claude-haiku-4-5".into()),
                permission_mode: Some(PermissionMode::Plan),
                ..plain("reviewer", "Reviews diffs", "You review code.")
            },
        ),
        (
            "---\nname: r_2\ndescription: d\ntools:\n  - Read\n  - Edit\n\
             disallowedTools: [Write, Bash]\nmodel: inherit\ncolor: blue\n---\nP\n",
            AgentType {
                tools: Some(strings(&["Read", "Edit"])),
                disallowed_tools: strings(&["Write", "Bash"]),
                ..plain("r_2", "d", "P")
            },
        ),
        (
            "\u{feff}---\r\nname: crlf\r\ndescription: \"quoted: yes\"\r\n---  \r\n\r\n\
             Line one.\r\n\r\nLine two.\r\n",
            plain("crlf", "quoted: yes", "Line one.\r\n\r\nLine two."),
        ),
        (
            "---\nname: none\ndescription: d\ntools: []\n---\nbody --- with dashes\n---\nmore",
            AgentType {
                tools: Some(Vec::new()),
                ..plain("none", "d", "body --- with dashes\n---\nmore")
            },
        ),
    ];
    for (text, expected) in cases {
        match parse_type(Path::new("x.md"), text, &known()) {
            Ok(t) => assert_eq!(t, expected, "{text:?}"),
            Err(e) => panic!("{text:?}: {e}"),
        }
    }
}

#[test]
fn bad_files_are_refused_with_a_clear_message() {
    let head = "---\nname: r\ndescription: d\n";
    let cases: Vec<(String, &str)> = vec![
        ("no fences here".into(), "x.md: no frontmatter"),
        ("---\nname: r\n".into(), "no frontmatter"),
        (" ---\nname: r\n---\nP".into(), "no frontmatter"),
        ("---\nname: [r\n---\nP".into(), "x.md: bad frontmatter: "),
        ("---\nname: r\nname: s\n---\nP".into(), "at line 3"),
        ("---\n- a\n---\nP".into(), "bad frontmatter"),
        ("---\ndescription: d\n---\nP".into(), "has no `name`"),
        ("---\nname: r\n---\nP".into(), "has no `description`"),
        (
            "---\nname: '  '\ndescription: d\n---\nP".into(),
            "has no `name`",
        ),
        (
            "---\nname: my agent\ndescription: d\n---\nP".into(),
            "bad name \"my agent\"",
        ),
        ("---\nname: ../x\ndescription: d\n---\nP".into(), "bad name"),
        (
            "---\nname: Plan\ndescription: d\n---\nP".into(),
            "`Plan` is a built-in",
        ),
        (
            "---\nname: explore\ndescription: d\n---\nP".into(),
            "is a built-in",
        ),
        (
            format!("{head}permissionMode: yolo\n---\nP"),
            "unknown permissionMode \"yolo\"",
        ),
        (
            format!("{head}tools: Read, Fly\n---\nP"),
            "unknown tools in `tools`: Fly (known: ",
        ),
        (
            format!("{head}disallowedTools: [Swim]\n---\nP"),
            "`disallowedTools`: Swim",
        ),
        (
            format!("{head}tools: 5\n---\nP"),
            "comma-separated string or a list",
        ),
        (format!("{head}---\n"), "x.md: the system prompt"),
        (format!("{head}---\n  \n\t\n"), "is empty"),
    ];
    for (text, expected) in cases {
        match parse_type(Path::new("x.md"), &text, &known()) {
            Ok(t) => panic!("{text:?} parsed: {t:?}"),
            Err(e) => {
                let message = e.to_string();
                assert!(message.contains(expected), "{text:?}: {message}");
                assert!(!message.contains('\n'), "one line for logs: {message}");
            }
        }
    }
}

fn pool() -> Vec<ToolDef> {
    [
        "Agent", "Bash", "Edit", "Glob", "Grep", "Read", "Write", "mcp_x",
    ]
    .into_iter()
    .map(|name| ToolDef {
        name: name.into(),
        raw: RawJson::encode(name),
    })
    .collect()
}

fn names(defs: &[ToolDef]) -> Vec<&str> {
    defs.iter().map(|d| d.name.as_str()).collect()
}

#[test]
fn tools_are_filtered_in_pool_order_and_never_include_agent() {
    let types = builtin_types();
    let general = find_type(&types, "general-purpose");
    let explore = find_type(&types, "Explore");
    let all = ["Bash", "Edit", "Glob", "Grep", "Read", "Write", "mcp_x"];
    assert_eq!(
        general.map(|t| t.tool_defs(&pool())).as_deref().map(names),
        Some(all.to_vec())
    );
    let read_only = explore.map(|t| t.tool_defs(&pool()));
    assert_eq!(
        read_only.as_deref().map(names),
        Some(vec!["Glob", "Grep", "Read"])
    );
    let custom = AgentType {
        tools: Some(strings(&["Write", "Agent", "Read", "Bash"])),
        disallowed_tools: strings(&["Bash"]),
        ..plain("c", "d", "p")
    };
    assert_eq!(names(&custom.tool_defs(&pool())), ["Read", "Write"]);
}

#[test]
fn builtins_are_found_and_plan_is_read_only() {
    let types = builtin_types();
    for name in ["general-purpose", "Explore", "Plan"] {
        let found = find_type(&types, name).map(|t| t.source.clone());
        assert_eq!(found, Some(AgentTypeSource::BuiltIn), "{name}");
    }
    assert!(find_type(&types, "plan").is_none());
    let plan = find_type(&types, "Plan").and_then(|t| t.permission_mode);
    assert_eq!(plan, Some(PermissionMode::Plan));
    // Every known mode's spelling is listed in the unknown-mode error.
    let err = AgentTypeError::UnknownPermissionMode {
        path: PathBuf::from("t.md"),
        mode: "x".into(),
    }
    .to_string();
    for mode in PermissionMode::ALL {
        assert!(err.contains(mode.as_str()), "{err}");
    }
}

#[test]
fn every_rendered_prompt_asks_for_a_parsable_report_and_has_the_env() {
    let mut types = builtin_types();
    types.push(plain("custom", "d", "Do the custom thing.\n\n"));
    for t in &types {
        let text = t.render_system(Path::new("/ws"), "m-1", "2026-11-29");
        assert!(text.starts_with(t.system_prompt.trim_end()), "{}", t.name);
        assert!(text.ends_with(
            "<env>\nWorking directory: /ws\nModel: m-1\nToday's date: 2026-11-29\n</env>\n"
        ));
        let report = Report::parse(&text);
        assert!(
            report.scope.starts_with("<what you were asked"),
            "{}",
            t.name
        );
        assert!(report.issues.starts_with("<problems"), "{}", t.name);
        assert!(report.key_files.len() > 1 && report.files_changed.len() > 1);
    }
}

fn write(dir: &Path, file: &str, name: &str, prompt: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let text = format!("---\nname: {name}\ndescription: d\n---\n{prompt}\n");
    std::fs::write(dir.join(file), text)
}

#[test]
fn later_directories_override_and_bad_files_are_reported() -> std::io::Result<()> {
    let tmp = tempfile::tempdir()?;
    let home = tmp.path().join("home");
    let ws = tmp.path().join("ws");
    write(&home, "b.md", "reviewer", "home reviewer")?;
    write(&home, "a.md", "tester", "home tester")?;
    write(&home, "c.md", "tester", "second tester in one dir")?;
    write(&home, "notes.txt", "ignored", "not markdown")?;
    std::fs::write(home.join("d.md"), "no frontmatter")?;
    write(&ws, "reviewer.md", "reviewer", "workspace reviewer")?;
    write(&ws, "Plan.md", "Plan", "shadowing")?;
    let missing = tmp.path().join("missing");
    let dirs = [home.as_path(), missing.as_path(), ws.as_path()];

    let (types, errors) = load_types(&dirs, &known());

    let summary: Vec<(&str, &str)> = types
        .iter()
        .map(|t| (t.name.as_str(), t.system_prompt.as_str()))
        .collect();
    assert_eq!(
        summary[..3],
        [
            ("general-purpose", GENERAL_PURPOSE_PROMPT),
            ("Explore", EXPLORE_PROMPT),
            ("Plan", PLAN_PROMPT)
        ]
    );
    assert_eq!(
        summary[3..],
        [
            ("tester", "home tester"),
            ("reviewer", "workspace reviewer")
        ]
    );
    let reviewer = find_type(&types, "reviewer").map(|t| &t.source);
    assert_eq!(
        reviewer,
        Some(&AgentTypeSource::File(ws.join("reviewer.md")))
    );
    let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert!(messages[0].contains("c.md: agent type `tester` is already defined in"));
    assert!(messages[1].contains("d.md: no frontmatter"));
    assert!(messages[2].contains("Plan.md: `Plan` is a built-in"));
    Ok(())
}

#[test]
fn an_unreadable_directory_is_reported() -> std::io::Result<()> {
    let tmp = tempfile::tempdir()?;
    let file = tmp.path().join("agents");
    std::fs::write(&file, "a file, not a directory")?;
    let (types, errors) = load_types(&[file.as_path()], &known());
    assert_eq!(types, builtin_types());
    assert!(matches!(
        errors.as_slice(),
        [AgentTypeError::ReadDir { .. }]
    ));
    Ok(())
}

#[test]
fn a_workspace_s_types_are_read_beneath_it_and_never_through_a_symlink() -> std::io::Result<()> {
    let tmp = tempfile::tempdir()?;
    let base = std::fs::canonicalize(tmp.path())?;
    let elsewhere = base.join("elsewhere");
    write(&elsewhere, "planted.md", "planted", "from elsewhere")?;
    // A definition file symlinked from elsewhere is not read.
    let ws = base.join("ws");
    let agents = ws.join(".forkd/agents");
    write(&agents, "own.md", "own", "the workspace's own")?;
    std::os::unix::fs::symlink(elsewhere.join("planted.md"), agents.join("planted.md"))?;
    let types = for_workspace(&[], &ws);
    assert!(find_type(&types, "planted").is_none());
    let own = find_type(&types, "own").map(|t| &t.source);
    assert_eq!(own, Some(&AgentTypeSource::File(agents.join("own.md"))));
    // Nor is a folder symlinked from elsewhere, nor one reached through a symlinked `.forkd`.
    write(
        &base.join("dot-forkd/agents"),
        "planted.md",
        "planted",
        "from elsewhere",
    )?;
    for (ws, link, to) in [
        (base.join("ws2"), ".forkd/agents", elsewhere.clone()),
        (base.join("ws3"), ".forkd", base.join("dot-forkd")),
    ] {
        let at = ws.join(link);
        std::fs::create_dir_all(at.parent().unwrap_or(&ws))?;
        std::os::unix::fs::symlink(&to, &at)?;
        let types = for_workspace(&[], &ws);
        assert_eq!(types, builtin_types(), "{}", at.display());
    }
    Ok(())
}

#[test]
fn a_fifo_or_a_huge_file_named_like_a_definition_is_refused_without_waiting() -> std::io::Result<()>
{
    use rustix::fs::{CWD, FileType, Mode, mknodat};
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("agents");
    std::fs::create_dir(&dir)?;
    // A FIFO is not a definition file (the listing skips it; one swapped in after the listing
    // is opened without waiting and refused).
    mknodat(CWD, dir.join("pipe.md"), FileType::Fifo, Mode::RWXU, 0)?;
    let huge = std::fs::File::create(dir.join("huge.md"))?;
    huge.set_len(1 << 30)?;
    let (types, errors) = load_types(&[dir.as_path()], &known());
    assert_eq!(types, builtin_types());
    let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(
        messages[0].contains("huge.md") && messages[0].contains("at most"),
        "{messages:?}"
    );
    let pipe = match load_file(&dir.join("pipe.md"), &known()) {
        Ok(t) => panic!("a FIFO loaded as {t:?}"),
        Err(e) => e.to_string(),
    };
    assert!(pipe.contains("not a regular file"), "{pipe}");
    Ok(())
}
