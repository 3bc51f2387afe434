//! The user-facing endpoints: jobs and what they report, executors and the
//! provisioner as admins see them, tokens, `whoami`, health.
//!
//! Each method is one request (retried as the client's [`RetryPolicy`]
//! says, except the two that make something: a submit without an
//! idempotency key, and making a token). Ids are [`Uuid`]s: a string that
//! is not one never reaches a path.
//!
//! [`RetryPolicy`]: crate::RetryPolicy

use crate::{Call, Client, ClientError};
use reqwest::Method;
use serde::Serialize;
use trainyard_common::api::{
    CheckpointList, CreatedToken, EventPage, ExecutorInfo, ExecutorList, Job, JobAssignments,
    JobPage, LogPage, MetricSeries, ModelTensors, NewToken, OutputList, ProvisionerStatus,
    TokenInfo, TokenList, WhoAmI,
};
use uuid::Uuid;

/// What `GET /v1/jobs` lists: every field optional, as the API's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobQuery {
    /// Only jobs in these states (comma-separated, e.g. `queued,running`).
    pub state: Option<String>,
    /// Page size (the API's default is 50, at most 500).
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Only this user's jobs (admins).
    pub owner: Option<String>,
}

/// The forms `GET /v1/jobs/{id}/model` returns a job's final model in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ModelFormat {
    /// Every tensor of the model's `state_dict()` (parameters and buffers)
    /// by its PyTorch name, as safetensors: for any job.
    #[default]
    Safetensors,
    /// The submitted TorchScript module with the trained parameters and
    /// buffers (`torch.jit.load`): for TorchScript jobs only.
    Torchscript,
}

impl ModelFormat {
    /// Every format, in the order the API documents them.
    pub const ALL: [ModelFormat; 2] = [ModelFormat::Safetensors, ModelFormat::Torchscript];

    /// The `format` query value.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelFormat::Safetensors => "safetensors",
            ModelFormat::Torchscript => "torchscript",
        }
    }

    /// The usual file extension (without the dot).
    pub fn extension(self) -> &'static str {
        match self {
            ModelFormat::Safetensors => "safetensors",
            ModelFormat::Torchscript => "pt",
        }
    }
}

impl std::fmt::Display for ModelFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ModelFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        ModelFormat::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "must be safetensors or torchscript, got {:?}",
                    s.chars().take(64).collect::<String>()
                )
            })
    }
}

impl Client {
    /// `POST /v1/jobs`: submits a job spec (a [`trainyard_common::UncheckedJobSpec`]
    /// or any JSON value). With an idempotency key a retried submit returns
    /// the job the first one made, and only then is it retried.
    pub async fn submit_job(
        &self,
        spec: &impl Serialize,
        idempotency_key: Option<&str>,
    ) -> Result<Job, ClientError> {
        let bytes = serde_json::to_vec(spec)
            .map_err(|e| ClientError::Setup(format!("cannot encode the spec: {e}")))?;
        self.submit_job_json(bytes, idempotency_key).await
    }

    /// `POST /v1/jobs` with the spec as the caller wrote it (the API's
    /// errors then point into that very text).
    pub async fn submit_job_json(
        &self,
        spec: Vec<u8>,
        idempotency_key: Option<&str>,
    ) -> Result<Job, ClientError> {
        let mut call = Call::post("/v1/jobs".into()).raw_json(spec);
        call.idempotency_key = idempotency_key;
        call.repeatable = idempotency_key.is_some();
        self.call(call).await
    }

    /// `GET /v1/jobs`: one page of jobs, newest first.
    pub async fn jobs(&self, query: &JobQuery) -> Result<JobPage, ClientError> {
        let call = Call::get("/v1/jobs".into())
            .query("limit", query.limit)
            .query("state", query.state.as_ref())
            .query("cursor", query.cursor.as_ref())
            .query("owner", query.owner.as_ref());
        self.call(call).await
    }

    /// `GET /v1/jobs/{id}`.
    pub async fn job(&self, id: Uuid) -> Result<Job, ClientError> {
        self.call(Call::get(format!("/v1/jobs/{id}"))).await
    }

    /// `POST /v1/jobs/{id}/cancel`: the job afterwards.
    pub async fn cancel_job(&self, id: Uuid) -> Result<Job, ClientError> {
        self.call(Call::post(format!("/v1/jobs/{id}/cancel"))).await
    }

    /// `GET /v1/jobs/{id}/events`: the events after `after`, oldest first,
    /// at most `limit` (the API's default 500, at most 1000).
    pub async fn job_events(
        &self,
        id: Uuid,
        after: Option<i64>,
        limit: Option<u32>,
    ) -> Result<EventPage, ClientError> {
        let call = Call::get(format!("/v1/jobs/{id}/events"))
            .query("after", after)
            .query("limit", limit);
        self.call(call).await
    }

    /// `GET /v1/jobs/{id}/assignments`: who holds which role now.
    pub async fn job_assignments(&self, id: Uuid) -> Result<JobAssignments, ClientError> {
        self.call(Call::get(format!("/v1/jobs/{id}/assignments")))
            .await
    }

    /// `GET /v1/jobs/{id}/metrics`: rank 0's training curve in at most
    /// `max_points` points (the API's default 500).
    pub async fn job_metrics(
        &self,
        id: Uuid,
        max_points: Option<u32>,
    ) -> Result<MetricSeries, ClientError> {
        let call = Call::get(format!("/v1/jobs/{id}/metrics")).query("max_points", max_points);
        self.call(call).await
    }

    /// `GET /v1/jobs/{id}/logs`: log lines after `after`, oldest first.
    pub async fn job_logs(
        &self,
        id: Uuid,
        after: Option<i64>,
        limit: Option<u32>,
    ) -> Result<LogPage, ClientError> {
        let call = Call::get(format!("/v1/jobs/{id}/logs"))
            .query("after", after)
            .query("limit", limit);
        self.call(call).await
    }

    /// `GET /v1/jobs/{id}/checkpoints`: the committed ones, newest first.
    pub async fn job_checkpoints(&self, id: Uuid) -> Result<CheckpointList, ClientError> {
        self.call(Call::get(format!("/v1/jobs/{id}/checkpoints")))
            .await
    }

    /// `GET /v1/jobs/{id}/model`: the final weights (safetensors bytes);
    /// [`Client::job_model_as`] asks for another format.
    pub async fn job_model(&self, id: Uuid) -> Result<Vec<u8>, ClientError> {
        self.job_model_as(id, ModelFormat::Safetensors).await
    }

    /// `GET /v1/jobs/{id}/model?format=…`: the final model in `format`
    /// (the trained TorchScript module exists for TorchScript jobs only;
    /// the API answers 400 naming `format` for a built-in model).
    pub async fn job_model_as(
        &self,
        id: Uuid,
        format: ModelFormat,
    ) -> Result<Vec<u8>, ClientError> {
        let call = Call::get(format!("/v1/jobs/{id}/model")).query("format", Some(format));
        Ok(self.send(call).await?.body)
    }

    /// `GET /v1/jobs/{id}/outputs`: a script job's outputs (rank 0's
    /// `TRAINYARD_OUTPUT_DIR`, stored when it succeeded).
    pub async fn job_outputs(&self, id: Uuid) -> Result<OutputList, ClientError> {
        self.call(Call::get(format!("/v1/jobs/{id}/outputs"))).await
    }

    /// `GET /v1/jobs/{id}/outputs/{path}`: one output's bytes.
    pub async fn job_output(&self, id: Uuid, path: &str) -> Result<Vec<u8>, ClientError> {
        let encoded: Vec<String> = path.split('/').map(crate::artifacts::encode).collect();
        let call = Call::get(format!("/v1/jobs/{id}/outputs/{}", encoded.join("/")));
        Ok(self.send(call).await?.body)
    }

    /// `GET /v1/jobs/{id}/tensors`: every tensor of the job's model (name,
    /// shape, kind, dtype) and the element counts by kind.
    pub async fn job_tensors(&self, id: Uuid) -> Result<ModelTensors, ClientError> {
        self.call(Call::get(format!("/v1/jobs/{id}/tensors"))).await
    }

    /// `GET /v1/executors` (admins): newest first, only those in `state`
    /// (`live`, `draining`, `lost`, `left`) if given.
    pub async fn executors(&self, state: Option<&str>) -> Result<ExecutorList, ClientError> {
        self.call(Call::get("/v1/executors".into()).query("state", state))
            .await
    }

    /// `GET /v1/executors/{id}` (admins).
    pub async fn executor(&self, id: Uuid) -> Result<ExecutorInfo, ClientError> {
        self.call(Call::get(format!("/v1/executors/{id}"))).await
    }

    /// `GET /v1/provisioner`: its settings, executors, and its `limit` most
    /// recent decisions (the API's default 100).
    pub async fn provisioner(&self, limit: Option<u32>) -> Result<ProvisionerStatus, ClientError> {
        self.call(Call::get("/v1/provisioner".into()).query("limit", limit))
            .await
    }

    /// `POST /v1/tokens` (admins): the new token, shown only in this answer.
    /// Never retried (a second attempt would make a second token).
    pub async fn create_token(&self, token: &NewToken) -> Result<CreatedToken, ClientError> {
        let mut call = Call::post("/v1/tokens".into()).json(token)?;
        call.repeatable = false;
        self.call(call).await
    }

    /// `GET /v1/tokens` (admins): every token, newest first.
    pub async fn tokens(&self) -> Result<TokenList, ClientError> {
        self.call(Call::get("/v1/tokens".into())).await
    }

    /// `DELETE /v1/tokens/{id}` (admins): the token, revoked.
    pub async fn revoke_token(&self, id: Uuid) -> Result<TokenInfo, ClientError> {
        self.call(Call::new(Method::DELETE, format!("/v1/tokens/{id}")))
            .await
    }

    /// `GET /v1/whoami`: who the server takes this client's token for.
    pub async fn whoami(&self) -> Result<WhoAmI, ClientError> {
        self.call(Call::get("/v1/whoami".into())).await
    }

    /// `GET /healthz`: the process answers.
    pub async fn healthz(&self) -> Result<(), ClientError> {
        self.send(Call::get("/healthz".into())).await.map(drop)
    }

    /// `GET /readyz`: the API and its Postgres answer.
    pub async fn readyz(&self) -> Result<(), ClientError> {
        self.send(Call::get("/readyz".into())).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::ModelFormat;

    #[test]
    fn model_formats_read_back_as_the_api_spells_them() {
        for f in ModelFormat::ALL {
            assert_eq!(f.as_str().parse::<ModelFormat>(), Ok(f));
        }
        assert_eq!(ModelFormat::default(), ModelFormat::Safetensors);
        assert_eq!(ModelFormat::Torchscript.extension(), "pt");
        let err = "TorchScript".parse::<ModelFormat>().unwrap_err();
        assert!(err.contains("safetensors or torchscript"), "{err}");
        assert!("x".repeat(10_000).parse::<ModelFormat>().unwrap_err().len() < 200);
    }
}
