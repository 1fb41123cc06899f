//! The names MCP tools get in a session's tool pool: `mcp__SERVER__TOOL`, made valid for every
//! provider (`[A-Za-z0-9_-]`, at most 64 characters). A name that had to be shortened, or that
//! collides with another, gets a suffix derived from the original server and tool names (not
//! from their order), so the same tools always get the same names.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

/// The most characters a tool name may have (the strictest provider's limit).
pub const MAX_NAME: usize = 64;

/// The prefix of every MCP tool's name.
pub use forkd_core::tools::MCP_PREFIX as PREFIX;

fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn suffix(server: &str, tool: &str) -> String {
    let digest = Sha256::digest(format!("{server}\0{tool}").as_bytes());
    hex::encode(&digest[..4])
}

/// `name` cut to leave room for `_SUFFIX`, then the suffix.
fn with_suffix(name: &str, server: &str, tool: &str) -> String {
    let suffix = suffix(server, tool);
    let keep = MAX_NAME - suffix.len() - 1;
    let head: String = name.chars().take(keep).collect();
    format!("{head}_{suffix}")
}

/// The pool name of `tool` on `server`, unique among `taken` (which it is added to).
pub fn tool_name(server: &str, tool: &str, taken: &mut BTreeSet<String>) -> String {
    let plain = format!("{PREFIX}{}__{}", sanitize(server), sanitize(tool));
    let name = if plain.len() > MAX_NAME || taken.contains(&plain) {
        with_suffix(&plain, server, tool)
    } else {
        plain
    };
    taken.insert(name.clone());
    name
}

/// Whether a server's name, as `mcp__SERVER`, appears in the names of its tools unchanged.
pub fn server_prefix(server: &str) -> String {
    format!("{PREFIX}{}__", sanitize(server))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn valid(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= MAX_NAME
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn names_are_valid_and_stable() {
        let mut taken = BTreeSet::new();
        assert_eq!(
            tool_name("github", "create_issue", &mut taken),
            "mcp__github__create_issue"
        );
        let dotted = tool_name("my.server", "tool/with spaces", &mut taken);
        assert_eq!(dotted, "mcp__my_server__tool_with_spaces");
        let long_tool = "x".repeat(100);
        let long = tool_name("s", &long_tool, &mut taken);
        assert!(valid(&long), "{long}");
        assert_eq!(long, tool_name("s", &long_tool, &mut BTreeSet::new()));
    }

    #[test]
    fn a_collision_gets_a_suffix_that_does_not_depend_on_order() {
        let mut taken = BTreeSet::new();
        let a = tool_name("s", "a.b", &mut taken);
        let b = tool_name("s", "a_b", &mut taken);
        assert_eq!(a, "mcp__s__a_b");
        assert!(b.starts_with("mcp__s__a_b_") && valid(&b), "{b}");
        // The second one's name is a function of its own names.
        let mut other = BTreeSet::from(["mcp__s__a_b".to_owned()]);
        assert_eq!(tool_name("s", "a_b", &mut other), b);
    }
}
