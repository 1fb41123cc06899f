//! `run --rerun-failed`: the children of the file's batch that did not complete (failed, killed
//! or timed out), submitted again as a new batch that forks where that batch forked (the same
//! history, so the same cached prefix), under a key derived from the previous key and the failed
//! ids. Each keeps its directive's own limits, and the batch the file's.
//!
//! The batches of one file form a chain: the file's batch, then each rerun of the one before.
//! A run walks it from the file's batch, each link found again by its key (the daemon returns an
//! existing batch for a key it knows), and stops at the first link that is still running (it
//! follows that one), that has nothing left to rerun, or that it forked itself — so a run forks
//! at most one batch, running it twice forks one, and a rerun's own failures can be rerun.

use forkd_proto::v1::{
    Agent, AgentState, Directive, ForkBatchRequest, ForkBatchResponse, ListAgentsRequest,
};
use sha2::{Digest, Sha256};

use super::summary::Child;
use crate::client::Client;
use crate::commands::ps;
use crate::output::core_state;

/// One batch of the chain.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    pub batch: ForkBatchResponse,
    /// The 0-based index, in the file's directives, of each of its children, in order.
    pub originals: Vec<usize>,
}

/// Where the walk stopped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The file's batch had not been forked: it was now, and there is nothing to rerun yet.
    FirstRun,
    /// The last link is still running: the run follows it.
    Running,
    /// Every child of the file has completed, in the last link or before it.
    NothingFailed,
    /// The run forked the last link, rerunning this many failed children of the one before it.
    Rerun { failed: usize },
}

/// The rerun's idempotency key: the file's key, then a hash of the previous batch's key and
/// the ids of its failed children.
pub(crate) fn rerun_key(file_key: &str, previous_key: &str, failed: &[&str]) -> String {
    let mut hash = Sha256::new();
    hash.update(previous_key.as_bytes());
    for id in failed {
        hash.update(b"\n");
        hash.update(id.as_bytes());
    }
    format!("{file_key}/rerun-{}", &hex::encode(hash.finalize())[..16])
}

/// A batch's children, in directive order.
async fn children_of(client: &mut Client, batch_id: &str) -> anyhow::Result<Vec<Agent>> {
    let mut agents = Vec::new();
    let filter = ListAgentsRequest {
        batch_id: batch_id.to_owned(),
        include_ended: true,
        ..Default::default()
    };
    ps::list_agents(client, filter, |page| {
        agents.extend(page);
        Ok(())
    })
    .await?;
    agents.sort_by_key(|a| a.index);
    Ok(agents)
}

fn ended(state: AgentState) -> bool {
    core_state(state).is_some_and(forkd_core::AgentState::is_terminal)
}

/// Whether a child that ended is rerun: it ended without its work done.
fn rerun(state: AgentState) -> bool {
    matches!(
        state,
        AgentState::Failed | AgentState::Killed | AgentState::TimedOut
    )
}

/// The failed children of `link` (in its order) as the rerun's directives: each with its
/// directive's own limits from the file's batch request `first`.
fn rerun_directives(failed: &[&Agent], link: &Link, first: &ForkBatchRequest) -> Vec<Directive> {
    failed
        .iter()
        .map(|a| Directive {
            description: a.description.clone(),
            prompt: a.prompt.clone(),
            limits: first
                .directives
                .get(original(link, a))
                .and_then(|d| d.limits),
        })
        .collect()
}

/// The 0-based index, in the file's directives, of `agent`, a child of `link`.
fn original(link: &Link, agent: &Agent) -> usize {
    let at = usize::try_from(agent.index).unwrap_or(usize::MAX);
    link.originals.get(at).copied().unwrap_or(at)
}

/// Walks the chain from the file's batch request `first` (its session id set) and forks the
/// next rerun when the last batch ended with failures. `fork` sends a request.
pub(crate) async fn walk(
    file_key: &str,
    first: ForkBatchRequest,
    directives: usize,
    client: &mut Client,
) -> anyhow::Result<(Vec<Link>, Stop)> {
    let batch = client.fork_batch(first.clone()).await?.into_inner();
    let existing = batch.existing;
    let mut chain = vec![Link {
        batch,
        originals: (0..directives).collect(),
    }];
    if !existing {
        return Ok((chain, Stop::FirstRun));
    }
    let mut key = first.idempotency_key.clone();
    let mut link = chain[0].clone();
    loop {
        let agents = children_of(client, &link.batch.batch_id).await?;
        if agents.iter().any(|a| !ended(a.state())) {
            return Ok((chain, Stop::Running));
        }
        let failed: Vec<&Agent> = agents.iter().filter(|a| rerun(a.state())).collect();
        if failed.is_empty() {
            return Ok((chain, Stop::NothingFailed));
        }
        let ids: Vec<&str> = failed.iter().map(|a| a.agent_id.as_str()).collect();
        key = rerun_key(file_key, &key, &ids);
        let request = ForkBatchRequest {
            directives: rerun_directives(&failed, &link, &first),
            idempotency_key: key.clone(),
            fork_point_of: link.batch.batch_id.clone(),
            at_turn: None,
            ..first.clone()
        };
        let batch = client.fork_batch(request).await?.into_inner();
        let existing = batch.existing;
        let originals = failed.iter().map(|a| original(&link, a)).collect();
        link = Link { batch, originals };
        chain.push(link.clone());
        if !existing {
            return Ok((
                chain,
                Stop::Rerun {
                    failed: failed.len(),
                },
            ));
        }
    }
}

/// The file's children as they stand: each directive's latest attempt, in file order. `runs`
/// holds each link's children, in the chain's order.
pub(crate) fn merge(chain: &[Link], runs: Vec<Vec<Child>>) -> Vec<Child> {
    let mut merged: Vec<Option<Child>> = Vec::new();
    for (link, children) in chain.iter().zip(runs) {
        for (child, &original) in children.into_iter().zip(&link.originals) {
            if merged.len() <= original {
                merged.resize(original + 1, None);
            }
            merged[original] = Some(Child {
                index: original + 1,
                ..child
            });
        }
    }
    merged.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use forkd_proto::v1::NotificationStatus;

    use super::*;
    use crate::commands::run::summary::tests::child;

    #[test]
    fn keys_depend_on_the_previous_key_and_the_failed_ids() {
        let a = rerun_key("nightly", "nightly/batch", &["x", "y"]);
        assert!(a.starts_with("nightly/rerun-") && a.len() == "nightly/rerun-".len() + 16);
        assert_eq!(a, rerun_key("nightly", "nightly/batch", &["x", "y"]));
        assert_ne!(a, rerun_key("nightly", "nightly/batch", &["x"]));
        assert_ne!(a, rerun_key("nightly", &a, &["x", "y"]));
        // Not a concatenation: ["xy"] is another set than ["x", "y"].
        assert_ne!(a, rerun_key("nightly", "nightly/batch", &["xy"]));
    }

    #[test]
    fn timed_out_children_are_rerun_with_their_own_limits() {
        let agent = |index: u32, state: AgentState| Agent {
            agent_id: format!("A{index}"),
            index,
            state: state as i32,
            prompt: format!("part {index}"),
            ..Default::default()
        };
        let agents = [
            agent(0, AgentState::Completed),
            agent(1, AgentState::TimedOut),
            agent(2, AgentState::Failed),
            agent(3, AgentState::Killed),
        ];
        assert!(agents.iter().all(|a| ended(a.state())));
        assert!(!ended(AgentState::Running) && !ended(AgentState::Idle));
        let failed: Vec<&Agent> = agents.iter().filter(|a| rerun(a.state())).collect();
        let ids: Vec<&str> = failed.iter().map(|a| a.agent_id.as_str()).collect();
        assert_eq!(ids, ["A1", "A2", "A3"]);

        // The file's directive 2 (index 1) has its own timeout; the batch's limits ride along
        // with the rest of the file's request.
        let own = forkd_proto::v1::Limits {
            timeout_ms: 1_800_000,
            ..Default::default()
        };
        let mut first = ForkBatchRequest {
            directives: (0..4)
                .map(|i| Directive {
                    prompt: format!("part {i}"),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        first.directives[1].limits = Some(own);
        let link = Link {
            batch: ForkBatchResponse::default(),
            originals: vec![0, 1, 2, 3],
        };
        let reruns = rerun_directives(&failed, &link, &first);
        let limits: Vec<_> = reruns.iter().map(|d| d.limits).collect();
        assert_eq!(limits, [Some(own), None, None]);
        // A rerun of a rerun maps its children back to the file's directives.
        let second = Link {
            batch: ForkBatchResponse::default(),
            originals: vec![1, 3],
        };
        let again = [agent(0, AgentState::TimedOut)];
        let again: Vec<&Agent> = again.iter().collect();
        assert_eq!(
            rerun_directives(&again, &second, &first)[0].limits,
            Some(own)
        );
    }

    #[test]
    fn the_latest_attempt_of_each_directive_stands() {
        let link = |id: &str, originals: Vec<usize>| Link {
            batch: ForkBatchResponse {
                batch_id: id.into(),
                ..Default::default()
            },
            originals,
        };
        let chain = [
            link("B0", vec![0, 1, 2, 3]),
            link("B1", vec![1, 3]),
            link("B2", vec![3]),
        ];
        let first = vec![
            child(1, NotificationStatus::Completed),
            child(2, NotificationStatus::Failed),
            child(3, NotificationStatus::Completed),
            child(4, NotificationStatus::Killed),
        ];
        let second = vec![
            child(1, NotificationStatus::Completed),
            child(2, NotificationStatus::Failed),
        ];
        let third = vec![child(1, NotificationStatus::Completed)];
        let merged = merge(&chain, vec![first, second, third]);
        let rows: Vec<(usize, NotificationStatus, &str)> = merged
            .iter()
            .map(|c| (c.index, c.status, c.agent_id.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                (1, NotificationStatus::Completed, "A1"),
                (2, NotificationStatus::Completed, "A1"),
                (3, NotificationStatus::Completed, "A3"),
                (4, NotificationStatus::Completed, "A1"),
            ]
        );
    }
}
