//! How `forkd` tells a person why it stopped: the error and its causes, one per line.
//!
//! `main` returning `anyhow::Result` would print the error's `Debug` form, which appends a stack
//! backtrace whenever `RUST_BACKTRACE` or `RUST_LIB_BACKTRACE` is set. A refused start is the
//! user's to fix, not a bug: the backtrace buries the reason and says nothing they can act on.
//! Backtraces stay with panics (the standard hook prints them) and with the log.

/// The error as `error: …` and then one `  caused by: …` line per cause, without a backtrace.
pub fn render(err: &anyhow::Error) -> String {
    let mut lines: Vec<String> = Vec::new();
    for cause in err.chain() {
        let text = cause.to_string();
        // std and hyper errors often repeat their source in their own text ("cannot listen:
        // Address in use" then "Address in use"): a cause the previous line said adds nothing.
        if lines.last().is_some_and(|last| last.contains(&text)) {
            continue;
        }
        lines.push(text);
    }
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        if i == 0 {
            out.push_str("error: ");
        } else {
            out.push_str("\n  caused by: ");
        }
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use anyhow::Context as _;

    use super::*;

    #[test]
    fn causes_follow_the_error_one_per_line() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "address in use");
        let err = Err::<(), _>(io)
            .context("cannot listen on 127.0.0.1:7070")
            .context("cannot start the daemon")
            .err();
        assert_eq!(
            err.as_ref().map(render).as_deref(),
            Some(
                "error: cannot start the daemon\n  caused by: cannot listen on 127.0.0.1:7070\n  \
                 caused by: address in use"
            )
        );
    }

    #[test]
    fn a_cause_the_previous_line_already_said_is_dropped() {
        let err = anyhow::anyhow!("root").context("outer: root");
        assert_eq!(render(&err), "error: outer: root");
    }
}
