//! A job's committed checkpoints and its model's tensors.

use crate::checkpoint::CursorState;
use crate::model::ParamInfo;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// One committed checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckpointInfo {
    /// Global step. A script job's: the commit's number, as its log
    /// (`checkpoint n committed`) and `resume_from.step` name it.
    pub step: u64,
    /// Generation whose cluster wrote it.
    pub generation: i64,
    /// Shards (a script job's checkpoint: its files).
    pub shards: u32,
    /// Bytes of all shards.
    pub bytes: u64,
    /// The data cursor after the step.
    pub cursor: CursorState,
    /// The manifest's URL.
    pub manifest_url: String,
    /// When it was committed.
    pub committed_at: DateTime<Utc>,
}

/// Where a job's tensor list comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TensorSource {
    /// A built-in model: its tensors follow from the spec.
    Spec,
    /// A TorchScript module: as its inspection found them.
    Inspection,
    /// A TorchScript module not inspected yet (or whose inspection failed):
    /// no tensors known.
    Pending,
}

/// `GET /v1/jobs/{id}/tensors`: every tensor of the job's model.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelTensors {
    /// Job id.
    pub job_id: Uuid,
    /// Where the list comes from.
    pub source: TensorSource,
    /// The tensors of the model's `state_dict()`, by PyTorch name, in the
    /// order training lays them out (at most 10000 of them).
    pub tensors: Vec<ParamInfo>,
    /// Tensors in all (more than `tensors` holds when the list is cut).
    pub count: u64,
    /// Elements of the trainable parameters.
    pub parameters: u64,
    /// Elements of the buffers (e.g. BatchNorm's running statistics).
    pub buffers: u64,
    /// Elements of the frozen parameters (`requires_grad=False`).
    pub frozen: u64,
}

/// `GET /v1/jobs/{id}/checkpoints`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckpointList {
    /// Job id.
    pub job_id: Uuid,
    /// How many the job keeps.
    pub keep: u32,
    /// Committed checkpoints, newest first.
    pub checkpoints: Vec<CheckpointInfo>,
}
