//! The exporter: one background task per API server that sends each
//! tracked job's run to MLflow, from the job's row of `tracking_exports`.
//!
//! Each round it picks the rows that are due and gives each a turn (two at
//! a time). A turn locks its row for its transaction (`FOR UPDATE SKIP
//! LOCKED`: of several API replicas, one exports a job at a time) and
//! goes as far as it can: find or make the experiment and make the run
//! (tags: job id, owner, pattern, generation), log the spec as params, then
//! rank 0's stored steps after the row's cursor in batches of at most 1000
//! metrics (at most [`BATCHES_PER_TURN`] a turn, so one long job does not
//! hold the others back), and once the job has ended and every step is
//! sent, upload the final model (streamed from the store; a script job's
//! outputs instead, bounded) and end the run
//! with the job's status. The row is updated with what was reached in the
//! same transaction, so a restarted server resumes from the cursor: what
//! was sent is not sent again, what was not is. (A batch that MLflow took
//! just before this server died, without its commit, is sent again.)
//!
//! A tracker that does not answer is tried again with exponential backoff
//! (1 s doubling to 5 min) and gets the job one `tracking` warning event
//! per outage; once the job has ended, [`GIVE_UP_AFTER`] failures in a row
//! end the export with a last event. What MLflow refuses as such (a 4xx)
//! is skipped, with an event, so that one bad value cannot stall a run.

use super::mlflow::{ArtifactPlace, Metric, Mlflow, MlflowError};
use super::params;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde_json::Value;
use sqlx::{PgConnection, PgPool, Row};
use std::sync::Arc;
use std::time::Duration;
use trainyard_common::event::TrackingWarning;
use trainyard_common::{EventData, JobState};
use trainyard_scheduler::lifecycle;
use trainyard_shutdown::Shutdown;
use uuid::Uuid;

/// How often the exporter looks for due rows.
pub const POLL: Duration = Duration::from_secs(1);
/// Rows given a turn per round.
const ROWS_PER_ROUND: i64 = 16;
/// Turns at once (each holds a pooled connection while it talks to MLflow).
const CONCURRENT_TURNS: usize = 2;
/// The metrics of one step (see [`metrics_of`]).
const METRICS_PER_STEP: usize = 8;
/// Steps per batch: MLflow takes at most 1000 metrics a batch.
const STEPS_PER_BATCH: i64 = (1000 / METRICS_PER_STEP) as i64;
/// Metric batches one turn sends at most.
pub const BATCHES_PER_TURN: usize = 8;
/// MLflow takes at most 100 params a batch.
const PARAMS_PER_BATCH: usize = 100;
/// Most output files of a script job uploaded as artifacts.
pub const MAX_OUTPUT_ARTIFACTS: usize = 100;
/// Most output bytes of a script job uploaded as artifacts.
pub const MAX_OUTPUT_ARTIFACT_BYTES: u64 = 4 << 30;
/// Longest backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Failures in a row, after the job ended, that end its export.
pub const GIVE_UP_AFTER: i32 = 20;

/// Runs the exporter until `stop`.
pub async fn run(db: PgPool, store: Arc<trainyard_store::Store>, stop: Shutdown) {
    let http = super::mlflow::http_client();
    while !stop.is_triggered() {
        let due: Result<Vec<Uuid>, sqlx::Error> = sqlx::query_scalar(
            "SELECT job_id FROM tracking_exports
             WHERE NOT finished AND next_try <= clock_timestamp()
             ORDER BY next_try LIMIT $1",
        )
        .bind(ROWS_PER_ROUND)
        .fetch_all(&db)
        .await;
        match due {
            Ok(ids) => {
                futures::stream::iter(ids)
                    .for_each_concurrent(CONCURRENT_TURNS, |id| {
                        let (db, store, http, stop) = (&db, &store, &http, &stop);
                        async move {
                            if let Err(e) = turn(db, store, http, stop, id).await {
                                tracing::warn!(job = %id, "tracking export: {e}");
                            }
                        }
                    })
                    .await;
            }
            Err(e) => tracing::warn!("tracking export: reading due jobs: {e}"),
        }
        tokio::select! {
            () = stop.wait() => break,
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

/// A job's row and what of the job the export needs.
struct Row_ {
    uri: String,
    experiment: String,
    experiment_id: Option<String>,
    run_id: Option<String>,
    artifact_uri: Option<String>,
    exported_step: i64,
    params_done: bool,
    failures: i32,
    warned: bool,
    name: String,
    owner: String,
    state: JobState,
    generation: i64,
    strategy: Option<String>,
    spec: Value,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

/// Why a turn stopped short.
#[derive(Debug, thiserror::Error)]
enum Stop {
    #[error(transparent)]
    Mlflow(#[from] MlflowError),
    #[error("the object store: {0}")]
    Store(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// How far a turn got.
enum Reached {
    /// Steps remain: the next turn at once.
    More,
    /// Caught up with a job that still runs: the next turn after [`POLL`].
    CaughtUp,
    /// The run is ended.
    Done,
}

async fn turn(
    db: &PgPool,
    store: &trainyard_store::Store,
    http: &reqwest::Client,
    stop: &Shutdown,
    id: Uuid,
) -> Result<(), sqlx::Error> {
    let mut tx = db.begin().await?;
    let Some(r) = sqlx::query(
        "SELECT t.uri, t.experiment, t.experiment_id, t.run_id, t.artifact_uri, t.exported_step,
                t.params_done, t.failures, t.warned,
                j.name, j.owner, j.state, j.generation, j.strategy, j.spec, j.created_at, j.finished_at
         FROM tracking_exports t JOIN jobs j ON j.id = t.job_id
         WHERE t.job_id = $1 AND NOT t.finished AND t.next_try <= clock_timestamp()
         FOR UPDATE OF t SKIP LOCKED",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?
    else {
        // Another replica has it, or it is no longer due.
        return Ok(());
    };
    let mut row = Row_ {
        uri: r.try_get("uri")?,
        experiment: r.try_get("experiment")?,
        experiment_id: r.try_get("experiment_id")?,
        run_id: r.try_get("run_id")?,
        artifact_uri: r.try_get("artifact_uri")?,
        exported_step: r.try_get("exported_step")?,
        params_done: r.try_get("params_done")?,
        failures: r.try_get("failures")?,
        warned: r.try_get("warned")?,
        name: r.try_get("name")?,
        owner: r.try_get("owner")?,
        state: r.try_get("state")?,
        generation: r.try_get("generation")?,
        strategy: r.try_get("strategy")?,
        spec: r.try_get("spec")?,
        created_at: r.try_get("created_at")?,
        finished_at: r.try_get("finished_at")?,
    };
    let ml = Mlflow::new(http.clone(), &row.uri);
    let reached = export(&mut tx, store, &ml, stop, id, &mut row).await;
    let (finished, delay, error) = match reached {
        Ok(Reached::More) => (false, Duration::ZERO, None),
        Ok(Reached::CaughtUp) => (false, POLL, None),
        Ok(Reached::Done) => (true, Duration::ZERO, None),
        Err(Stop::Db(e)) => return Err(e),
        Err(e) => (false, backoff(row.failures + 1), Some(e.to_string())),
    };
    let failures = if error.is_some() { row.failures + 1 } else { 0 };
    let mut gave_up = false;
    if let Some(err) = &error {
        if !row.warned {
            warn(
                &mut tx,
                id,
                &row.uri,
                err,
                "retrying",
                &format!(
                    "MLflow at {} did not take the job's run ({err}); the job trains on, and its run is sent when MLflow answers",
                    row.uri
                ),
            )
            .await?;
            row.warned = true;
        }
        if row.state.is_terminal() && failures >= GIVE_UP_AFTER {
            warn(
                &mut tx,
                id,
                &row.uri,
                err,
                "gave_up",
                &format!(
                    "MLflow at {} failed {failures} times in a row after the job ended ({err}); its run is left as it is",
                    row.uri
                ),
            )
            .await?;
            gave_up = true;
        }
    }
    sqlx::query(
        "UPDATE tracking_exports SET experiment_id = $2, run_id = $3, artifact_uri = $4,
             exported_step = $5, params_done = $6, finished = $7, failures = $8,
             next_try = clock_timestamp() + make_interval(secs => $9), last_error = $10,
             warned = $11, updated_at = clock_timestamp()
         WHERE job_id = $1",
    )
    .bind(id)
    .bind(&row.experiment_id)
    .bind(&row.run_id)
    .bind(&row.artifact_uri)
    .bind(row.exported_step)
    .bind(row.params_done)
    .bind(finished || gave_up)
    .bind(failures)
    .bind(delay.as_secs_f64())
    .bind(&error)
    // A new outage after a success warns again.
    .bind(row.warned && error.is_some())
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// The pause after `failures` failures in a row: 1 s doubling, at most
/// [`MAX_BACKOFF`].
pub fn backoff(failures: i32) -> Duration {
    let exp = failures.clamp(1, 16) as u32 - 1;
    Duration::from_secs(1u64 << exp).min(MAX_BACKOFF)
}

async fn warn(
    tx: &mut PgConnection,
    id: Uuid,
    uri: &str,
    error: &str,
    action: &str,
    reason: &str,
) -> Result<(), sqlx::Error> {
    tracing::warn!(job = %id, "{reason}");
    let data = EventData::Tracking(TrackingWarning {
        tracker: "mlflow".into(),
        uri: uri.to_owned(),
        error: params::truncate(error, 2000),
        action: action.into(),
    });
    lifecycle::event(&mut *tx, id, &data, &params::truncate(reason, 4000)).await?;
    lifecycle::notify(&mut *tx, id).await
}

async fn export(
    tx: &mut PgConnection,
    store: &trainyard_store::Store,
    ml: &Mlflow,
    stop: &Shutdown,
    id: Uuid,
    row: &mut Row_,
) -> Result<Reached, Stop> {
    let (experiment_id, run_id) = match (&row.experiment_id, &row.run_id) {
        (Some(e), Some(r)) => (e.clone(), r.clone()),
        _ => {
            let experiment_id = ml.experiment_id(&row.experiment).await?;
            let mut tags = vec![
                ("trainyard.job_id".to_owned(), id.to_string()),
                ("trainyard.owner".to_owned(), row.owner.clone()),
                ("mlflow.user".to_owned(), row.owner.clone()),
                ("mlflow.source.name".to_owned(), "trainyard".to_owned()),
            ];
            tags.extend(live_tags(row));
            let run = ml
                .create_run(
                    &experiment_id,
                    &row.name,
                    row.created_at.timestamp_millis(),
                    &tags,
                )
                .await?;
            row.experiment_id = Some(experiment_id.clone());
            row.run_id = Some(run.run_id.clone());
            row.artifact_uri = Some(run.artifact_uri);
            (experiment_id, run.run_id)
        }
    };
    if !row.params_done {
        for chunk in params::flatten(&row.spec).chunks(PARAMS_PER_BATCH) {
            skip_refused(tx, id, row, ml.log_batch(&run_id, &[], chunk, &[]).await).await?;
        }
        row.params_done = true;
    }
    // The job's state before its metrics: a job seen ended has stored
    // every step it will (its outcome comes after its last report).
    let ended = row.state.is_terminal();
    let mut full = false;
    for _ in 0..BATCHES_PER_TURN {
        if stop.is_triggered() {
            return Ok(Reached::More);
        }
        let rows = sqlx::query(
            "SELECT step, at, loss, lr, samples_per_sec, data_seconds, compute_seconds, comm_seconds,
                    eval_loss, eval_accuracy
             FROM job_metrics WHERE job_id = $1 AND rank = 0 AND step > $2 ORDER BY step LIMIT $3",
        )
        .bind(id)
        .bind(row.exported_step)
        .bind(STEPS_PER_BATCH)
        .fetch_all(&mut *tx)
        .await?;
        let Some(last) = rows.last() else {
            full = false;
            break;
        };
        let last: i64 = last.try_get("step")?;
        let mut metrics = Vec::with_capacity(rows.len() * METRICS_PER_STEP);
        for r in &rows {
            metrics.extend(metrics_of(r)?);
        }
        let sent = ml.log_batch(&run_id, &metrics, &[], &live_tags(row)).await;
        skip_refused(tx, id, row, sent).await?;
        row.exported_step = last;
        full = rows.len() as i64 == STEPS_PER_BATCH;
        if !full {
            break;
        }
    }
    if full {
        return Ok(Reached::More);
    }
    if !ended {
        return Ok(Reached::CaughtUp);
    }
    if row.state == JobState::Succeeded {
        let place = ArtifactPlace {
            artifact_uri: row.artifact_uri.as_deref().unwrap_or(""),
            experiment_id: &experiment_id,
            run_id: &run_id,
        };
        match store
            .stream(&trainyard_common::checkpoint::model_key(id))
            .await
        {
            Ok((size, body)) => {
                let sent = ml.upload(&place, "model.safetensors", size, body).await;
                skip_refused(tx, id, row, sent).await?;
            }
            // A script job has outputs, not a model: they are its artifacts.
            Err(trainyard_store::StoreError::NotFound(_)) => {
                upload_outputs(tx, store, ml, &place, id, row).await?;
            }
            Err(e) => return Err(Stop::Store(e.to_string())),
        }
    }
    let status = match row.state {
        JobState::Succeeded => "FINISHED",
        JobState::Cancelled => "KILLED",
        _ => "FAILED",
    };
    let end = row.finished_at.unwrap_or_else(Utc::now).timestamp_millis();
    // The last tags (the generation it ended in) with the end.
    let sent = ml.log_batch(&run_id, &[], &[], &live_tags(row)).await;
    skip_refused(tx, id, row, sent).await?;
    ml.end_run(&run_id, status, end).await?;
    Ok(Reached::Done)
}

/// A script job's outputs (what rank 0 left in `TRAINYARD_OUTPUT_DIR`) as
/// the run's artifacts under `outputs/`, at most [`MAX_OUTPUT_ARTIFACTS`]
/// files and [`MAX_OUTPUT_ARTIFACT_BYTES`] in all: what is over the bound
/// stays at `/v1/jobs/{id}/outputs`, and the job gets a `skipped` warning
/// saying so. A turn cut short uploads them all again (a PUT replaces).
async fn upload_outputs(
    tx: &mut PgConnection,
    store: &trainyard_store::Store,
    ml: &Mlflow,
    place: &ArtifactPlace<'_>,
    id: Uuid,
    row: &Row_,
) -> Result<(), Stop> {
    let prefix = trainyard_common::checkpoint::outputs_prefix(id);
    let listed = store
        .list(&prefix)
        .await
        .map_err(|e| Stop::Store(e.to_string()))?;
    let (mut files, mut bytes, mut left) = (0usize, 0u64, 0usize);
    for (key, size) in listed {
        let Some(path) = key.strip_prefix(&prefix) else {
            continue;
        };
        if files == MAX_OUTPUT_ARTIFACTS || bytes + size > MAX_OUTPUT_ARTIFACT_BYTES {
            left += 1;
            continue;
        }
        let name = artifact_name(path);
        match store.stream(&key).await {
            Ok((size, body)) => {
                let sent = ml.upload(place, &name, size, body).await;
                skip_refused(tx, id, row, sent).await?;
                files += 1;
                bytes += size;
            }
            // Gone since the listing: nothing to send.
            Err(trainyard_store::StoreError::NotFound(_)) => {}
            Err(e) => return Err(Stop::Store(e.to_string())),
        }
    }
    if left > 0 {
        let reason = format!(
            "{left} of the job's outputs are not uploaded to MLflow at {} (at most {MAX_OUTPUT_ARTIFACTS} files and {} MiB go there); \
             every output stays at /v1/jobs/{id}/outputs",
            row.uri,
            MAX_OUTPUT_ARTIFACT_BYTES >> 20
        );
        warn(
            tx,
            id,
            &row.uri,
            "outputs over the bound",
            "skipped",
            &reason,
        )
        .await?;
    }
    Ok(())
}

/// The artifact path of output `path` (relative, checked by the executor
/// and the store): `outputs/` and each segment percent-encoded, so that
/// no name can step out of the run's folder or break the URL.
fn artifact_name(path: &str) -> String {
    let segments: Vec<String> = path
        .split('/')
        .map(|s| {
            s.bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect()
        })
        .collect();
    format!("outputs/{}", segments.join("/"))
}

/// `sent`, with a refusal of the request itself turned into a `skipped`
/// warning (the export goes on past it); other errors stop the turn.
async fn skip_refused(
    tx: &mut PgConnection,
    id: Uuid,
    row: &Row_,
    sent: Result<(), MlflowError>,
) -> Result<(), Stop> {
    match sent {
        Err(e) if e.is_permanent() => {
            let reason = format!(
                "MLflow at {} refused part of the job's run, which is left out: {e}",
                row.uri
            );
            warn(tx, id, &row.uri, &e.to_string(), "skipped", &reason).await?;
            Ok(())
        }
        other => Ok(other?),
    }
}

/// The tags that change while a job runs: its generation and pattern.
fn live_tags(row: &Row_) -> Vec<(String, String)> {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let strategy = row
        .strategy
        .clone()
        .unwrap_or_else(|| text(&row.spec["strategy"]));
    let mut tags = vec![
        (
            "trainyard.generation".to_owned(),
            row.generation.to_string(),
        ),
        ("trainyard.strategy".to_owned(), strategy.clone()),
    ];
    if strategy != "allreduce" && !row.spec["consistency"].is_null() {
        tags.push((
            "trainyard.consistency".to_owned(),
            params::truncate(&text(&row.spec["consistency"]), params::MAX_TAG_VALUE_CHARS),
        ));
    }
    tags
}

/// One stored step as MLflow metrics (the evaluation's only where it ran).
fn metrics_of(r: &sqlx::postgres::PgRow) -> Result<Vec<Metric>, sqlx::Error> {
    let step: i64 = r.try_get("step")?;
    let at: DateTime<Utc> = r.try_get("at")?;
    let timestamp_ms = at.timestamp_millis();
    let mut out = Vec::with_capacity(METRICS_PER_STEP);
    for key in [
        "loss",
        "lr",
        "samples_per_sec",
        "data_seconds",
        "compute_seconds",
        "comm_seconds",
        "eval_loss",
        "eval_accuracy",
    ] {
        if let Some(value) = r.try_get::<Option<f64>, _>(key)? {
            out.push(Metric {
                key,
                value,
                timestamp_ms,
                step,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_artifact_names_stay_in_the_outputs_folder() {
        assert_eq!(artifact_name("model.pt"), "outputs/model.pt");
        assert_eq!(artifact_name("a b/ç?.pt"), "outputs/a%20b/%C3%A7%3F.pt");
        assert_eq!(artifact_name("x%2F..%2Fy"), "outputs/x%252F..%252Fy");
        assert_eq!(artifact_name("q#frag&x=1"), "outputs/q%23frag%26x%3D1");
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(5), Duration::from_secs(16));
        assert_eq!(backoff(9), Duration::from_secs(256));
        assert_eq!(backoff(10), MAX_BACKOFF);
        assert_eq!(backoff(1000), MAX_BACKOFF);
        assert_eq!(backoff(0), Duration::from_secs(1));
    }

    #[test]
    fn a_batch_stays_within_mlflows_limit() {
        assert!(STEPS_PER_BATCH as usize * METRICS_PER_STEP <= 1000);
    }
}
