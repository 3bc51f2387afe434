//! Sharing the cluster: users' quotas and what their jobs hold, and usage
//! accounting over a time window.

use crate::JobState;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// A user's quota as set by an admin (`PUT /v1/quotas/{owner}`): limits on
/// what the user's placed jobs hold at once. An absent or `null` field is
/// unlimited, so `{}` removes every limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimits {
    /// Most workers on CUDA devices (0–1,000,000).
    #[serde(default)]
    pub cuda_devices: Option<u32>,
    /// Most workers on CPU devices (0–1,000,000).
    #[serde(default)]
    pub cpu_workers: Option<u32>,
    /// Most RAM of PS shards and their standbys, in bytes (at most 2^50).
    #[serde(default)]
    pub ps_ram_bytes: Option<u64>,
}

/// A user's quota, and what its placed jobs hold now.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QuotaInfo {
    /// The user.
    pub owner: String,
    // The limits are fields of their own, not a flattened `QuotaLimits`:
    // that one refuses unknown fields (a request body), which the document
    // would then say of this answer too.
    /// Most workers on CUDA devices (`null`: unlimited).
    pub cuda_devices: Option<u32>,
    /// Most workers on CPU devices (`null`: unlimited).
    pub cpu_workers: Option<u32>,
    /// Most RAM of PS shards and their standbys, in bytes (`null`:
    /// unlimited).
    pub ps_ram_bytes: Option<u64>,
    /// What its jobs hold now.
    pub in_use: QuotaUse,
    /// The admin who set it (`null`: never set, unlimited).
    pub updated_by: Option<String>,
    /// When it was set.
    pub updated_at: Option<DateTime<Utc>>,
}

impl QuotaInfo {
    /// Its limits, as a `PUT` would set them.
    pub fn limits(&self) -> QuotaLimits {
        QuotaLimits {
            cuda_devices: self.cuda_devices,
            cpu_workers: self.cpu_workers,
            ps_ram_bytes: self.ps_ram_bytes,
        }
    }
}

/// What a user's placed jobs hold at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuotaUse {
    /// Workers on CUDA devices.
    pub cuda_devices: u64,
    /// Workers on CPU devices.
    pub cpu_workers: u64,
    /// RAM of PS shards and standbys, in bytes.
    pub ps_ram_bytes: u64,
}

/// Every user with a quota.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QuotaList {
    /// The quotas, by user name.
    pub quotas: Vec<QuotaInfo>,
}

/// Resources used over a time window, from the assignment history.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageFigures {
    /// Seconds × workers on CUDA devices.
    pub device_seconds: f64,
    /// Seconds × workers on CPU devices.
    pub cpu_worker_seconds: f64,
    /// GiB × hours of PS shard (and standby) RAM.
    pub ps_ram_gib_hours: f64,
}

/// One job's usage in the window.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobUsage {
    /// The job.
    pub job_id: Uuid,
    /// Its name.
    pub name: String,
    /// Its owner.
    pub owner: String,
    /// Its state now.
    pub state: JobState,
    /// What it used.
    #[serde(flatten)]
    pub usage: UsageFigures,
}

/// One user's usage in the window.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OwnerUsage {
    /// The user.
    pub owner: String,
    /// How many of its jobs held roles in the window.
    pub jobs: u64,
    /// What they used.
    #[serde(flatten)]
    pub usage: UsageFigures,
}

/// Usage accounting over `[from, to)`: per user and per job (`GET /v1/usage`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    /// Start of the window.
    pub from: DateTime<Utc>,
    /// End of the window (at most now).
    pub to: DateTime<Utc>,
    /// Per user, most device-seconds first.
    pub owners: Vec<OwnerUsage>,
    /// Per job, most device-seconds first (at most 1,000).
    pub jobs: Vec<JobUsage>,
}
