//! Assignments: one role of a job at a generation, with the peers it talks
//! to, and the inspection of a TorchScript model with its report.

use super::*;
use crate::spec::{JobSpec, Strategy, UncheckedJobSpec};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// A worker peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkerPeer {
    /// Rank.
    pub rank: u32,
    /// Executor id.
    pub executor_id: Uuid,
    /// Its data-plane address.
    pub address: String,
    /// Device index on it.
    pub device: u32,
}

/// A PS peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(from = "PsPeerJson", into = "PsPeerJson")]
pub struct PsPeer {
    /// Shard.
    pub shard: u32,
    /// Whether it is the shard's hot standby (on the wire: its index, see
    /// [`wire_index`]).
    #[serde(skip)]
    pub standby: bool,
    /// Executor id.
    pub executor_id: Uuid,
    /// Its data-plane address.
    pub address: String,
    /// Tensor ranges it owns.
    pub ranges: Vec<Range>,
}

/// A [`PsPeer`] as the API's JSON has it.
#[derive(Serialize, Deserialize)]
struct PsPeerJson {
    shard: u32,
    executor_id: Uuid,
    address: String,
    ranges: Vec<Range>,
}

impl From<PsPeerJson> for PsPeer {
    fn from(j: PsPeerJson) -> PsPeer {
        let (kind, shard) = from_wire(RoleKind::Ps, j.shard);
        PsPeer {
            shard,
            standby: kind == RoleKind::Standby,
            executor_id: j.executor_id,
            address: j.address,
            ranges: j.ranges,
        }
    }
}

impl From<PsPeer> for PsPeerJson {
    fn from(p: PsPeer) -> PsPeerJson {
        let kind = if p.standby {
            RoleKind::Standby
        } else {
            RoleKind::Ps
        };
        PsPeerJson {
            shard: wire_index(kind, p.shard),
            executor_id: p.executor_id,
            address: p.address,
            ranges: p.ranges,
        }
    }
}

/// One role assigned to an executor, with everything needed to run it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Assignment {
    /// Which role.
    pub key: RoleKey,
    /// Device index for a worker.
    pub device: Option<u32>,
    /// The job's resolved strategy.
    pub strategy: Strategy,
    /// The job's data-plane secret (hex).
    pub secret: String,
    /// The job spec, checked again after its `artifact:` URLs were
    /// resolved (and once more when the executor decodes it).
    #[schema(value_type = UncheckedJobSpec)]
    pub spec: JobSpec,
    /// All workers of the job in rank order.
    pub workers: Vec<WorkerPeer>,
    /// All PS shards of the job in shard order.
    pub parameter_servers: Vec<PsPeer>,
    /// The committed checkpoint a role without state starts from: the
    /// job's newest, or the one its spec resumes from.
    #[serde(default)]
    pub resume: Option<crate::checkpoint::CheckpointRef>,
    /// The URLs the job may read (its spec's `artifact:` URLs are already
    /// resolved to the objects listed here). Absent, nothing may be read.
    #[serde(default)]
    pub data_policy: crate::artifact::DataPolicy,
    /// The scheduler asks the job for a checkpoint at its next step: the
    /// job is about to be preempted and resumes from that checkpoint when
    /// it is placed again. Every role of the job gets it; the roles vote
    /// for one checkpoint as they do for a drain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint_wanted: bool,
    /// How many times the job's world was started before this generation
    /// (torchrun's `TORCHELASTIC_RESTART_COUNT`): a generation that only
    /// released roles while the job waited for executors is not counted.
    /// Absent from an API that does not count them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<u32>,
}

impl Assignment {
    /// The job's PS shards without their standbys, in shard order.
    pub fn primaries(&self) -> Vec<&PsPeer> {
        let mut v: Vec<&PsPeer> = self
            .parameter_servers
            .iter()
            .filter(|p| !p.standby)
            .collect();
        v.sort_by_key(|p| p.shard);
        v
    }

    /// Where shard `shard`'s standby runs, if it has one.
    pub fn standby_of(&self, shard: u32) -> Option<&PsPeer> {
        self.parameter_servers
            .iter()
            .find(|p| p.standby && p.shard == shard)
    }
}

/// A TorchScript model file to inspect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Inspection {
    /// The job.
    pub job_id: Uuid,
    /// The model file's URL.
    pub url: String,
    /// The job's spec: the executor tries a forward pass on one batch of
    /// its dataset, so that a model that cannot train on that data fails
    /// the job before any worker starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<UncheckedJobSpec>)]
    pub spec: Option<Box<JobSpec>>,
    /// The URLs the job may read, as in an [`Assignment`].
    #[serde(default)]
    pub data_policy: crate::artifact::DataPolicy,
}

/// What inspecting a TorchScript file found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InspectionResult {
    /// The module's trainable tensors.
    #[schema(title = "InspectionParameters")]
    Parameters(Vec<crate::model::ParamInfo>),
    /// The file is not a loadable TorchScript module.
    #[schema(title = "InspectionError")]
    Error(String),
}

/// `POST /v1/executors/{id}/inspections`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InspectionReport {
    /// The job.
    pub job_id: Uuid,
    /// What was found.
    pub result: InspectionResult,
}
