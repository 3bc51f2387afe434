//! The executor's side of the control plane: everything it says to the API.
//!
//! * [`agent`] — registration, heartbeats with backoff, assignments handed
//!   to [`crate::roles::Roles`], drain and leave;
//! * [`report`] — delivery of each role's metrics, logs, checkpoint shards
//!   and outcome, batched and retried until the API has them.
//!
//! Both back off the same way while the API is unreachable: doubling from
//! their first wait up to [`MAX_BACKOFF`].

pub mod agent;
pub mod report;

use std::time::Duration;

/// Longest wait between two attempts to reach the API.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The wait after `previous`, doubled and kept within `[floor, MAX_BACKOFF]`.
pub fn next_backoff(previous: Duration, floor: Duration) -> Duration {
    (previous * 2).clamp(floor, MAX_BACKOFF.max(floor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_its_bounds() {
        let floor = Duration::from_millis(500);
        assert_eq!(next_backoff(Duration::ZERO, floor), floor);
        assert_eq!(next_backoff(floor, floor), Duration::from_secs(1));
        assert_eq!(next_backoff(Duration::from_secs(4), floor), MAX_BACKOFF);
        assert_eq!(next_backoff(MAX_BACKOFF, floor), MAX_BACKOFF);
    }
}
