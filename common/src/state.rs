//! Job lifecycle: `queued → (inspecting) → scheduling → running ⇄ recovering →
//! succeeded | failed | cancelled`.
//!
//! The same set of states is a Postgres enum (`job_state`, see `migrations/`),
//! read and bound as this type (feature `sqlx`);
//! [`JobState::can_move_to`] is the one place that says which moves are legal,
//! and every move is written with an event row by the code that makes it.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use utoipa::ToSchema;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type))]
#[cfg_attr(
    feature = "sqlx",
    sqlx(type_name = "job_state", rename_all = "snake_case")
)]
pub enum JobState {
    /// Stored, waiting for the scheduler.
    Queued,
    /// An executor is loading a TorchScript model to report its parameters.
    Inspecting,
    /// Waiting until the minimum set of roles can be placed at once.
    Scheduling,
    /// Training.
    Running,
    /// A membership change is in progress (new generation being formed).
    Recovering,
    /// Finished training; final weights are available.
    Succeeded,
    /// Stopped by an error; the event log says why.
    Failed,
    /// Stopped by a user.
    Cancelled,
}

impl JobState {
    /// Every state, in lifecycle order.
    pub const ALL: [JobState; 8] = [
        JobState::Queued,
        JobState::Inspecting,
        JobState::Scheduling,
        JobState::Running,
        JobState::Recovering,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// The name used on the wire and in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Inspecting => "inspecting",
            JobState::Scheduling => "scheduling",
            JobState::Running => "running",
            JobState::Recovering => "recovering",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// A terminal state is never left again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// Whether the lifecycle allows moving from `self` to `next`.
    pub fn can_move_to(self, next: JobState) -> bool {
        use JobState::*;
        if self.is_terminal() || self == next {
            return false;
        }
        match next {
            // A placed job whose minimum set no longer fits releases every
            // role and waits in the queue again.
            Queued => matches!(self, Scheduling | Running | Recovering),
            Inspecting => self == Queued,
            Scheduling => matches!(self, Queued | Inspecting),
            Running => matches!(self, Scheduling | Recovering),
            Recovering => self == Running,
            Succeeded => matches!(self, Running | Recovering),
            // Any live job can fail or be cancelled.
            Failed | Cancelled => true,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text is not one of the job states.
#[derive(Debug, thiserror::Error)]
#[error("unknown job state {0:?}; expected one of queued, inspecting, scheduling, running, recovering, succeeded, failed, cancelled")]
pub struct UnknownState(pub String);

impl FromStr for JobState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>().unwrap(), s);
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{s}\""));
        }
        assert!("done".parse::<JobState>().is_err());
    }

    #[test]
    fn terminal_states_are_never_left() {
        for from in JobState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in JobState::ALL {
                assert!(!from.can_move_to(to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn happy_path_is_legal() {
        use JobState::*;
        let path = [
            Queued, Inspecting, Scheduling, Running, Recovering, Running, Succeeded,
        ];
        for w in path.windows(2) {
            assert!(w[0].can_move_to(w[1]), "{} -> {}", w[0], w[1]);
        }
        assert!(Queued.can_move_to(Cancelled));
        assert!(!Queued.can_move_to(Running));
        assert!(Running.can_move_to(Queued), "released for lack of capacity");
        assert!(!Inspecting.can_move_to(Queued));
    }
}
