//! The order in which waiting work is served, shared by the limiter's requests and the queue
//! for running slots: interactive parent turns before batch work, tenants in turn (round
//! robin) within each, and each tenant's items in the order they came — a request sent again
//! after a refusal first, since it has waited longest.

use std::collections::VecDeque;
use std::sync::Arc;

/// Who goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A session's parent turn: someone is waiting for its answer.
    Interactive,
    /// Fork children, typed agents, compaction of their transcripts.
    Batch,
}

/// Waiting items by class and tenant.
#[derive(Debug)]
pub(crate) struct FairQueue<T> {
    /// Indexed by class: interactive first.
    classes: [Ring<T>; 2],
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            classes: [Ring::default(), Ring::default()],
        }
    }
}

/// The tenants of one class with something waiting; the front one is served next.
#[derive(Debug)]
struct Ring<T> {
    tenants: VecDeque<(Arc<str>, VecDeque<T>)>,
}

impl<T> Default for Ring<T> {
    fn default() -> Self {
        Self {
            tenants: VecDeque::new(),
        }
    }
}

fn slot(class: Class) -> usize {
    match class {
        Class::Interactive => 0,
        Class::Batch => 1,
    }
}

impl<T> FairQueue<T> {
    /// Queues `item`; `first` puts it before the tenant's other items.
    pub(crate) fn push(&mut self, class: Class, tenant: &Arc<str>, item: T, first: bool) {
        let ring = &mut self.classes[slot(class)];
        let queue = match ring.tenants.iter_mut().position(|(t, _)| t == tenant) {
            Some(i) => &mut ring.tenants[i].1,
            None => {
                ring.tenants
                    .push_back((Arc::clone(tenant), VecDeque::new()));
                let last = ring.tenants.len() - 1;
                &mut ring.tenants[last].1
            }
        };
        if first {
            queue.push_front(item);
        } else {
            queue.push_back(item);
        }
    }

    /// The item served next.
    pub(crate) fn peek(&self) -> Option<&T> {
        self.classes
            .iter()
            .find_map(|ring| ring.tenants.front().and_then(|(_, q)| q.front()))
    }

    /// Takes the item served next; its tenant goes to the back of its class's ring.
    pub(crate) fn pop(&mut self) -> Option<T> {
        let ring = self.classes.iter_mut().find(|r| !r.tenants.is_empty())?;
        let (tenant, mut queue) = ring.tenants.pop_front()?;
        let item = queue.pop_front();
        if !queue.is_empty() {
            ring.tenants.push_back((tenant, queue));
        }
        item
    }

    /// How many of `tenant`'s items wait, in either class.
    pub(crate) fn len_of(&self, tenant: &str) -> usize {
        self.classes
            .iter()
            .flat_map(|r| r.tenants.iter())
            .filter(|(t, _)| &**t == tenant)
            .map(|(_, q)| q.len())
            .sum()
    }

    /// How many waiting items would be served before the `k`-th (from 1) of `k` batch items
    /// `tenant` queued now: every interactive item, the tenant's own queue and its `k - 1`
    /// new items before it, and, tenants taking turns, about as many of each other tenant's
    /// as the tenant's own ahead of it (a dry run's estimate: the ring's position may add one).
    pub(crate) fn served_before(&self, tenant: &str, k: usize) -> usize {
        let [interactive, batch] = &self.classes;
        let waiting = |ring: &Ring<T>| -> usize { ring.tenants.iter().map(|(_, q)| q.len()).sum() };
        let own = batch
            .tenants
            .iter()
            .find(|(t, _)| &**t == tenant)
            .map_or(0, |(_, q)| q.len());
        let turn = own + k.max(1);
        let others: usize = batch
            .tenants
            .iter()
            .filter(|(t, _)| &**t != tenant)
            .map(|(_, q)| q.len().min(turn))
            .sum();
        waiting(interactive) + turn - 1 + others
    }

    pub(crate) fn len(&self) -> usize {
        self.classes
            .iter()
            .flat_map(|r| r.tenants.iter())
            .map(|(_, q)| q.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interactive_first_then_tenants_in_turn() {
        let a: Arc<str> = "a".into();
        let b: Arc<str> = "b".into();
        let mut q = FairQueue::default();
        for i in 0..4 {
            q.push(Class::Batch, &a, format!("a{i}"), false);
        }
        q.push(Class::Batch, &b, "b0".to_owned(), false);
        q.push(Class::Batch, &b, "b1".to_owned(), false);
        q.push(Class::Interactive, &b, "turn".to_owned(), false);
        q.push(Class::Batch, &a, "a-retry".to_owned(), true);
        assert_eq!(q.len(), 8);
        assert_eq!(q.peek().map(String::as_str), Some("turn"));
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            ["turn", "a-retry", "b0", "a0", "b1", "a1", "a2", "a3"],
            "A's long batch does not hold B's requests back"
        );
    }

    #[test]
    fn served_before_counts_other_tenants_only_as_far_as_their_turns() {
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "c".into());
        let mut q = FairQueue::default();
        assert_eq!(q.served_before("a", 1), 0, "nothing waits: served first");
        for i in 0..10 {
            q.push(Class::Batch, &b, i, false);
        }
        q.push(Class::Batch, &c, 0, false);
        q.push(Class::Batch, &a, 0, false);
        q.push(Class::Interactive, &c, 99, false);
        // A's new first item comes in the second round: the turn, A's own one, two of B's
        // (B is before A in the ring) and C's only one.
        assert_eq!(q.served_before("a", 1), 1 + 1 + 2 + 1);
        // Its fifth, in the sixth round: A's 1 + 4 new, B's first 6 (of 10), C's one.
        assert_eq!(q.served_before("a", 5), 1 + 5 + 6 + 1);
        // B's new items wait behind its own ten.
        assert_eq!(q.served_before("b", 1), 1 + 10 + 1 + 1);
    }
}
