//! TorchScript jobs are inspected before they are planned: a live executor
//! loads the file and reports its tensors. This hands each such job to the
//! least busy live executor (`queued → inspecting`) and moves an
//! inspection whose inspector is gone to another. An executor that cannot
//! confine users' code (its sandbox `unavailable`) is never an inspector.

use super::error::{db_err, SchedulerError};
use crate::lifecycle::{self, event, transition};
use sqlx::PgPool;
use trainyard_common::{EventData, JobState};
use uuid::Uuid;

/// Gives each TorchScript job that has not been inspected to a live
/// executor (moving it to `inspecting`), and moves the inspection of a
/// lost or departed inspector to another.
pub(super) async fn assign_inspections(db: &PgPool) -> Result<(), SchedulerError> {
    let pending: Vec<(Uuid, JobState, Option<Uuid>)> = sqlx::query_as(
        "SELECT j.id, j.state, j.inspector FROM jobs j
         WHERE j.state IN ('queued', 'inspecting') AND j.params IS NULL AND j.model_kind = 'torchscript'
           AND NOT EXISTS (SELECT 1 FROM executors e WHERE e.id = j.inspector AND e.state = 'live' AND j.state = 'inspecting')
         ORDER BY j.priority DESC, j.created_at",
    )
    .fetch_all(db)
    .await?;
    for (job, state, previous) in pending {
        let pick: Option<(Uuid, String)> = sqlx::query_as(
            "SELECT e.id, e.name FROM executors e WHERE e.state = 'live'
               AND coalesce(e.sandbox->>'state', '') <> 'unavailable'
             ORDER BY (SELECT count(*) FROM jobs j WHERE j.inspector = e.id AND j.state = 'inspecting'), e.id LIMIT 1",
        )
        .fetch_optional(db)
        .await?;
        let mut tx = db.begin().await?;
        // Re-check under the row lock: a cancel may have come first.
        let still: Option<JobState> = sqlx::query_scalar(
            "SELECT state FROM jobs WHERE id = $1 AND params IS NULL FOR UPDATE",
        )
        .bind(job)
        .fetch_optional(&mut *tx)
        .await?;
        if still != Some(state) {
            continue;
        }
        match pick {
            None => {
                sqlx::query(
                    "UPDATE jobs SET state_reason = $2 WHERE id = $1 AND state_reason <> $2",
                )
                .bind(job)
                .bind("waiting: no live executor that can confine users' code to inspect the TorchScript file")
                .execute(&mut *tx)
                .await?;
            }
            Some((exec, name)) => {
                sqlx::query("UPDATE jobs SET inspector = $2 WHERE id = $1")
                    .bind(job)
                    .bind(exec)
                    .execute(&mut *tx)
                    .await?;
                let reason = format!("loading the TorchScript file on {name} to learn its tensors");
                if state == JobState::Queued {
                    transition(&mut tx, job, JobState::Inspecting, &reason)
                        .await
                        .map_err(db_err)?;
                } else {
                    let why = format!(
                        "inspector {} is gone; {reason}",
                        previous.map_or("?".into(), |p| p.to_string())
                    );
                    event(&mut tx, job, &EventData::Inspection, &why).await?;
                    lifecycle::notify(&mut tx, job).await?;
                }
            }
        }
        tx.commit().await?;
    }
    Ok(())
}
