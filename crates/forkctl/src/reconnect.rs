//! Streams that outlive their daemon. A command following a stream (`fork --wait`, `run --wait`,
//! `watch`, `attach`) reconnects when the connection is lost — the daemon was killed, restarted
//! or deployed again — and resumes after the last sequence number it saw, so that each
//! notification is read once and the children, not the connection, decide how it exits.

use std::time::Duration;

use clap::Args;
use tokio::time::Instant;
use tonic::{Code, Status, Streaming};

use crate::exit::CliError;

/// The first wait before dialing again, doubled after each failed try up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Whether a failed call or stream lost its connection, rather than being answered by the
/// daemon: `UNAVAILABLE`, or any status made on this side from a transport error (a stream
/// whose connection broke reads as `UNKNOWN: h2 protocol error …`; a status the daemon sent
/// carries no source).
pub fn is_lost(status: &Status) -> bool {
    status.code() == Code::Unavailable || std::error::Error::source(status).is_some()
}

/// `--reconnect-for`, for the commands that follow a stream.
#[derive(Debug, Clone, Copy, Args)]
pub struct ReconnectArgs {
    /// When the connection to the daemon is lost (the daemon was restarted, say), keep trying
    /// to reach it for this long (`90s`, `10m`, `1h`; `0`: never), then resume the stream after
    /// the last notification or message seen.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_window)]
    pub reconnect_for: Duration,
}

impl ReconnectArgs {
    pub fn reconnect(self) -> Reconnect {
        Reconnect::new(self.reconnect_for)
    }
}

/// How a lost connection is told: what broke, without the code a broken stream reads as
/// (`UNKNOWN`, which it is not).
pub fn why(status: &Status) -> String {
    match status.message() {
        "" => "the connection broke".to_owned(),
        message => message.to_owned(),
    }
}

/// One command's attempts to get its stream back.
#[derive(Debug)]
pub struct Reconnect {
    window: Duration,
    /// When the connection was lost, while the outage lasts: until something new is read, or
    /// a stream opened again stays up for [`HEALTHY`]. (A daemon that opens streams and closes
    /// them at once gets no new window each time.)
    since: Option<Instant>,
    /// When the last stream was opened again.
    opened: Option<Instant>,
    tries: u32,
}

/// How long a stream opened again must stay up for a later loss to be a new outage.
const HEALTHY: Duration = Duration::from_secs(30);

impl Reconnect {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            since: None,
            opened: None,
            tries: 0,
        }
    }

    /// The stream is lost (`why` says how): waits before the next try, or says that the window
    /// is spent (`UNAVAILABLE`, exit code 5). The first loss of an outage is told on stderr,
    /// with what `resume` says the next stream takes up from.
    async fn lost(&mut self, why: &str, resume: &str) -> Result<(), CliError> {
        let now = Instant::now();
        if self
            .opened
            .is_some_and(|at| now.saturating_duration_since(at) >= HEALTHY)
        {
            self.heard();
        }
        self.opened = None;
        let since = *self.since.get_or_insert(now);
        if self.tries == 0 {
            eprintln!(
                "forkctl: lost the daemon ({why}); reconnecting for up to {} to resume {resume}",
                humanize(self.window)
            );
        }
        let backoff = FIRST_BACKOFF
            .saturating_mul(1 << self.tries.min(16))
            .min(MAX_BACKOFF);
        if now + backoff > since + self.window {
            return Err(CliError::StreamEnded(format!(
                "lost the daemon ({why}) and could not reach it again for {}",
                humanize(self.window)
            )));
        }
        self.tries += 1;
        tokio::time::sleep(backoff).await;
        Ok(())
    }

    /// Opens the stream again with `open` (which resumes where the last one stopped: `resume`
    /// says where, for people), after waiting, for as long as the window allows; `lost` says
    /// how the last one was lost.
    pub async fn reopen<T, Open, Opened>(
        &mut self,
        mut lost: String,
        resume: &str,
        mut open: Open,
    ) -> anyhow::Result<Streaming<T>>
    where
        Open: FnMut() -> Opened,
        Opened: Future<Output = Result<tonic::Response<Streaming<T>>, Status>>,
    {
        loop {
            self.lost(&lost, resume).await?;
            match open().await {
                Ok(reply) => {
                    eprintln!("forkctl: reconnected");
                    self.opened = Some(Instant::now());
                    return Ok(reply.into_inner());
                }
                Err(status) if is_lost(&status) => lost = why(&status),
                Err(status) => return Err(status.into()),
            }
        }
    }

    /// Something new came (a notification, a message): a later loss has the whole window again.
    pub fn heard(&mut self) {
        self.since = None;
        self.tries = 0;
    }
}

/// `10m`, `90s`, `1m30s`: as `--reconnect-for` takes it.
fn humanize(d: Duration) -> String {
    let secs = d.as_secs();
    match (secs / 60, secs % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

/// Parses `--reconnect-for`: `90s`, `10m`, `1h`, `0` (never reconnect), or plain seconds.
pub fn parse_window(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |at| s.split_at(at));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a duration such as 90s, 10m or 1h"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        other => return Err(format!("unknown unit `{other}` in `{s}` (use s, m or h)")),
    };
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transport_failure_is_lost_and_an_answer_is_not() {
        assert!(is_lost(&Status::unavailable("connection refused")));
        assert!(!is_lost(&Status::not_found("no such batch")));
        // What tonic makes of a connection that broke mid-stream: UNKNOWN, with its cause.
        let broken = Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "error reading a body from connection",
        )));
        assert_eq!(broken.code(), Code::Unknown);
        assert!(is_lost(&broken));
        // The daemon's own UNKNOWN carries no source.
        assert!(!is_lost(&Status::unknown("the daemon said so")));
    }

    #[test]
    fn windows_in_every_spelling() {
        assert_eq!(parse_window("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_window("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_window("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_window("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_window("0"), Ok(Duration::ZERO));
        assert!(parse_window("ten").is_err());
        assert!(parse_window("5d").is_err());
        assert_eq!(humanize(Duration::from_secs(600)), "10m");
        assert_eq!(humanize(Duration::from_secs(90)), "1m30s");
    }

    #[tokio::test(start_paused = true)]
    async fn reconnecting_stops_when_the_window_is_spent() {
        let mut r = Reconnect::new(Duration::from_secs(2));
        let start = Instant::now();
        let mut tries = 0;
        while r.lost("gone", "after seq 0").await.is_ok() {
            tries += 1;
        }
        // 0.1 + 0.2 + 0.4 + 0.8 s, and the next 1.6 s would pass the window.
        assert_eq!(tries, 4);
        assert!(start.elapsed() <= Duration::from_secs(2));
        // Something new was read: the next outage has the whole window again.
        r.heard();
        assert!(r.lost("gone", "after seq 0").await.is_ok());
    }
}
