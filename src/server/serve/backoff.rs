//! The listener's patience with failures that repeat: the backoff of a failing `accept`
//! and the rate limit of a log line that would otherwise repeat many times a second.
//! Pure: both are handed the time.

use std::time::Duration;

use tokio::time::Instant;

/// The first wait after an `accept` fails.
const FIRST: Duration = Duration::from_millis(10);

/// The longest wait between two `accept` attempts while they keep failing: recovery is
/// at most this late once descriptors free up (and sooner when a connection of ours
/// closes, which wakes the listener).
const LONGEST: Duration = Duration::from_secs(1);

/// The exponential backoff of a failing `accept`: 10 ms, doubling up to 1 s, back to
/// 10 ms after a success. A failing `accept` (out of file descriptors, typically) fails
/// again at once, so retrying without a wait would spin a core and flood the log.
#[derive(Debug)]
pub(super) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff { next: FIRST }
    }
}

impl Backoff {
    /// How long to wait after one more failure.
    pub(super) fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (wait * 2).min(LONGEST);
        wait
    }

    /// An attempt succeeded: the next failure waits the shortest time again.
    pub(super) fn reset(&mut self) {
        self.next = FIRST;
    }
}

/// Rate-limits a log line that can repeat: the first occurrence is logged at once, then
/// at most one line per `every`, each saying how many occurrences it stands for.
#[derive(Debug)]
pub(super) struct LogThrottle {
    every: Duration,
    last_line: Option<Instant>,
    unlogged: u64,
}

impl LogThrottle {
    /// A throttle allowing one line per `every`.
    pub(super) fn new(every: Duration) -> LogThrottle {
        LogThrottle { every, last_line: None, unlogged: 0 }
    }

    /// One more occurrence at `now`: `Some(count)` when a line is due, `count` being the
    /// occurrences since the previous line (this one included); `None` to stay quiet.
    pub(super) fn occurred(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        let due = self.last_line.is_none_or(|last| now.duration_since(last) >= self.every);
        if !due {
            return None;
        }
        self.last_line = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_10ms_to_1s_and_resets() {
        let mut backoff = Backoff::default();
        let waits: Vec<u128> = (0..10).map(|_| backoff.failed().as_millis()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        backoff.reset();
        assert_eq!(backoff.failed(), Duration::from_millis(10));
    }

    #[test]
    fn backoff_makes_a_persistent_failure_a_few_attempts_per_second() {
        // What the log flood was made of: 20 attempts a second with a fixed 50 ms sleep.
        let mut backoff = Backoff::default();
        let mut elapsed = Duration::ZERO;
        let mut attempts = 0;
        while elapsed < Duration::from_secs(10) {
            elapsed += backoff.failed();
            attempts += 1;
        }
        assert!(attempts <= 18, "{attempts} attempts in 10 s");
    }

    #[test]
    fn throttle_logs_the_first_then_one_line_per_interval_with_the_count() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut throttle = LogThrottle::new(Duration::from_secs(10));
        // (time in ms, expected answer)
        let cases = [
            (0, Some(1)),
            (50, None),
            (100, None),
            (9_999, None),
            (10_000, Some(4)),
            (10_001, None),
            (25_000, Some(2)),
        ];
        for (ms, expected) in cases {
            assert_eq!(throttle.occurred(at(ms)), expected, "at {ms} ms");
        }
    }
}
