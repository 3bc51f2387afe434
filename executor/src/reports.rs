//! What a role reports ([`Item`]: a step's metrics, a log line, a
//! checkpoint shard, the end) and the [`Reporter`] that carries reports to
//! the API, kept below every layer: [`crate::control`] implements the
//! reporter and [`crate::roles`] uses it.

use tokio::sync::mpsc::UnboundedReceiver;
use trainyard_common::checkpoint::ShardUploaded;
use trainyard_common::cluster::{InspectionReport, LogLevel, MetricPoint, RoleKey, RoleOutcome};

/// Something a role reports.
pub enum Item {
    /// A step.
    Metric(MetricPoint),
    /// A log line.
    Log(LogLevel, String),
    /// The end.
    Outcome(RoleOutcome),
    /// A checkpoint shard is in the object store.
    Checkpoint(ShardUploaded),
    /// A phase of installing a script job's packages.
    Packages(trainyard_common::cluster::PackagesPhase),
}

/// Where the roles' reports go: the control plane, seen from below.
pub trait Reporter: Send + Sync {
    /// Starts delivering role `key`'s `items` until the channel closes.
    fn deliver(&self, key: RoleKey, items: UnboundedReceiver<Item>);
    /// Starts delivering an inspection's answer.
    fn deliver_inspection(&self, report: InspectionReport);
    /// The object store the API named for this executor's checkpoints and
    /// weights.
    fn object_store(&self) -> String;
}
