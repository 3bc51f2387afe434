//! The executor's side of the control plane: everything it says to the API,
//! through the typed client ([`trainyard_client::Client`]).
//!
//! * [`agent`] — registration, heartbeats, assignments handed to
//!   [`crate::roles::Roles`], drain and leave;
//! * [`report`] — delivery of each role's metrics, logs, checkpoint shards
//!   and outcome, batched and retried until the API has them;
//! * [`inspection`] — the answer to an inspection request, retried until
//!   the API takes or refuses it;
//! * [`suspects`] — peers whose data-plane connection broke, probed and,
//!   when unreachable, reported to the API at once.
//!
//! Every wait between attempts comes from the client's one
//! [`RetryPolicy`]: [`REGISTER`], [`REPORT`] and [`INSPECTION`] below
//! (the client's docs list which call needs which rule, and why).
//! Heartbeats are the exception: the agent retries them at the heartbeat
//! interval, since a growing backoff would outlast the scheduler's lost
//! timeout.

pub mod agent;
pub mod inspection;
pub mod report;
pub mod suspects;

use std::time::Duration;
use trainyard_client::{Retry, RetryPolicy};

/// Longest wait between two attempts to reach the API.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Registration: until it succeeds, whatever the answer (a refusal is
/// logged and tried again: an admin may fix the join token meanwhile).
pub const REGISTER: RetryPolicy =
    RetryPolicy::forever(Duration::from_millis(200), MAX_BACKOFF).retrying(Retry::Any);

/// Reports: until the API takes or refuses them for good (a 409 or 403 of
/// the fence, a 401 or 404 for a credential it no longer knows) or the
/// executor's grace period ends at shutdown, whatever else fails, from one
/// flush interval up to [`MAX_BACKOFF`].
pub const REPORT: RetryPolicy =
    RetryPolicy::forever(report::FLUSH_EVERY, MAX_BACKOFF).retrying(Retry::Any);

/// Inspection reports: until the API takes or refuses them (a 4xx).
pub const INSPECTION: RetryPolicy =
    RetryPolicy::forever(Duration::from_millis(200), Duration::from_millis(3200));
