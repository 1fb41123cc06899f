//! The environment Bash commands run with: built from an allowlist, never inherited, so the
//! daemon's secrets (provider API keys, tokens) never reach a command the model wrote.

use std::ffi::OsString;
use std::path::Path;

/// Used when the daemon itself has no `PATH`.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The variables a command gets. `parent` looks a variable up in the daemon's environment
/// (a parameter so tests need not touch the process environment).
///
/// `HOME` is the workspace, so tools that write dot-files keep them there. Toolchain homes are
/// passed on (from the daemon's `CARGO_HOME`/`RUSTUP_HOME`, or their defaults under the
/// daemon's `HOME`) because moving `HOME` would otherwise hide every installed Rust toolchain;
/// they are locations, not secrets.
pub(crate) fn child_env(
    parent: impl Fn(&str) -> Option<OsString>,
    workspace: &Path,
) -> Vec<(&'static str, OsString)> {
    let mut env: Vec<(&'static str, OsString)> = vec![
        (
            "PATH",
            parent("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
        ),
        ("HOME", workspace.as_os_str().to_owned()),
        ("LANG", "C.UTF-8".into()),
        ("TERM", "dumb".into()),
        // Nothing can answer a pager or a credential prompt: make them no-ops instead of hangs.
        ("PAGER", "cat".into()),
        ("GIT_PAGER", "cat".into()),
        ("GIT_TERMINAL_PROMPT", "0".into()),
    ];
    let home = parent("HOME");
    for (name, default_dir) in [("CARGO_HOME", ".cargo"), ("RUSTUP_HOME", ".rustup")] {
        let dir = parent(name).or_else(|| {
            let dir = Path::new(home.as_ref()?).join(default_dir);
            dir.is_dir().then(|| dir.into_os_string())
        });
        if let Some(dir) = dir {
            env.push((name, dir));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_the_parent_are_not_passed_on() {
        let parent = |name: &str| match name {
            "PATH" => Some(OsString::from("/bin")),
            "ANTHROPIC_API_KEY" => Some(OsString::from("sk-secret")),
            "CARGO_HOME" => Some(OsString::from("/opt/cargo")),
            _ => None,
        };
        let env = child_env(parent, Path::new("/ws"));
        let names: Vec<&str> = env.iter().map(|(n, _)| *n).collect();
        assert!(!names.contains(&"ANTHROPIC_API_KEY"));
        assert!(!env.iter().any(|(_, v)| v == "sk-secret"));
        assert!(env.contains(&("PATH", OsString::from("/bin"))));
        assert!(env.contains(&("HOME", OsString::from("/ws"))));
        assert!(env.contains(&("CARGO_HOME", OsString::from("/opt/cargo"))));
        assert!(!names.contains(&"RUSTUP_HOME"));
    }

    #[test]
    fn a_parent_without_path_gets_a_default() {
        let env = child_env(|_| None, Path::new("/ws"));
        assert!(env.contains(&("PATH", OsString::from(DEFAULT_PATH))));
    }
}
