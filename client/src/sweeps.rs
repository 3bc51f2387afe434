//! Hyperparameter sweeps: make one from a spec, list them, read one,
//! cancel one (`/v1/sweeps`). Making a sweep starts trials, so it is never
//! retried; reading and cancelling (idempotent) are, as the client's policy
//! says.

use crate::{Call, Client, ClientError};
use serde::Serialize;
use trainyard_common::api::{Sweep, SweepList};
use uuid::Uuid;

impl Client {
    /// `POST /v1/sweeps`: makes a sweep of a spec (a
    /// [`trainyard_common::sweep::SweepSpec`] or any JSON value).
    pub async fn create_sweep(&self, spec: &impl Serialize) -> Result<Sweep, ClientError> {
        let bytes = serde_json::to_vec(spec)
            .map_err(|e| ClientError::Setup(format!("cannot encode the sweep: {e}")))?;
        self.create_sweep_json(bytes).await
    }

    /// `POST /v1/sweeps` with the spec as the caller wrote it (the API's
    /// errors then point into that very text).
    pub async fn create_sweep_json(&self, spec: Vec<u8>) -> Result<Sweep, ClientError> {
        let mut call = Call::post("/v1/sweeps".into()).raw_json(spec);
        call.repeatable = false;
        self.call(call).await
    }

    /// `GET /v1/sweeps`: the caller's sweeps, newest first.
    pub async fn sweeps(&self) -> Result<SweepList, ClientError> {
        self.call(Call::get("/v1/sweeps".into())).await
    }

    /// `GET /v1/sweeps/{id}`.
    pub async fn sweep(&self, id: Uuid) -> Result<Sweep, ClientError> {
        self.call(Call::get(format!("/v1/sweeps/{id}"))).await
    }

    /// `POST /v1/sweeps/{id}/cancel`: the sweep afterwards (its running
    /// trials' jobs are cancelled with it).
    pub async fn cancel_sweep(&self, id: Uuid) -> Result<Sweep, ClientError> {
        self.call(Call::post(format!("/v1/sweeps/{id}/cancel")))
            .await
    }
}
