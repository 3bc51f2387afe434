//! `POST /v1/executors/{id}/suspects`: a data-plane peer's report that
//! another executor of its job died (a connection reset, closed or timed
//! out, and the peer could not reach it again).
//!
//! Authenticated like every executor endpoint (its own credential); the
//! reporter must hold a role of the job at the generation it names. The
//! scheduler's rule ([`trainyard_scheduler::service::suspect`]) confirms
//! or rejects the report from the platform's own evidence — a probe of the
//! suspect's data-plane address and its heartbeat's age — never from the
//! report alone, and the job's `suspect` event records the decision.

use super::access::OwnExecutor;
use super::executors::gone_if_removed;
use super::params::{parse_body, text};
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::JsonBytes;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use std::time::Duration;
use trainyard_common::cluster::{SuspectAnswer, SuspectReport, MAX_SUSPECT_REASON_CHARS};
use trainyard_scheduler::service::suspect::{judge, JudgeError};

/// Report a data-plane peer that seems dead.
///
/// The answer says whether the scheduler confirmed it (the suspect is
/// then `lost` and its roles move in a new generation), rejected it (the
/// suspect answered its probe, or its heartbeat is fresh), or found it
/// moot (another generation, a finished job, a suspect already gone).
#[utoipa::path(
    post, path = "/v1/executors/{id}/suspects", operation_id = "report_suspect", tag = "executors",
    params(("id" = Uuid, Path, description = "Executor id (the reporter)")),
    request_body(content = SuspectReport, content_type = "application/json"),
    responses(
        (status = 200, description = "The verdict and its evidence", body = SuspectAnswer),
        (status = 400, description = "The id is not a UUID, or the body is malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong executor credential", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such executor or job", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The reporter holds no role of the job at that generation", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The reporter was declared lost or left", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON (Content-Type)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid report (the suspect is the reporter, or the reason is too long)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("executor_token" = []))
)]
pub async fn report(
    State(st): State<AppState>,
    OwnExecutor { id, row }: OwnExecutor,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Json<SuspectAnswer>> {
    gone_if_removed(&row)?;
    let mut report: SuspectReport = parse_body(&body)?;
    if report.reason.chars().count() > MAX_SUSPECT_REASON_CHARS {
        return Err(ApiError::invalid_field(
            "reason",
            format!("at most {MAX_SUSPECT_REASON_CHARS} characters"),
        ));
    }
    report.reason = text(report.reason.trim());
    let interval = Duration::from_millis(st.config.heartbeat_interval_ms);
    let lost_after = interval * st.config.heartbeat_misses;
    match judge(&st.db, interval, lost_after, id, &report).await {
        Ok(answer) => Ok(Json(answer)),
        Err(JudgeError::NoJob(job)) => Err(ApiError::NotFound(format!("no job with id {job}"))),
        Err(e @ JudgeError::NotMember { .. }) => Err(ApiError::Conflict(e.to_string())),
        Err(JudgeError::Itself) => Err(ApiError::invalid_field(
            "suspect",
            "is the reporting executor itself",
        )),
        Err(JudgeError::Database(e)) => Err(e.into()),
    }
}
