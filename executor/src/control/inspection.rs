//! An inspection's answer to the API: what a job's TorchScript file holds.
//!
//! Until the API takes it, or refuses it for good (a 4xx): giving up would
//! leave the job `inspecting` for ever, and the API may be down for a while
//! (restarts, Postgres).

use super::report::Sink;
use super::INSPECTION;
use std::time::Instant;
use trainyard_common::cluster::InspectionReport;

/// Delivers `report`, retrying as [`INSPECTION`] says.
pub async fn deliver(sink: Sink, report: InspectionReport) {
    let job = report.job_id;
    let started = Instant::now();
    for attempt in 1u32.. {
        let id = sink.executor_id();
        let error = match sink.client.report_inspection(id, &report).await {
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
