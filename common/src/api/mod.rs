//! The REST API's resources as clients see them: every response body (and
//! the request bodies that are not already in [`crate::cluster`]) of the
//! `/v1` routes.
//!
//! The server (`trainyard-api`) builds these from its rows and serializes
//! them; the typed client (`trainyard-client`) and everything built on it
//! (the `trainyard` command line, the executor, the tests and benchmarks)
//! decode the same definitions, so a renamed field breaks the build instead
//! of printing `?`. The `ToSchema` derives (and the doc comments, which
//! become the schema's descriptions) make `openapi/openapi.json`: names
//! and docs here are part of the published document.
//!
//! * jobs: [`Job`], [`JobPage`], [`JobEvent`], [`EventPage`],
//!   [`JobAssignments`] (with [`PsShard`], [`WorkerRole`], [`RoleHost`]);
//! * telemetry: [`MetricSeries`] of [`MetricSample`]s, [`LogPage`] of
//!   [`JobLogLine`]s, and the [`ReportAck`] an executor's report gets;
//! * checkpoints: [`CheckpointList`] of [`CheckpointInfo`]s; the model's
//!   tensors: [`ModelTensors`];
//! * executors: [`ExecutorList`] of [`ExecutorInfo`]s with their
//!   [`RoleInfo`]s;
//! * the provisioner: [`ProvisionerStatus`];
//! * tokens: [`NewToken`] (the request), [`CreatedToken`], [`TokenList`] of
//!   [`TokenInfo`]s, the [`Role`] a token has, and [`WhoAmI`];
//! * sharing: [`QuotaLimits`] (the request), [`QuotaInfo`] with its
//!   [`QuotaUse`], [`QuotaList`]; [`UsageReport`] of [`OwnerUsage`] and
//!   [`JobUsage`] over [`UsageFigures`].

/// Declares a closed set of names stored as Postgres `text` (a `CHECK`
/// lists the same names): the enum, its wire names, `ALL` and `parse`.
macro_rules! text_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $wire:literal,)+ }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vm])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The name on the wire and in the database.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)+
                }
            }

            /// The value named `s`, if any.
            pub fn parse(s: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|v| v.as_str() == s)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }
    };
}

mod checkpoints;
mod executors;
mod jobs;
mod sharing;
mod sweeps;
mod telemetry;
mod tokens;

pub use checkpoints::*;
pub use executors::*;
pub use jobs::*;
pub use sharing::*;
pub use sweeps::*;
pub use telemetry::*;
pub use tokens::*;
