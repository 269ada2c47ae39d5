//! Which terminal DAGs are kept: the most recent few per template, in the order they
//! became terminal. Older ones are dropped from memory (and their Job objects deleted).

use std::collections::{HashMap, VecDeque};

use hive_api::job::JobTemplate;

/// Terminal DAGs kept per template, oldest first.
#[derive(Debug)]
pub(super) struct History {
    keep: usize,
    per_template: HashMap<JobTemplate, VecDeque<u64>>,
}

impl History {
    /// Keeps `keep` terminal DAGs per template.
    pub(super) fn new(keep: usize) -> History {
        History { keep, per_template: HashMap::new() }
    }

    /// Records DAG `seq` of `template` as terminal; returns the DAGs that fall out.
    pub(super) fn record(&mut self, template: JobTemplate, seq: u64) -> Vec<u64> {
        let kept = self.per_template.entry(template).or_default();
        kept.push_back(seq);
        let excess = kept.len().saturating_sub(self.keep);
        kept.drain(..excess).collect()
    }

    /// Drops DAG `seq` from the history (its name was taken by a new Job).
    pub(super) fn forget(&mut self, seq: u64) {
        for kept in self.per_template.values_mut() {
            kept.retain(|&s| s != seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recent_per_template() {
        let mut history = History::new(2);
        assert_eq!(history.record(JobTemplate::Stop, 1), Vec::<u64>::new());
        assert_eq!(history.record(JobTemplate::Stop, 5), Vec::<u64>::new());
        assert_eq!(history.record(JobTemplate::Start, 2), Vec::<u64>::new());
        assert_eq!(history.record(JobTemplate::Stop, 3), vec![1]);
        assert_eq!(history.record(JobTemplate::Stop, 4), vec![5]);
        assert_eq!(history.record(JobTemplate::Start, 6), Vec::<u64>::new());
        history.forget(3);
        assert_eq!(history.record(JobTemplate::Stop, 7), Vec::<u64>::new(), "3 no longer counts");
        assert_eq!(history.record(JobTemplate::Stop, 8), vec![4]);
    }
}
