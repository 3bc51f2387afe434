//! Registration: what an executor says about itself when it joins (its
//! devices, RAM, labels and how it confines users' code), the bounds the
//! API holds it to, what it gets back, and the states an executor goes
//! through afterwards.

use crate::spec::{Device, Violation};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;
use uuid::Uuid;

/// Most devices one executor may report.
pub const MAX_DEVICES: usize = 64;
/// Largest memory of one device (16 TiB).
pub const MAX_DEVICE_MEMORY: u64 = 16 << 40;
/// Largest RAM of one executor (64 TiB).
pub const MAX_RAM: u64 = 64 << 40;
/// Smallest RAM of one executor (64 MiB).
pub const MIN_RAM: u64 = 64 << 20;
/// Most CPU cores of one executor.
pub const MAX_CORES: u32 = 4096;
/// Most labels.
pub const MAX_LABELS: usize = 32;

/// One device of an executor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceInfo {
    /// `cpu` (the host) or `cuda`.
    pub kind: Device,
    /// Index among devices of that kind.
    pub index: u32,
    /// Human name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Memory in bytes (for `cpu`: usable host RAM).
    pub memory_bytes: u64,
}

/// What an executor offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutorResources {
    /// Its devices: one worker can run on each.
    pub devices: Vec<DeviceInfo>,
    /// CPU cores.
    pub cpu_cores: u32,
    /// Host RAM in bytes (PS shards and CPU workers draw from it).
    pub ram_bytes: u64,
}

/// `POST /v1/executors`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// A human name (1–128 characters).
    pub name: String,
    /// `host:port` of its data-plane listener.
    #[schema(example = "127.0.0.1:7070")]
    pub address: String,
    /// What it offers.
    pub resources: ExecutorResources,
    /// Labels, e.g. `{"host": "gpu-node-3"}`; `host` keeps ring ranks adjacent.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// How it confines users' code (absent: an executor from before
    /// sandboxes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxReport>,
}

/// How an executor runs users' code (their models).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SandboxReport {
    /// `confined`, `unconfined` (started with `--sandbox off`) or
    /// `unavailable` (the kernel cannot confine: users' code is refused).
    pub state: SandboxState,
    /// The layers in force, or why there are none (at most 512 characters).
    pub detail: String,
    /// How it runs script jobs, whose ranks also need a network namespace
    /// of their own (`unavailable`: the scheduler places none there;
    /// absent: an executor from before, taken as `state`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scripts: Option<SandboxState>,
}

/// Whether users' code is confined on an executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// In a sandboxed child process.
    Confined,
    /// In a child process, unconfined (a trusted single-user setup).
    Unconfined,
    /// Refused: the kernel lacks what the sandbox needs.
    Unavailable,
}

/// Longest [`SandboxReport::detail`].
pub const MAX_SANDBOX_DETAIL: usize = 512;

impl RegisterRequest {
    /// Every violation of the request's bounds.
    pub fn violations(&self) -> Vec<Violation> {
        let mut v = Vec::new();
        let mut fail = |field: String, message: String| v.push(Violation { field, message });
        let n = self.name.chars().count();
        if self.name.trim().is_empty() || n > 128 || self.name.chars().any(char::is_control) {
            fail(
                "name".into(),
                "must be 1 to 128 characters without control characters".into(),
            );
        }
        match self.address.rsplit_once(':') {
            Some((host, port))
                if !host.is_empty()
                    && self.address.len() <= 256
                    && !host.chars().any(|c| c.is_whitespace() || c.is_control())
                    && port.parse::<u16>().is_ok_and(|p| p > 0) => {}
            _ => fail(
                "address".into(),
                format!(
                    "must be host:port with a port 1–65535, got {:?}",
                    self.address
                ),
            ),
        }
        if let Some(s) = &self.sandbox {
            if s.detail.chars().count() > MAX_SANDBOX_DETAIL
                || s.detail.chars().any(char::is_control)
            {
                fail(
                    "sandbox.detail".into(),
                    format!("must be at most {MAX_SANDBOX_DETAIL} characters without control characters"),
                );
            }
        }
        let r = &self.resources;
        if r.devices.is_empty() || r.devices.len() > MAX_DEVICES {
            fail(
                "resources.devices".into(),
                format!(
                    "must list 1 to {MAX_DEVICES} devices, got {}",
                    r.devices.len()
                ),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, d) in r.devices.iter().enumerate() {
            if !seen.insert((d.kind == Device::Cuda, d.index)) {
                fail(
                    format!("resources.devices[{i}].index"),
                    "duplicate index for this kind".into(),
                );
            }
            if d.memory_bytes == 0 || d.memory_bytes > MAX_DEVICE_MEMORY {
                fail(
                    format!("resources.devices[{i}].memory_bytes"),
                    format!(
                        "must be between 1 and {MAX_DEVICE_MEMORY}, got {}",
                        d.memory_bytes
                    ),
                );
            }
            if d.name.chars().count() > 128 || d.name.chars().any(char::is_control) {
                fail(
                    format!("resources.devices[{i}].name"),
                    "must be at most 128 characters without control characters".into(),
                );
            }
        }
        if r.cpu_cores == 0 || r.cpu_cores > MAX_CORES {
            fail(
                "resources.cpu_cores".into(),
                format!("must be between 1 and {MAX_CORES}, got {}", r.cpu_cores),
            );
        }
        if r.ram_bytes < MIN_RAM || r.ram_bytes > MAX_RAM {
            fail(
                "resources.ram_bytes".into(),
                format!(
                    "must be between {MIN_RAM} and {MAX_RAM}, got {}",
                    r.ram_bytes
                ),
            );
        }
        if self.labels.len() > MAX_LABELS {
            fail("labels".into(), format!("at most {MAX_LABELS} labels"));
        }
        for (k, val) in &self.labels {
            if k.is_empty()
                || k.len() > 63
                || !k
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                fail(
                    format!("labels.{k}"),
                    "keys are 1–63 characters of [A-Za-z0-9-_./]".into(),
                );
            }
            if val.len() > 255 || val.chars().any(char::is_control) {
                fail(
                    format!("labels.{k}"),
                    "values are at most 255 characters without control characters".into(),
                );
            }
        }
        v
    }
}

/// Answer to a registration.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RegisterResponse {
    /// The executor's id.
    pub id: Uuid,
    /// Its credential for heartbeats, drain and leave (shown only here).
    pub token: String,
    /// How often to heartbeat.
    pub heartbeat_interval_ms: u64,
    /// Missed heartbeats after which it is declared lost.
    pub heartbeat_misses: u32,
    /// Object-store URL for weights and checkpoints.
    pub object_store: String,
}

/// Executor states.
// The same set is the Postgres enum `executor_state`, read and bound as
// this type (feature `sqlx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type))]
#[cfg_attr(
    feature = "sqlx",
    sqlx(type_name = "executor_state", rename_all = "snake_case")
)]
pub enum ExecutorState {
    /// Heartbeating; takes roles.
    Live,
    /// Leaving: its roles are moved off, it takes no new ones.
    Draining,
    /// Missed too many heartbeats; must register again.
    Lost,
    /// Left gracefully.
    Left,
}

impl ExecutorState {
    /// The name used on the wire and in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutorState::Live => "live",
            ExecutorState::Draining => "draining",
            ExecutorState::Lost => "lost",
            ExecutorState::Left => "left",
        }
    }

    /// Parses the Postgres name.
    pub fn parse(s: &str) -> Option<ExecutorState> {
        [
            ExecutorState::Live,
            ExecutorState::Draining,
            ExecutorState::Lost,
            ExecutorState::Left,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
}
