//! Exit codes, and how an error becomes a one-line message, a hint and a code.

use std::fmt;

use tonic::Code;

/// Everything went well.
pub const OK: u8 = 0;
/// `fork --wait`, `run --wait`: at least one child failed, was killed or timed out.
pub const CHILD_FAILED: u8 = 1;
/// `webhook test`: the receiver did not take the ping (no answer, or not 2xx); `schedule
/// trigger`: the firing failed.
pub const NOT_DELIVERED: u8 = 1;
// 2 is clap's own exit code for usage errors; it is never produced here.
/// The daemon does not know the id (gRPC NOT_FOUND).
pub const NOT_FOUND: u8 = 3;
/// An argument or input file was rejected, here or by the daemon (INVALID_ARGUMENT); also an
/// address whose TLS does not match the daemon's (`http://` on TLS, an untrusted certificate).
pub const INVALID_ARGUMENT: u8 = 4;
/// The daemon could not be reached, or went away (UNAVAILABLE).
pub const UNAVAILABLE: u8 = 5;
/// Anything else.
pub const OTHER: u8 = 6;

/// The code for a run a signal ended (forkctl caught it to restore the terminal first): 128 +
/// the signal's number, as a shell reports a process the signal killed.
pub fn signalled(signal: tokio::signal::unix::SignalKind) -> u8 {
    u8::try_from(128 + signal.as_raw_value()).unwrap_or(u8::MAX)
}

/// Failures that forkctl detects itself, before or after talking to the daemon.
#[derive(Debug)]
pub enum CliError {
    /// Bad input on this side: an unreadable file, a malformed address or token.
    InvalidInput(String),
    /// The daemon closed a stream that should have stayed open, or went away and could not be
    /// reached again.
    StreamEnded(String),
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidInput(msg) | Self::StreamEnded(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for CliError {}

/// What `main` prints and returns for an error.
#[derive(Debug, PartialEq, Eq)]
pub struct Failure {
    pub code: u8,
    pub message: String,
    pub hint: Option<&'static str>,
}

const HINT_START_DAEMON: &str =
    "is forkd running? start it with `forkd serve`, or point --addr / FORKD_ADDR at it";

/// Classifies an error by the first link of its chain that says something about the cause.
pub fn classify(err: &anyhow::Error) -> Failure {
    let message = render(err);
    for cause in err.chain() {
        if let Some(status) = cause.downcast_ref::<tonic::Status>() {
            let (code, hint) = status_class(status.code());
            return Failure {
                code,
                message,
                hint,
            };
        }
        if let Some(own) = cause.downcast_ref::<CliError>() {
            let code = match own {
                CliError::InvalidInput(_) => INVALID_ARGUMENT,
                CliError::StreamEnded(_) => UNAVAILABLE,
            };
            return Failure {
                code,
                message,
                hint: None,
            };
        }
        if cause.is::<tonic::transport::Error>() {
            return Failure {
                code: UNAVAILABLE,
                message,
                hint: Some(HINT_START_DAEMON),
            };
        }
    }
    Failure {
        code: OTHER,
        message,
        hint: None,
    }
}

/// True when stdout's reader went away (`forkctl watch | head -1`): not worth a message.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Joins the chain with `: `, showing a gRPC status as `CODE: message` (tonic's own rendering
/// is meant for logs, not people) and stopping there, since its sources are transport noise.
fn render(err: &anyhow::Error) -> String {
    let mut parts = Vec::new();
    for cause in err.chain() {
        if let Some(status) = cause.downcast_ref::<tonic::Status>() {
            parts.push(status_text(status));
            break;
        }
        // tonic's "transport error" only announces its source, which follows.
        if cause.is::<tonic::transport::Error>() && cause.source().is_some() {
            continue;
        }
        // hyper and std repeat their source in their own text ("tcp connect error: tcp connect
        // error: ..."): a link the previous one already said adds nothing.
        let text = cause.to_string();
        if parts
            .last()
            .is_some_and(|last: &String| last.contains(&text))
        {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ")
}

fn status_class(code: Code) -> (u8, Option<&'static str>) {
    match code {
        Code::NotFound => (
            NOT_FOUND,
            Some("list what exists with `forkctl session list` or `forkctl ps -a`"),
        ),
        Code::InvalidArgument => (INVALID_ARGUMENT, None),
        Code::Unavailable => (UNAVAILABLE, Some(HINT_START_DAEMON)),
        Code::Unauthenticated => (OTHER, Some("set FORKD_TOKEN to a token the daemon accepts")),
        Code::PermissionDenied => (
            OTHER,
            Some("check FORKD_TOKEN, and that you may use the daemon's socket"),
        ),
        Code::Unimplemented => (
            OTHER,
            Some("this daemon does not offer that call; run a forkd as new as this forkctl"),
        ),
        Code::Internal | Code::Unknown | Code::DataLoss => {
            (OTHER, Some("the daemon's log has the details"))
        }
        _ => (OTHER, None),
    }
}

/// The canonical gRPC name of a status code, as grpcurl and the gRPC docs spell it.
/// A gRPC status as people read it: `CODE: message`.
pub fn status_text(status: &tonic::Status) -> String {
    let name = code_name(status.code());
    match status.message() {
        "" => name.to_owned(),
        msg => format!("{name}: {msg}"),
    }
}

fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    fn status_err(code: Code, msg: &str) -> anyhow::Error {
        anyhow::Error::from(tonic::Status::new(code, msg))
    }

    #[test]
    fn status_codes_map_to_exit_codes() {
        let cases = [
            (Code::NotFound, NOT_FOUND),
            (Code::InvalidArgument, INVALID_ARGUMENT),
            (Code::Unavailable, UNAVAILABLE),
            (Code::Internal, OTHER),
            (Code::FailedPrecondition, OTHER),
        ];
        for (code, exit) in cases {
            assert_eq!(classify(&status_err(code, "x")).code, exit, "{code:?}");
        }
    }

    #[test]
    fn a_status_is_rendered_by_name_behind_its_context() {
        let err = status_err(Code::NotFound, "session 42 not found");
        let err = Err::<(), _>(err).context("cannot fork").err();
        let failure = err.as_ref().map(classify);
        assert_eq!(
            failure,
            Some(Failure {
                code: NOT_FOUND,
                message: "cannot fork: NOT_FOUND: session 42 not found".into(),
                hint: Some("list what exists with `forkctl session list` or `forkctl ps -a`"),
            })
        );
    }

    #[test]
    fn a_signal_exits_as_the_shell_reports_it() {
        assert_eq!(signalled(tokio::signal::unix::SignalKind::terminate()), 143);
        assert_eq!(signalled(tokio::signal::unix::SignalKind::hangup()), 129);
        assert_eq!(signalled(tokio::signal::unix::SignalKind::interrupt()), 130);
    }

    #[test]
    fn own_errors_keep_their_message() {
        let err = anyhow::Error::from(CliError::InvalidInput("cannot read x.md".into()));
        let failure = classify(&err);
        assert_eq!(
            (failure.code, failure.message.as_str()),
            (INVALID_ARGUMENT, "cannot read x.md")
        );
        let err = anyhow::Error::from(CliError::StreamEnded("gone".into()));
        assert_eq!(classify(&err).code, UNAVAILABLE);
    }

    #[test]
    fn unknown_errors_are_other_and_broken_pipes_are_recognised() {
        let err = anyhow::anyhow!("something odd");
        assert_eq!(classify(&err).code, OTHER);
        let pipe = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(is_broken_pipe(&pipe.context("writing stdout")));
        assert!(!is_broken_pipe(&err));
    }
}
