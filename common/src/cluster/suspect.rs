//! Suspect reports: a data-plane peer that lost its connection to another
//! executor asks the control plane to judge whether that executor is gone.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// `POST /v1/executors/{id}/suspects`: a data-plane peer of `suspect` saw
/// its connection reset, closed or time out while both held roles of
/// `job_id` at `generation`, and could not reach it again.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SuspectReport {
    /// The job both executors serve.
    pub job_id: Uuid,
    /// The generation the reporter's role belongs to.
    pub generation: i64,
    /// The executor suspected dead.
    pub suspect: Uuid,
    /// What the reporter saw (at most [`MAX_SUSPECT_REASON_CHARS`]).
    pub reason: String,
}

/// Longest reason a suspect report may carry.
pub const MAX_SUSPECT_REASON_CHARS: usize = 1000;

/// What the scheduler decided about a [`SuspectReport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SuspectVerdict {
    /// Confirmed: the suspect was declared lost and its roles re-placed.
    Confirmed,
    /// Not confirmed (it answered, or its heartbeat is fresh): nothing
    /// changes; the heartbeat timeout still applies.
    Rejected,
    /// Moot: the job moved to another generation or ended, the suspect
    /// holds no role of it, or it is already lost or gone.
    Stale,
}

/// Answer to a [`SuspectReport`].
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SuspectAnswer {
    /// The decision.
    pub verdict: SuspectVerdict,
    /// Its evidence, as the job's event says it.
    pub evidence: String,
}
