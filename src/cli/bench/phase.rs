//! The phases of `hive bench`, in the order a run measures them, and which of them a run
//! runs (`--phases`).

/// One part of a run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Raw redb commits, write-ahead log appends and fdatasyncs (`--raw-commits`).
    Raw,
    /// Durable creates at each `--clients` level.
    Creates,
    /// Durable updates of `--update-objects` Agents at each `--clients` level.
    Updates,
    /// Watch delivery under each of `--watch-loads`.
    Watch,
    /// Stop/start Jobs of a real agent process (`--power-cycles`).
    Power,
    /// Spawn, stop, start and `logs -f` of a local agent against the same agent placed on
    /// a `process` fleet node (`--placement-cycles`, `--log-duration`).
    Placement,
    /// Fill the store to `--objects`, time full lists (over HTTP/1.1, then HTTP/2), read the
    /// daemon's memory.
    List,
    /// Graceful restarts on the filled store (`--restarts`); needs `list`.
    ColdStart,
}

/// Every phase, in the order a run measures them.
pub const ALL: [Phase; 8] = [
    Phase::Raw,
    Phase::Creates,
    Phase::Updates,
    Phase::Watch,
    Phase::Power,
    Phase::Placement,
    Phase::List,
    Phase::ColdStart,
];

impl Phase {
    /// The name `--phases` takes.
    pub(super) fn name(self) -> &'static str {
        match self {
            Phase::Raw => "raw",
            Phase::Creates => "creates",
            Phase::Updates => "updates",
            Phase::Watch => "watch",
            Phase::Power => "power",
            Phase::Placement => "placement",
            Phase::List => "list",
            Phase::ColdStart => "cold-start",
        }
    }
}

/// The phases `--phases` names, in run order, each once; none given is all of them.
pub(super) fn selected(given: &[Phase]) -> Vec<Phase> {
    if given.is_empty() {
        return ALL.to_vec();
    }
    let mut phases = given.to_vec();
    phases.sort_unstable();
    phases.dedup();
    phases
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum as _;

    use super::*;

    #[test]
    fn names_are_the_ones_clap_parses() {
        for phase in ALL {
            assert_eq!(Phase::from_str(phase.name(), false), Ok(phase));
        }
        assert_eq!(Phase::value_variants(), ALL);
    }

    #[test]
    fn a_selection_runs_in_run_order_once_each() {
        assert_eq!(selected(&[]), ALL);
        assert_eq!(selected(&[Phase::List, Phase::Placement, Phase::List]), [Phase::Placement, Phase::List]);
    }
}
