//! The engine's shape, checked: the layers ARCHITECTURE.md declares are the layers the code has.
//!
//! ARCHITECTURE.md's "Engine services" table names each service, its layer and its modules. This
//! test reads that table and every `crate::…` path in `crates/engine/src` (in `use` items and
//! inline, tests left out; a `super::…` path that climbs to the crate root counts as one) and
//! fails on:
//!
//! - a module the table does not place, or places twice;
//! - a circle of modules that reach each other;
//! - a path against the layers: a module may use the modules of its own service and those of
//!   lower layers, never a higher layer's or a peer service's in its own layer (a service still
//!   written as methods on `Engine` may name the crate root, where `Engine` is);
//! - a service that names `Engine` although the table does not say it is still written as methods
//!   on `Engine`: a service gets the handles it needs, not the engine's whole state.
//!
//! So a split that only moves code between files fails it: the moved code still reaches back up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where the table starts and ends in ARCHITECTURE.md.
const TABLE_START: &str = "<!-- engine services: checked by crates/engine/tests/structure.rs -->";
const TABLE_END: &str = "<!-- end of engine services -->";
/// The table's mark for a service still written as methods on `Engine`.
const ON_ENGINE: &str = "methods on `Engine`";

#[derive(Debug, Clone, PartialEq)]
struct Service {
    name: String,
    layer: u32,
    modules: Vec<String>,
    on_engine: bool,
}

/// One module's code, comments, strings and tests left out.
#[derive(Debug, Clone)]
struct Module {
    name: String,
    code: String,
}

#[test]
fn the_engine_keeps_its_declared_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let architecture = std::fs::read_to_string(root.join("../../ARCHITECTURE.md"))
        .expect("ARCHITECTURE.md is readable");
    let services = parse_table(&architecture).unwrap_or_else(|e| panic!("{e}"));
    let modules = read_modules(&root.join("src"));
    let problems = check(&services, &modules);
    assert!(
        problems.is_empty(),
        "The engine's modules break the layers ARCHITECTURE.md declares:\n- {}",
        problems.join("\n- ")
    );
}

/// The figures behind the structure, for any engine source tree (the issue's before and after):
/// how many `crate::` edges join its modules and which circles they make.
///
/// `FORKD_ENGINE_SRC=DIR cargo test -p forkd-engine --test structure -- --ignored --nocapture`
/// (default: this crate's `src`; an older tree comes out with
/// `git archive REV crates/engine/src | tar -x -C DIR`, then DIR/crates/engine/src).
#[test]
#[ignore = "a report for figures, not a check"]
fn report_the_module_graph() {
    let src = std::env::var_os("FORKD_ENGINE_SRC").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        PathBuf::from,
    );
    let modules = read_modules(&src);
    let names: BTreeSet<&str> = modules.iter().map(|m| m.name.as_str()).collect();
    let mut edges: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for module in &modules {
        let used = crate_paths(&module.code, &names);
        edges
            .entry(module.name.as_str())
            .or_default()
            .extend(used.into_iter().filter(|t| t != &module.name && t != "lib"));
    }
    let count: usize = edges.values().map(BTreeSet::len).sum();
    println!(
        "{}: {} modules, {count} edges between modules (the crate root left out)",
        src.display(),
        modules.len()
    );
    let found = circles(&edges);
    println!("{} circles", found.len());
    for circle in found {
        println!("- {}", circle.join(" → "));
    }
}

/// The services of the table between [`TABLE_START`] and [`TABLE_END`]: rows of
/// `| layer | service | modules | … |`, modules in backticks.
fn parse_table(text: &str) -> Result<Vec<Service>, String> {
    let start = text
        .find(TABLE_START)
        .ok_or("ARCHITECTURE.md has no engine services table")?;
    let end = text[start..]
        .find(TABLE_END)
        .ok_or("the engine services table has no end mark")?;
    let mut services = Vec::new();
    for line in text[start..start + end].lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        if cells.len() < 3 {
            continue;
        }
        let Ok(layer) = cells[0].trim().parse::<u32>() else {
            continue;
        };
        let modules: Vec<String> = cells[2]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        if modules.is_empty() {
            return Err(format!("the row {line:?} names no module"));
        }
        services.push(Service {
            name: cells[1].trim().to_owned(),
            layer,
            modules,
            on_engine: line.contains(ON_ENGINE),
        });
    }
    if services.is_empty() {
        return Err("the engine services table has no rows".into());
    }
    Ok(services)
}

/// The crate's top-level modules (`lib` for `lib.rs`), each with the code of its files.
fn read_modules(src: &Path) -> Vec<Module> {
    let mut files = Vec::new();
    collect_rs(src, &mut files);
    let mut code: BTreeMap<String, String> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        let first = rel
            .components()
            .next()
            .expect("a path")
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
        // A module's tests may reach anywhere; they are not its shape.
        if rel.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        let entry = code.entry(name).or_default();
        entry.push_str(&rooted(&without_tests(&strip(&text)), module_depth(rel)));
        entry.push('\n');
    }
    code.into_iter()
        .map(|(name, code)| Module { name, code })
        .collect()
}

/// How deep below the crate root a file's module sits: `run.rs` and `run/mod.rs` 1,
/// `run/tools.rs` 2 (`lib.rs` 0).
fn module_depth(rel: &Path) -> usize {
    let parts = rel.components().count();
    if rel
        .file_name()
        .is_some_and(|f| f == "mod.rs" || f == "lib.rs")
    {
        parts - 1
    } else {
        parts
    }
}

/// `code` with the `super::` paths that climb to the crate root written as `crate::` paths, so
/// that `super::parent::X` in a top-level module (or `super::super::parent::X` one below) is
/// seen for what it reaches. A `super::` that stays inside the module is left alone.
fn rooted(code: &str, depth: usize) -> String {
    if depth == 0 {
        return code.to_owned();
    }
    let climb = "super::".repeat(depth);
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(&climb) {
        let before = rest[..at].chars().next_back();
        let starts_path = !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        out.push_str(&rest[..at]);
        out.push_str(if starts_path { "crate::" } else { &climb });
        rest = &rest[at + climb.len()..];
    }
    out.push_str(rest);
    out
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("a readable directory")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Everything the table and the code disagree on.
fn check(services: &[Service], modules: &[Module]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut owner: BTreeMap<&str, &Service> = BTreeMap::new();
    for service in services {
        for module in &service.modules {
            if let Some(other) = owner.insert(module, service) {
                problems.push(format!(
                    "`{module}` is placed in both {} and {}",
                    other.name, service.name
                ));
            }
        }
    }
    let names: BTreeSet<&str> = modules.iter().map(|m| m.name.as_str()).collect();
    for module in &names {
        if !owner.contains_key(module) {
            problems.push(format!(
                "`{module}` is in no service of ARCHITECTURE.md's table: place it in a layer"
            ));
        }
    }
    for module in owner.keys() {
        if !names.contains(module) {
            problems.push(format!(
                "the table names `{module}`, which crates/engine/src does not have"
            ));
        }
    }
    let mut edges: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for module in modules {
        let used = crate_paths(&module.code, &names);
        for target in &used {
            if target == &module.name {
                continue;
            }
            let (Some(from), Some(to)) =
                (owner.get(module.name.as_str()), owner.get(target.as_str()))
            else {
                continue;
            };
            // A service still written as methods on `Engine` names the facade it is part of.
            let allowed = from.name == to.name
                || to.layer < from.layer
                || (from.on_engine && target == "lib");
            if !allowed {
                problems.push(format!(
                    "`{}` ({}, layer {}) uses `{target}` ({}, layer {}): services use only lower layers",
                    module.name, from.name, from.layer, to.name, to.layer
                ));
            }
        }
        // The crate root holds every service: a service written as methods on `Engine` names it
        // by design, which is no circle.
        let on_engine = owner.get(module.name.as_str()).is_some_and(|s| s.on_engine);
        edges.entry(module.name.as_str()).or_default().extend(
            used.into_iter()
                .filter(|t| t != &module.name && !(on_engine && t == "lib")),
        );
        if let Some(service) = owner.get(module.name.as_str())
            && !service.on_engine
            && names_word(&module.code, "Engine")
        {
            problems.push(format!(
                "`{}` ({}) names `Engine`; a service holds the handles it needs, or the table \
                 says it is still {ON_ENGINE}",
                module.name, service.name
            ));
        }
    }
    for circle in circles(&edges) {
        problems.push(format!("modules in a circle: {}", circle.join(" → ")));
    }
    problems
}

/// The modules of the crate a module's code reaches through `crate::…` paths; an item of the
/// crate root (`crate::Engine`, a re-export) counts as `lib`.
fn crate_paths(code: &str, modules: &BTreeSet<&str>) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `forkd_crate::`, not this crate
        }
        if let Some(group) = rest.strip_prefix('{') {
            let close = matching_brace(group).unwrap_or(group.len());
            for head in top_level_heads(&group[..close]) {
                used.insert(module_of(&head, modules));
            }
        } else {
            let head: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !head.is_empty() {
                used.insert(module_of(&head, modules));
            }
        }
    }
    used
}

fn module_of(head: &str, modules: &BTreeSet<&str>) -> String {
    if modules.contains(head) {
        head.to_owned()
    } else {
        "lib".to_owned()
    }
}

/// The first identifier of each comma-separated entry at the top level of a `{…}` group.
fn top_level_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut entry_start = true;
    let mut chars = group.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => entry_start = true,
            c if entry_start && depth == 0 && (c.is_alphabetic() || c == '_') => {
                let head: String = group[i..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                for _ in 1..head.chars().count() {
                    chars.next();
                }
                if head != "self" {
                    heads.push(head);
                }
                entry_start = false;
            }
            _ => {}
        }
    }
    heads
}

/// The index of the `}` that closes a group whose `{` was just before `text`.
fn matching_brace(text: &str) -> Option<usize> {
    let mut depth = 1usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether `word` occurs in `code` as a whole identifier.
fn names_word(code: &str, word: &str) -> bool {
    code.match_indices(word).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

/// The circles of the graph (its strongly connected parts of more than one module), each in a
/// stable order.
fn circles(edges: &BTreeMap<&str, BTreeSet<String>>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<String> = edges
        .iter()
        .flat_map(|(from, to)| std::iter::once(from.to_string()).chain(to.iter().cloned()))
        .collect();
    let reaches = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(node) = todo.pop() {
            for next in edges.get(node.as_str()).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<String, BTreeSet<String>> =
        nodes.iter().map(|n| (n.clone(), reaches(n))).collect();
    let mut found: Vec<Vec<String>> = Vec::new();
    let mut placed = BTreeSet::new();
    for node in &nodes {
        if placed.contains(node) || !reach[node].contains(node) {
            continue;
        }
        let circle: Vec<String> = nodes
            .iter()
            .filter(|other| reach[node].contains(*other) && reach[*other].contains(node))
            .cloned()
            .collect();
        placed.extend(circle.iter().cloned());
        found.push(circle);
    }
    found
}

/// The code of a file without its `#[cfg(test)]` items (a test module, a test-only helper).
fn without_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        // The item ends at its first `;` before any `{`, or at the brace that closes its body.
        let end = match (after.find('{'), after.find(';')) {
            (Some(open), semi) if semi.is_none_or(|s| open < s) => {
                matching_brace(&after[open + 1..]).map_or(after.len(), |close| open + 1 + close + 1)
            }
            (_, Some(semi)) => semi + 1,
            _ => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Rust source without its comments, and with its string and character literals emptied, so
/// that what is left is code.
fn strip(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"…" or r#"…"#, with as many #s at the end as at the start.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < chars.len() {
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), or a lifetime ('a), which is code.
            let literal_end = if next == Some('\\') {
                (i + 2..chars.len()).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match literal_end {
                Some(end) => {
                    out.push_str("' '");
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

#[cfg(test)]
mod checker {
    //! The checker fails what it should: a cosmetic split, a circle, an unplaced module.

    use super::*;

    fn service(name: &str, layer: u32, modules: &[&str], on_engine: bool) -> Service {
        Service {
            name: name.into(),
            layer,
            modules: modules.iter().map(|m| (*m).to_owned()).collect(),
            on_engine,
        }
    }

    fn module(name: &str, code: &str) -> Module {
        Module {
            name: name.into(),
            code: without_tests(&strip(code)),
        }
    }

    /// The modules of [`services`], empty but for those given.
    fn crate_with(given: &[(&str, &str)]) -> Vec<Module> {
        ["error", "model", "run", "tools", "lib"]
            .iter()
            .map(|name| {
                let code = given
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or("", |(_, c)| *c);
                module(name, code)
            })
            .chain(
                given
                    .iter()
                    .filter(|(n, _)| !["error", "model", "run", "tools", "lib"].contains(n))
                    .map(|(n, c)| module(n, c)),
            )
            .collect()
    }

    /// Fails unless one of `problems` says `what`.
    fn assert_reported(problems: &[String], what: &str) {
        assert!(problems.iter().any(|p| p.contains(what)), "{problems:?}");
    }

    fn services() -> Vec<Service> {
        vec![
            service("base", 1, &["error"], false),
            service("calls", 2, &["model"], false),
            service("runs", 3, &["run", "tools"], true),
            service("facade", 4, &["lib"], true),
        ]
    }

    #[test]
    fn a_layered_crate_passes() {
        let modules = crate_with(&[
            ("error", "pub struct E;"),
            ("model", "use crate::error::E;"),
            (
                "run",
                "use crate::{model::Call, error::E}; use crate::tools; impl Engine {}",
            ),
            (
                "tools",
                "use crate::Engine; fn f() -> crate::error::E { todo!() }",
            ),
            ("lib", "mod run; use crate::run::X;"),
        ]);
        assert_eq!(check(&services(), &modules), Vec::<String>::new());
    }

    #[test]
    fn a_path_up_a_circle_and_a_hidden_engine_fail() {
        let modules = crate_with(&[
            ("error", "use crate::model::Call;"),
            (
                "model",
                "// crate::run in a comment is no path\nstruct M(Engine);",
            ),
            (
                "run",
                r#"const S: &str = "crate::lib"; use crate::error::E;"#,
            ),
            ("tools", "use crate::run;"),
        ]);
        let problems = check(&services(), &modules);
        assert_reported(&problems, "`error` (base, layer 1) uses `model`");
        assert_reported(&problems, "`model` (calls) names `Engine`");
        // Code that merely moved into another file of a lower service still reaches up.
        let moved = crate_with(&[("model", "use crate::run::AgentRun;")]);
        let problems = check(&services(), &moved);
        assert_reported(&problems, "`model` (calls, layer 2) uses `run`");
    }

    #[test]
    fn circles_and_unplaced_modules_fail() {
        let modules = crate_with(&[
            ("model", "use crate::error::E; use crate::run::R;"),
            ("run", "use crate::model::M;"),
            ("stray", "use crate::error::E;"),
        ]);
        let problems = check(&services(), &modules);
        assert_reported(&problems, "circle: model → run");
        assert_reported(&problems, "`stray` is in no service");
    }

    #[test]
    fn the_table_is_read_with_its_marks() {
        let text = format!(
            "before\n{TABLE_START}\n| layer | service | modules | owns |\n|---|---|---|---|\n\
             | 1 | base | `error`, `clock` | nothing |\n| 5 | runs | `run` | {ON_ENGINE} |\n{TABLE_END}\n"
        );
        let services = parse_table(&text).unwrap();
        assert_eq!(services[0], service("base", 1, &["error", "clock"], false));
        assert_eq!(services[1], service("runs", 5, &["run"], true));
    }

    #[test]
    fn a_path_up_through_super_is_a_path_up() {
        // A top-level module's `super` is the crate root; one level down it takes two.
        assert_eq!(
            rooted("use super::run::R; use super::{model, error};", 1),
            "use crate::run::R; use crate::{model, error};"
        );
        assert_eq!(
            rooted("use super::gate::G; use super::super::model::M;", 2),
            "use super::gate::G; use crate::model::M;"
        );
        assert_eq!(module_depth(Path::new("run.rs")), 1);
        assert_eq!(module_depth(Path::new("run/mod.rs")), 1);
        assert_eq!(module_depth(Path::new("run/tools.rs")), 2);
        let climbed = rooted("use super::run::AgentRun;", 1);
        let modules = crate_with(&[("model", climbed.as_str())]);
        let problems = check(&services(), &modules);
        assert_reported(&problems, "`model` (calls, layer 2) uses `run`");
    }

    #[test]
    fn tests_strings_and_comments_are_not_code() {
        let code = strip("let c = '{'; let s = r#\"crate::x\"#; /* crate::y */ x // crate::z");
        assert!(!code.contains("crate::"), "{code}");
        let kept = without_tests(
            "use crate::a;\n#[cfg(test)]\nmod tests { use crate::b; }\nuse crate::c;",
        );
        assert!(
            kept.contains("crate::a") && kept.contains("crate::c") && !kept.contains("crate::b")
        );
    }
}
