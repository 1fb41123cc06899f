//! `run --wait` on a terminal: a live line on stderr with the children done, the batch's
//! cache-read share and its cost so far (from `GetCacheStats`, polled on each notification and
//! every second). Off a terminal, and with `--json`, it draws nothing and asks nothing.

use std::time::Duration;

use forkd_proto::v1::get_cache_stats_request::Scope;
use forkd_proto::v1::{GetCacheStatsRequest, GetCacheStatsResponse};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::client::Client;
use crate::output::human;

/// How often the figures are refreshed between notifications.
pub(crate) const POLL_EVERY: Duration = Duration::from_secs(1);

/// A stats call that takes longer than this is skipped: the figures are a courtesy, and the
/// notifications must keep flowing.
const POLL_TIMEOUT: Duration = Duration::from_secs(2);

const TEMPLATE: &str = "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} children done · {msg}";

pub(crate) struct Progress {
    /// `None` when nobody watches.
    live: Option<(ProgressBar, Client)>,
    batch_id: String,
}

impl Progress {
    /// A bar over `children` children when `live`, else a silent stand-in.
    pub(crate) fn new(children: usize, batch_id: &str, client: &Client, live: bool) -> Self {
        let live = live.then(|| {
            let bar =
                ProgressBar::with_draw_target(Some(children as u64), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(TEMPLATE)
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style.progress_chars("=> "));
            bar.set_message("waiting for the first figures");
            bar.enable_steady_tick(Duration::from_millis(120));
            (bar, client.clone())
        });
        Self {
            live,
            batch_id: batch_id.to_owned(),
        }
    }

    pub(crate) fn is_live(&self) -> bool {
        self.live.is_some()
    }

    /// Moves the bar to `done` children and refreshes the figures.
    pub(crate) async fn refresh(&mut self, done: usize) {
        let Some((bar, client)) = &mut self.live else {
            return;
        };
        bar.set_position(done as u64);
        let request = GetCacheStatsRequest {
            scope: Some(Scope::BatchId(self.batch_id.clone())),
        };
        if let Ok(Ok(reply)) =
            tokio::time::timeout(POLL_TIMEOUT, client.get_cache_stats(request)).await
        {
            bar.set_message(figures(&reply.into_inner()));
        }
    }

    /// Runs `print` with the bar out of the way, so lines on the terminal do not tear it.
    pub(crate) fn suspend<R>(&self, print: impl FnOnce() -> R) -> R {
        match &self.live {
            Some((bar, _)) => bar.suspend(print),
            None => print(),
        }
    }

    /// Removes the bar; the summary table follows.
    pub(crate) fn finish(&self) {
        if let Some((bar, _)) = &self.live {
            bar.finish_and_clear();
        }
    }
}

/// `cache read 91.2% · $0.0312`
fn figures(stats: &GetCacheStatsResponse) -> String {
    format!(
        "cache read {} · {}",
        human::percent(stats.cache_read_share),
        human::usd(stats.cost_usd)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_read_at_a_glance() {
        let stats = GetCacheStatsResponse {
            cache_read_share: 0.912,
            cost_usd: 0.03125,
            ..Default::default()
        };
        assert_eq!(figures(&stats), "cache read 91.2% · $0.0312");
    }

    #[test]
    fn the_template_is_valid() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
    }
}
