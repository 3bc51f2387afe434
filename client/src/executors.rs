//! The endpoints an executor calls: register with the cluster join token,
//! then, with its own credential (the client's token), heartbeat, report
//! its roles' metrics, logs and outcomes, report inspections, drain and
//! leave. The crate's docs say which retry rule each call needs.

use crate::{Auth, Call, Client, ClientError};
use reqwest::Method;
use trainyard_common::api::{ExecutorInfo, Job, ReportAck};
use trainyard_common::cluster::{
    HeartbeatRequest, HeartbeatResponse, InspectionReport, RegisterRequest, RegisterResponse,
    RoleReport, SuspectAnswer, SuspectReport,
};
use uuid::Uuid;

/// HTTP status of a report whose outcome is from a stale generation.
const STALE: u16 = 409;

/// What became of a role report.
#[derive(Debug, Clone)]
pub enum Reported {
    /// Stored (metrics and log lines the API already had are not stored
    /// twice).
    Stored(ReportAck),
    /// Refused for good because its outcome is from a generation the job
    /// has left (its metrics and logs were stored), or because the role or
    /// a checkpoint shard it names was never this executor's (nothing was
    /// stored): delivered, nothing to retry.
    Stale,
    /// Refused for good because this executor holds no role in the job
    /// (403): nothing was stored, and a retry would be refused the same.
    Refused(String),
}

impl Client {
    /// `POST /v1/executors` with the cluster join token: the executor's id,
    /// its credential (for [`Client::set_token`]), its heartbeat interval
    /// and the object store.
    pub async fn register(
        &self,
        join_token: &str,
        registration: &RegisterRequest,
    ) -> Result<RegisterResponse, ClientError> {
        let mut call = Call::post("/v1/executors".into()).json(registration)?;
        call.auth = Auth::Bearer(join_token);
        self.call(call).await
    }

    /// `POST /v1/executors/{id}/heartbeat`: the roles it runs; every role
    /// assigned to it, and the inspections asked of it. A 410 or 404
    /// ([`ClientError::status`]) means the API declared it lost or forgot
    /// it: register again.
    pub async fn heartbeat(
        &self,
        id: Uuid,
        beat: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, ClientError> {
        let call = Call::post(format!("/v1/executors/{id}/heartbeat")).json(beat)?;
        self.call(call).await
    }

    /// `POST /v1/executors/{id}/suspects`: a data-plane peer that seems
    /// dead; the answer is the scheduler's verdict with its evidence.
    pub async fn report_suspect(
        &self,
        id: Uuid,
        report: &SuspectReport,
    ) -> Result<SuspectAnswer, ClientError> {
        let call = Call::post(format!("/v1/executors/{id}/suspects")).json(report)?;
        self.call(call).await
    }

    /// `POST /v1/executors/{id}/reports`: a role's metrics, logs, checkpoint
    /// shards and outcome. A 409 (the outcome of a stale generation, or a role
    /// that was not this executor's) is [`Reported::Stale`] and a 403 (no
    /// role in the job) [`Reported::Refused`], not errors: neither is retried.
    pub async fn report(&self, id: Uuid, report: &RoleReport) -> Result<Reported, ClientError> {
        let call = Call::post(format!("/v1/executors/{id}/reports")).json(report)?;
        match self.call(call).await {
            Ok(ack) => Ok(Reported::Stored(ack)),
            Err(e) if e.status() == Some(STALE) => Ok(Reported::Stale),
            Err(e) if e.status() == Some(403) => Ok(Reported::Refused(e.to_string())),
            Err(e) => Err(e),
        }
    }

    /// `POST /v1/executors/{id}/inspections`: what inspecting a job's
    /// TorchScript file found; the job afterwards.
    pub async fn report_inspection(
        &self,
        id: Uuid,
        report: &InspectionReport,
    ) -> Result<Job, ClientError> {
        let call = Call::post(format!("/v1/executors/{id}/inspections")).json(report)?;
        self.call(call).await
    }

    /// `POST /v1/executors/{id}/drain`: the scheduler moves its roles away
    /// and gives it no new ones.
    pub async fn drain(&self, id: Uuid) -> Result<ExecutorInfo, ClientError> {
        self.call(Call::post(format!("/v1/executors/{id}/drain")))
            .await
    }

    /// `DELETE /v1/executors/{id}`: it leaves the cluster (once no role is
    /// assigned to it; else 409).
    pub async fn leave(&self, id: Uuid) -> Result<ExecutorInfo, ClientError> {
        self.call(Call::new(Method::DELETE, format!("/v1/executors/{id}")))
            .await
    }
}
