//! Path globs with gitignore-like anchoring, shared by Grep's `glob` filter and permission rules.
//!
//! A pattern without a `/` (`*.md`) matches a file name at any depth; a pattern with one
//! (`src/**/*.rs`) matches the whole relative path, and `*` never crosses a `/` (only `**` does).
//! That is how `.gitignore` and ripgrep's `--glob` read patterns, which models already know.

use std::path::Path;

use globset::{GlobBuilder, GlobMatcher};

/// A compiled path pattern.
#[derive(Debug, Clone)]
pub(crate) struct PathPattern {
    matcher: GlobMatcher,
    /// True when the pattern has no `/`, so it is matched against the file name alone.
    name_only: bool,
}

impl PathPattern {
    pub(crate) fn new(pattern: &str) -> Result<PathPattern, globset::Error> {
        let anchored = pattern.trim_start_matches("./").trim_start_matches('/');
        let name_only = !pattern.contains('/');
        let matcher = GlobBuilder::new(anchored)
            .literal_separator(true)
            .build()?
            .compile_matcher();
        Ok(PathPattern { matcher, name_only })
    }

    /// Whether `rel`, a path relative to the directory the pattern is anchored at, matches.
    pub(crate) fn is_match(&self, rel: &Path) -> bool {
        if self.name_only {
            rel.file_name()
                .is_some_and(|name| self.matcher.is_match(name))
        } else {
            self.matcher.is_match(rel)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn check(pattern: &str, path: &str, expected: bool) {
        let p = PathPattern::new(pattern).unwrap();
        assert_eq!(p.is_match(Path::new(path)), expected, "{pattern} vs {path}");
    }

    #[test]
    fn gitignore_like_anchoring() {
        check("*.md", "README.md", true);
        check("*.md", "docs/deep/guide.md", true);
        check("*.md", "README.mdx", false);
        check("src/**", "src/a/b.rs", true);
        check("src/**", "lib/src/a.rs", false);
        check("src/*.rs", "src/a/b.rs", false);
        check("src/*.rs", "src/main.rs", true);
        check("/src/*.rs", "src/main.rs", true);
        check("./src/*.rs", "src/main.rs", true);
        check("*.{ts,tsx}", "ui/app.tsx", true);
    }

    #[test]
    fn invalid_patterns_are_errors() {
        assert!(PathPattern::new("src/[").is_err());
    }
}
