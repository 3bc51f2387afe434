//! Peer-reported failures: a data-plane peer that saw a connection to
//! another executor of its job reset, close or time out reports it at once
//! (`POST /v1/executors/{id}/suspects`), and the scheduler confirms before
//! it acts.
//!
//! One report from one peer never evicts an executor by itself: a
//! partition may merely separate the two while the suspect lives on. The
//! confirmation is the platform's own look at the suspect, independent of
//! the reporter: a short TCP probe of the suspect's data-plane address
//! from this process ([`probe`]) and the age of its last heartbeat
//! ([`decide`]):
//!
//! * the probe is refused — its host answers but nothing listens where its
//!   data plane was (the process died: a SIGKILL, a crash): **confirmed**;
//! * the probe connects: the suspect lives and this process reaches it, so
//!   the report is a partition between the two peers (or the reporter's
//!   own trouble): **rejected**, whatever its heartbeat says;
//! * the probe gets no answer in [`PROBE_TIMEOUT`] (its host is down or cut
//!   from here too): confirmed only if its heartbeat is also late (older
//!   than [`SILENT_AFTER`] heartbeat intervals); otherwise rejected.
//!
//! A confirmed suspect is marked `lost` exactly as the heartbeat timeout
//! would mark it, and the executors channel is notified, so the leader's
//! next round (at once) re-places its roles in a new generation. Either way
//! the decision and its evidence (who reported what, the probe's outcome
//! and time, the heartbeat's age) are a `suspect` event of the job; a
//! rejection is written once per suspect and generation, however many
//! peers report it. Reports about another generation, a finished job, or a
//! suspect that no longer holds a role of the job are moot: answered
//! [`SuspectVerdict::Stale`] and not recorded.

use super::EXECUTOR_CHANNEL;
use crate::lifecycle;
use sqlx::PgPool;
use std::time::{Duration, Instant};
use trainyard_common::cluster::{ExecutorState, SuspectAnswer, SuspectReport, SuspectVerdict};
use trainyard_common::event::{self, EventData};
use trainyard_common::JobState;
use uuid::Uuid;

/// How long the probe waits for the suspect's data plane to answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// Heartbeat intervals of silence after which a suspect the probe cannot
/// reach is confirmed (a live executor's beat is never older than about
/// one interval).
pub const SILENT_AFTER: f64 = 1.5;

/// What the probe of a suspect's data-plane address saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// A TCP connection was accepted: something listens there.
    Answered,
    /// The connection was refused: nothing listens there.
    Refused,
    /// No answer within [`PROBE_TIMEOUT`], or the network said the host is
    /// unreachable.
    Silent,
}

impl ProbeOutcome {
    fn as_str(self) -> &'static str {
        match self {
            ProbeOutcome::Answered => "answered",
            ProbeOutcome::Refused => "refused",
            ProbeOutcome::Silent => "silent",
        }
    }
}

/// Connects to `address` (closing at once) and says how that went, with
/// how long it took.
pub async fn probe(address: &str, timeout: Duration) -> (ProbeOutcome, Duration) {
    let start = Instant::now();
    let outcome = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(address)).await
    {
        Ok(Ok(_)) => ProbeOutcome::Answered,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => ProbeOutcome::Refused,
        Ok(Err(_)) | Err(_) => ProbeOutcome::Silent,
    };
    (outcome, start.elapsed())
}

/// The rule (see the module docs): whether a suspect whose probe saw
/// `probe` and whose last heartbeat is `heartbeat_age` old, with beats due
/// every `interval`, is confirmed dead. Only a refused probe, or silence
/// on both channels, confirms.
pub fn decide(probe: ProbeOutcome, heartbeat_age: Duration, interval: Duration) -> bool {
    match probe {
        ProbeOutcome::Refused => true,
        ProbeOutcome::Answered => false,
        ProbeOutcome::Silent => heartbeat_age.as_secs_f64() > SILENT_AFTER * interval.as_secs_f64(),
    }
}

/// Why a report could not be judged.
#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    /// No such job.
    #[error("no job with id {0}")]
    NoJob(Uuid),
    /// The reporter holds no role of the job at that generation.
    #[error("this executor holds no role of job {job} at generation {generation}")]
    NotMember {
        /// The job.
        job: Uuid,
        /// The generation reported.
        generation: i64,
    },
    /// The suspect is the reporter.
    #[error("an executor cannot report itself")]
    Itself,
    /// The database failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

fn stale(evidence: String) -> SuspectAnswer {
    SuspectAnswer {
        verdict: SuspectVerdict::Stale,
        evidence,
    }
}

/// Judges `report` from executor `reporter` (its `reason` already cleaned
/// by the caller), with heartbeats due every `interval` and lost after
/// `lost_after`; writes the verdict (see the module docs).
pub async fn judge(
    db: &PgPool,
    interval: Duration,
    lost_after: Duration,
    reporter: Uuid,
    report: &SuspectReport,
) -> Result<SuspectAnswer, JudgeError> {
    if report.suspect == reporter {
        return Err(JudgeError::Itself);
    }
    if let Some(why) = stale_report(db, reporter, report).await? {
        return Ok(stale(why));
    }
    let names: Vec<(Uuid, String, String, ExecutorState, f64)> = sqlx::query_as(
        "SELECT id, name, address, state,
                extract(epoch FROM clock_timestamp() - last_heartbeat_at)::float8
         FROM executors WHERE id = ANY($1)",
    )
    .bind([reporter, report.suspect].as_slice())
    .fetch_all(db)
    .await?;
    let find = |id: Uuid| names.iter().find(|r| r.0 == id);
    let reporter_name = find(reporter).map_or_else(|| reporter.to_string(), |r| r.1.clone());
    let Some((_, suspect_name, address, suspect_state, age)) = find(report.suspect).cloned() else {
        return Ok(stale("the suspect is no longer registered".into()));
    };
    if !matches!(suspect_state, ExecutorState::Live | ExecutorState::Draining) {
        return Ok(stale(format!(
            "the suspect is already {}",
            suspect_state.as_str()
        )));
    }
    let (outcome, took) = probe(&address, PROBE_TIMEOUT).await;
    let age = Duration::from_secs_f64(age.max(0.0));
    let confirmed = decide(outcome, age, interval);
    let probe_text = probe_text(outcome, &address, took);
    let heard = format!("its last heartbeat was {:.2} s ago", age.as_secs_f64());
    let evidence = if confirmed {
        format!(
            "executor {suspect_name} declared lost on {reporter_name}'s report ({}): {probe_text}, {heard}",
            report.reason
        )
    } else {
        format!(
            "executor {suspect_name}, reported by {reporter_name} ({}), was not declared lost: {probe_text} and {heard}; the two may be cut from each other (its heartbeat timeout of {:.1} s still applies)",
            report.reason,
            lost_after.as_secs_f64()
        )
    };
    let verdict = if confirmed {
        SuspectVerdict::Confirmed
    } else {
        SuspectVerdict::Rejected
    };
    let data = EventData::Suspect(event::Suspect {
        verdict,
        generation: report.generation,
        reporter,
        reporter_name: reporter_name.clone(),
        suspect: report.suspect,
        suspect_name: suspect_name.clone(),
        reason: report.reason.clone(),
        probe: event::Probe {
            address: address.clone(),
            outcome: outcome.as_str().into(),
            ms: took.as_secs_f64() * 1e3,
        },
        heartbeat_age_s: age.as_secs_f64(),
        heartbeat_interval_s: interval.as_secs_f64(),
    });
    if !record(db, report, reporter, confirmed, &data, &evidence).await? {
        return Ok(stale("the suspect is already lost or gone".into()));
    }
    Ok(SuspectAnswer { verdict, evidence })
}

/// Why `report` from `reporter` is stale (its job ended or moved on, or
/// the suspect holds no role of it), if it is; an error where the job is
/// unknown or the reporter is not one of its members.
async fn stale_report(
    db: &PgPool,
    reporter: Uuid,
    report: &SuspectReport,
) -> Result<Option<String>, JudgeError> {
    let job: Option<(i64, JobState)> =
        sqlx::query_as("SELECT generation, state FROM jobs WHERE id = $1")
            .bind(report.job_id)
            .fetch_optional(db)
            .await?;
    let Some((generation, state)) = job else {
        return Err(JudgeError::NoJob(report.job_id));
    };
    if state.is_terminal() {
        return Ok(Some(format!("the job is {state}")));
    }
    if generation != report.generation {
        return Ok(Some(format!(
            "the job is at generation {generation}, the report is of generation {}",
            report.generation
        )));
    }
    let (has_reporter, has_suspect): (Option<bool>, Option<bool>) = sqlx::query_as(
        "SELECT bool_or(executor_id = $3), bool_or(executor_id = $4)
         FROM assignments WHERE job_id = $1 AND generation = $2",
    )
    .bind(report.job_id)
    .bind(report.generation)
    .bind(reporter)
    .bind(report.suspect)
    .fetch_one(db)
    .await?;
    if has_reporter != Some(true) {
        return Err(JudgeError::NotMember {
            job: report.job_id,
            generation: report.generation,
        });
    }
    if has_suspect != Some(true) {
        return Ok(Some(
            "the suspect holds no role of the job at this generation".into(),
        ));
    }
    Ok(None)
}

/// The probe of the suspect's data-plane `address`, in words.
fn probe_text(outcome: ProbeOutcome, address: &str, took: Duration) -> String {
    match outcome {
        ProbeOutcome::Refused => format!(
            "nothing listens at its data-plane address {address} (connection refused in {:.1} ms)",
            took.as_secs_f64() * 1e3
        ),
        ProbeOutcome::Answered => format!(
            "it answered at {address} in {:.1} ms",
            took.as_secs_f64() * 1e3
        ),
        ProbeOutcome::Silent => format!("{address} did not answer within {} ms", took.as_millis()),
    }
}

/// Writes the verdict: a confirmed suspect is lost (with the job's event
/// and the executors' channel told), a rejected one is an event once per
/// suspect and generation; false where the suspect was lost already.
async fn record(
    db: &PgPool,
    report: &SuspectReport,
    reporter: Uuid,
    confirmed: bool,
    data: &EventData,
    evidence: &str,
) -> Result<bool, JudgeError> {
    let mut tx = db.begin().await?;
    if confirmed {
        let marked: Option<Uuid> = sqlx::query_scalar(
            "UPDATE executors SET state = 'lost', state_changed_at = clock_timestamp()
             WHERE id = $1 AND state IN ('live', 'draining') RETURNING id",
        )
        .bind(report.suspect)
        .fetch_optional(&mut *tx)
        .await?;
        if marked.is_none() {
            return Ok(false);
        }
        lifecycle::event(&mut tx, report.job_id, data, evidence).await?;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(EXECUTOR_CHANNEL)
            .bind(report.suspect.to_string())
            .execute(&mut *tx)
            .await?;
        lifecycle::notify(&mut tx, report.job_id).await?;
        tracing::warn!(executor = %report.suspect, reporter = %reporter, job = %report.job_id, "{evidence}");
    } else {
        // Once per suspect and generation: every peer of a partitioned
        // executor may report it.
        let seen: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM job_events WHERE job_id = $1 AND kind = 'suspect'
                 AND data->>'verdict' = 'rejected' AND data->>'suspect' = $2
                 AND data->>'generation' = $3)",
        )
        .bind(report.job_id)
        .bind(report.suspect.to_string())
        .bind(report.generation.to_string())
        .fetch_one(&mut *tx)
        .await?;
        if !seen {
            lifecycle::event(&mut tx, report.job_id, data, evidence).await?;
            lifecycle::notify(&mut tx, report.job_id).await?;
        }
        tracing::info!(executor = %report.suspect, reporter = %reporter, job = %report.job_id, "{evidence}");
    }
    tx.commit().await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn outcome() -> impl Strategy<Value = ProbeOutcome> {
        prop_oneof![
            Just(ProbeOutcome::Answered),
            Just(ProbeOutcome::Refused),
            Just(ProbeOutcome::Silent)
        ]
    }

    proptest! {
        /// A suspect this process reached is never evicted on a peer's
        /// report, and one whose heartbeat is fresh is evicted only when
        /// nothing listens where its data plane was.
        #[test]
        fn a_reachable_or_beating_suspect_is_kept(
            probe in outcome(),
            age_ms in 0u64..10_000,
            interval_ms in 50u64..5_000,
        ) {
            let (age, interval) = (Duration::from_millis(age_ms), Duration::from_millis(interval_ms));
            let confirmed = decide(probe, age, interval);
            if probe == ProbeOutcome::Answered {
                prop_assert!(!confirmed);
            }
            if age_ms as f64 <= SILENT_AFTER * interval_ms as f64 {
                prop_assert_eq!(confirmed, probe == ProbeOutcome::Refused);
            }
            if probe == ProbeOutcome::Refused {
                prop_assert!(confirmed);
            }
        }
    }

    #[tokio::test]
    async fn the_probe_tells_a_listener_from_a_closed_port() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap().to_string();
        assert_eq!(probe(&open, PROBE_TIMEOUT).await.0, ProbeOutcome::Answered);
        drop(listener);
        assert_eq!(probe(&open, PROBE_TIMEOUT).await.0, ProbeOutcome::Refused);
    }
}
