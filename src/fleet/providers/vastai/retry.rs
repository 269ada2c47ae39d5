//! Backoff for 429 and transient failures: exponential with jitter, `Retry-After`.

use std::time::Duration;

/// How calls back off on HTTP 429 (and, for calls safe to repeat, on 502/503/504 and
/// lost connections).
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Requests per call at most, the first included.
    pub max_attempts: u32,
    /// The first backoff; each next one doubles, before jitter.
    pub base_delay: Duration,
    /// The largest computed backoff.
    pub max_delay: Duration,
    /// The longest `Retry-After` honoured; a longer one ends the call with
    /// [`VastError::RateLimited`].
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
        }
    }
}

/// The delay before attempt `failed + 1`, after `failed` (≥ 1) refused attempts:
/// `Retry-After` exactly when the server sent one, else `base · 2^(failed-1)` capped at
/// `max_delay`, of which the upper half is scaled by `jitter` (in `0..=1`).
pub fn backoff_delay(
    policy: &RetryPolicy,
    failed: u32,
    retry_after: Option<Duration>,
    jitter: f64,
) -> Duration {
    if let Some(wait) = retry_after {
        return wait;
    }
    let factor = 2u32.saturating_pow(failed.saturating_sub(1).min(30));
    let full = policy.base_delay.saturating_mul(factor).min(policy.max_delay);
    full / 2 + (full / 2).mul_f64(jitter.clamp(0.0, 1.0))
}

/// `Retry-After` as a delay: delta-seconds or an HTTP date (a past date is zero).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    Some((when.with_timezone(&chrono::Utc) - crate::host::now()).to_std().unwrap_or(Duration::ZERO))
}

pub(super) fn jitter() -> f64 {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 4];
    match ring::rand::SystemRandom::new().fill(&mut bytes) {
        Ok(()) => f64::from(u32::from_le_bytes(bytes)) / f64::from(u32::MAX),
        Err(_) => 0.5,
    }
}
