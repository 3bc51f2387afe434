//! An inspection's answer to the API: what a job's TorchScript file holds.
//!
//! Until the API takes it, or refuses it for good (a 4xx): giving up would
//! leave the job `inspecting` for ever, and the API may be down for a while
//! (restarts, Postgres).
//!
//! [`super::report`]'s sink starts it, handing over only the client and a
//! way to read the executor's current id, so that this module needs
//! nothing of the sink's.

use super::INSPECTION;
use std::time::Instant;
use trainyard_client::Client;
use trainyard_common::cluster::InspectionReport;
use uuid::Uuid;

/// Delivers `report` through `client`, retrying as [`INSPECTION`] says.
/// Each attempt asks `executor_id` again: a registration after a 410 gives
/// the executor a new id while the delivery runs.
pub async fn deliver(client: Client, executor_id: impl Fn() -> Uuid, report: InspectionReport) {
    let job = report.job_id;
    let started = Instant::now();
    for attempt in 1u32.. {
        let id = executor_id();
        let error = match client.report_inspection(id, &report).await {
            Ok(_) => {
                tracing::info!(%job, "inspection reported");
                return;
            }
            Err(e) => e,
        };
        let Some(wait) = INSPECTION.next_delay(&error, attempt, started.elapsed()) else {
            tracing::info!(%job, %error, "inspection refused");
            return;
        };
        if attempt % 20 == 0 {
            tracing::warn!(%job, attempts = attempt, %error, "the API has not taken the inspection yet; still trying");
        }
        tokio::time::sleep(wait).await;
    }
}
