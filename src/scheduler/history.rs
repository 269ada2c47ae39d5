//! Which terminal Jobs are kept: the most recent few per template, in the order they
//! became terminal. Older ones are dropped from memory (and their Job objects deleted).
//!
//! The history outlives the daemon run: at start it begins with the terminal Jobs
//! earlier runs left in the store (Interrupted ones included), known by name only, so
//! "the 5 most recent terminal Jobs per template" holds across restarts too.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use hive_api::job::JobTemplate;

/// One kept terminal Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Kept {
    /// A DAG this scheduler ran, by its sequence number.
    Dag(u64),
    /// A Job an earlier daemon run left in the store, by its name.
    Stored(Arc<str>),
}

/// Terminal Jobs kept per template, oldest first.
#[derive(Debug)]
pub(super) struct History {
    keep: usize,
    per_template: HashMap<JobTemplate, VecDeque<Kept>>,
}

impl History {
    /// Keeps `keep` terminal Jobs per template.
    pub(super) fn new(keep: usize) -> History {
        History { keep, per_template: HashMap::new() }
    }

    /// Records `kept` of `template` as the newest terminal Job; returns the Jobs that
    /// fall out.
    pub(super) fn record(&mut self, template: JobTemplate, kept: Kept) -> Vec<Kept> {
        let kept_now = self.per_template.entry(template).or_default();
        kept_now.push_back(kept);
        let excess = kept_now.len().saturating_sub(self.keep);
        kept_now.drain(..excess).collect()
    }

    /// Forgets the stored Job `name`: a new Job took its name (the old one was deleted
    /// and the name written again), and falling out of the history must not delete it.
    pub(super) fn forget_stored(&mut self, name: &str) {
        for kept in self.per_template.values_mut() {
            kept.retain(|k| !matches!(k, Kept::Stored(n) if &**n == name));
        }
    }

    /// Drops DAG `seq` from the history (its name was taken by a new Job).
    pub(super) fn forget(&mut self, seq: u64) {
        for kept in self.per_template.values_mut() {
            kept.retain(|k| *k != Kept::Dag(seq));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(name: &str) -> Kept {
        Kept::Stored(name.into())
    }

    #[test]
    fn keeps_the_most_recent_per_template() {
        use Kept::Dag;
        let mut history = History::new(2);
        assert_eq!(history.record(JobTemplate::Stop, Dag(1)), []);
        assert_eq!(history.record(JobTemplate::Stop, Dag(5)), []);
        assert_eq!(history.record(JobTemplate::Start, Dag(2)), []);
        assert_eq!(history.record(JobTemplate::Stop, Dag(3)), [Dag(1)]);
        assert_eq!(history.record(JobTemplate::Stop, Dag(4)), [Dag(5)]);
        assert_eq!(history.record(JobTemplate::Start, Dag(6)), []);
    }

    #[test]
    fn jobs_of_earlier_runs_count_and_fall_out_first() {
        use Kept::Dag;
        let mut history = History::new(2);
        // At start: three stored Stops, oldest first; the oldest is over the bound.
        assert_eq!(history.record(JobTemplate::Stop, stored("stop-a")), []);
        assert_eq!(history.record(JobTemplate::Stop, stored("stop-b")), []);
        assert_eq!(history.record(JobTemplate::Stop, stored("stop-c")), [stored("stop-a")]);
        // This run's Stops push the stored ones out, oldest first.
        assert_eq!(history.record(JobTemplate::Stop, Dag(1)), [stored("stop-b")]);
        // A stored name written again belongs to the new Job: it is never evicted.
        history.forget_stored("stop-c");
        assert_eq!(history.record(JobTemplate::Stop, Dag(2)), []);
        assert_eq!(history.record(JobTemplate::Stop, Dag(3)), [Dag(1)]);
        history.forget(3);
        assert_eq!(history.record(JobTemplate::Stop, Dag(7)), [], "3 no longer counts");
        assert_eq!(history.record(JobTemplate::Stop, Dag(8)), [Dag(2)]);
    }
}
