//! Exponential backoff: how long to wait before the n-th consecutive retry. Used by the
//! watcher between failed list/watch attempts and by the work queue between failed
//! reconciles of one key.

use std::time::Duration;

/// Doubling delays from `initial`, capped at `max`: `initial`, `2·initial`, `4·initial`, …
///
/// There is no jitter: hive runs a handful of controllers against one server, so
/// synchronized retries are not a thundering herd, and exact delays keep tests exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Upper bound of any delay.
    pub max: Duration,
}

impl Backoff {
    /// A backoff starting at `initial` and never exceeding `max`.
    pub const fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max }
    }

    /// The delay before retry number `attempt` (0 for the first retry after a failure).
    pub fn delay(&self, attempt: u32) -> Duration {
        // 2^31 · initial overflows long before the cap matters; saturate instead.
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<u128> = (0..7).map(|n| backoff.delay(n).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn huge_attempt_counts_saturate_at_the_cap() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(300));
    }
}
