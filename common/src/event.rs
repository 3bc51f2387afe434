//! What a job's event log records: one [`EventKind`] per entry. The API
//! answers with these names (`GET /v1/jobs/{id}/events`), the web UI and
//! the SDK read them, and Postgres stores them as the enum `event_kind`
//! (feature `sqlx`), so a writer cannot invent a kind no reader knows.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The kind of an entry of a job's event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type))]
#[cfg_attr(
    feature = "sqlx",
    sqlx(type_name = "event_kind", rename_all = "snake_case")
)]
pub enum EventKind {
    /// The job was stored (`to_state` is `queued`).
    Submitted,
    /// A state change (`from_state` → `to_state`).
    Transition,
    /// How `strategy: auto` was decided.
    Strategy,
    /// A new generation's roles (`data`: the generation and its roles).
    Placement,
    /// The TorchScript model's inspection moved to another executor.
    Inspection,
    /// A checkpoint committed (`data`: its step and manifest).
    Checkpoint,
    /// The job's result (`data`: its figures and weights).
    Result,
    /// The provisioner started or could not start an executor for it.
    Provisioning,
    /// A data-plane peer's report that an executor is gone, and the verdict.
    Suspect,
    /// Preemption: asked for a checkpoint, shrunk, held back or released.
    Preemption,
    /// A rank stuck in its own work; its executor leaves the job.
    Stuck,
    /// A rank that holds the others back; left out where the spec asks.
    Straggler,
}

impl EventKind {
    /// Every kind, in the order the enum declares them.
    pub const ALL: [EventKind; 12] = [
        EventKind::Submitted,
        EventKind::Transition,
        EventKind::Strategy,
        EventKind::Placement,
        EventKind::Inspection,
        EventKind::Checkpoint,
        EventKind::Result,
        EventKind::Provisioning,
        EventKind::Suspect,
        EventKind::Preemption,
        EventKind::Stuck,
        EventKind::Straggler,
    ];

    /// The name on the wire and in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Submitted => "submitted",
            EventKind::Transition => "transition",
            EventKind::Strategy => "strategy",
            EventKind::Placement => "placement",
            EventKind::Inspection => "inspection",
            EventKind::Checkpoint => "checkpoint",
            EventKind::Result => "result",
            EventKind::Provisioning => "provisioning",
            EventKind::Suspect => "suspect",
            EventKind::Preemption => "preemption",
            EventKind::Stuck => "stuck",
            EventKind::Straggler => "straggler",
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so that a width such as `{:<8}` applies.
        f.pad(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_serde_names_and_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for k in EventKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            assert_eq!(
                serde_json::from_value::<EventKind>(k.as_str().into()).unwrap(),
                k
            );
            assert!(seen.insert(k.as_str()));
        }
        assert!(serde_json::from_value::<EventKind>("exploded".into()).is_err());
    }
}
