//! `GET /v1/jobs/{id}/tensorboard`: every stored step metric of a job (rank
//! 0's, the curve `GET /v1/jobs/{id}/metrics` shows, here never averaged)
//! as a TensorBoard event file, encoded by [`crate::tfevents`].
//!
//! The file is streamed: the rows are read in pages by step and each page
//! is encoded and sent before the next is read, so a long job's file never
//! sits whole in memory. Tags follow TensorBoard's `group/name` habit:
//! `train/loss`, `train/lr`, `train/samples_per_sec`, `train/data_seconds`,
//! `train/compute_seconds`, `train/comm_seconds`, `eval/loss`,
//! `eval/accuracy`; the events' wall time is when the step was stored.

use super::job_rows::job_not_found;
use crate::error::{ApiResult, Problem};
use crate::extract::JobId;
use crate::tfevents;
use crate::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

/// Rows read and encoded at a time.
const PAGE_ROWS: i64 = 1000;

/// The columns exported, with their tags (the evaluation ones are absent
/// on steps without an evaluation).
const SCALARS: [(&str, &str); 8] = [
    ("loss", "train/loss"),
    ("lr", "train/lr"),
    ("samples_per_sec", "train/samples_per_sec"),
    ("data_seconds", "train/data_seconds"),
    ("compute_seconds", "train/compute_seconds"),
    ("comm_seconds", "train/comm_seconds"),
    ("eval_loss", "eval/loss"),
    ("eval_accuracy", "eval/accuracy"),
];

/// Download the job's metrics as a TensorBoard event file.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/tensorboard", operation_id = "job_tensorboard", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id")),
    responses(
        (status = 200, description = "A TensorBoard event file (`events.out.tfevents.<ts>.trainyard`, TFRecords of `Event` messages) with every step metric of rank 0: `train/loss`, `train/lr`, `train/samples_per_sec`, `train/data_seconds`, `train/compute_seconds`, `train/comm_seconds`, and `eval/loss`, `eval/accuracy` where evaluated. Put it in a folder and run `tensorboard --logdir` on it.", content_type = "application/octet-stream"),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn tensorboard(State(st): State<AppState>, JobId(id): JobId) -> ApiResult<Response> {
    let created: DateTime<Utc> = sqlx::query_scalar("SELECT created_at FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_optional(&st.db)
        .await?
        .ok_or_else(|| job_not_found(id))?;
    let mut head = Vec::new();
    tfevents::write_record(&mut head, &tfevents::version_event(seconds(created)));
    let first = futures::stream::once(async move { Ok::<_, std::io::Error>(head) });
    let db = st.db.clone();
    // The state: the last step sent, or None once the rows are done.
    let pages = futures::stream::try_unfold(Some(0i64), move |after| {
        let db = db.clone();
        async move {
            let Some(after) = after else {
                return Ok(None);
            };
            let (bytes, last) = page(&db, id, after).await.map_err(|e| {
                tracing::warn!(job = %id, "tensorboard file cut short: {e}");
                std::io::Error::other(e)
            })?;
            Ok(Some((bytes, last)))
        }
    });
    use futures::StreamExt;
    let body = first.chain(pages);
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!(
                    "attachment; filename=\"events.out.tfevents.{}.trainyard\"",
                    created.timestamp()
                ),
            ),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}

fn seconds(at: DateTime<Utc>) -> f64 {
    at.timestamp_micros() as f64 / 1e6
}

/// The encoded events of up to [`PAGE_ROWS`] steps after `after`, and the
/// next state: the last step encoded, or None after the last page.
async fn page(
    db: &sqlx::PgPool,
    id: Uuid,
    after: i64,
) -> Result<(Vec<u8>, Option<i64>), sqlx::Error> {
    let rows = sqlx::query(
        "SELECT step, at, loss, lr, samples_per_sec, data_seconds, compute_seconds, comm_seconds,
                eval_loss, eval_accuracy
         FROM job_metrics WHERE job_id = $1 AND rank = 0 AND step > $2 ORDER BY step LIMIT $3",
    )
    .bind(id)
    .bind(after)
    .bind(PAGE_ROWS)
    .fetch_all(db)
    .await?;
    let mut out = Vec::with_capacity(rows.len() * SCALARS.len() * 64);
    let mut last = after;
    for r in &rows {
        let step: i64 = r.try_get("step")?;
        let wall = seconds(r.try_get("at")?);
        for (column, tag) in SCALARS {
            if let Some(v) = r.try_get::<Option<f64>, _>(column)? {
                tfevents::write_record(
                    &mut out,
                    &tfevents::scalar_event(wall, step, tag, v as f32),
                );
            }
        }
        last = step;
    }
    let next = (rows.len() as i64 == PAGE_ROWS).then_some(last);
    Ok((out, next))
}
