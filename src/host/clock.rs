//! The one wall clock. Everything in hive that stamps a time — objects and events in the
//! store, conditions, runtime exits, tokens, the CLI's ages — reads it here, through a
//! [`Clock`] it was handed (the store's, which tests replace to move time) or through
//! [`now`]. `clippy.toml` forbids every other read of the wall clock.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};

/// The current wall-clock time: the system clock.
#[allow(clippy::disallowed_methods)] // the one read of the system clock
pub fn now() -> DateTime<Utc> {
    Utc::now()
}

/// A source of wall-clock time. The system clock in production; tests substitute one
/// they can move so retention by age is checked without sleeping.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>);

impl Clock {
    /// The system's wall clock.
    pub fn system() -> Clock {
        Clock(Arc::new(now))
    }

    /// A clock that reads the time from `now`.
    pub fn from_fn(now: impl Fn() -> DateTime<Utc> + Send + Sync + 'static) -> Clock {
        Clock(Arc::new(now))
    }

    /// The current time.
    pub fn now(&self) -> DateTime<Utc> {
        (self.0)()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Clock")
    }
}
