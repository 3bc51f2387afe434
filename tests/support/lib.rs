//! The end-to-end support library (crate `trainyard-e2e`): what the
//! end-to-end tests in `e2e/` and the end-to-end benchmarks in `bench/`
//! share to run the real binaries as processes.
//!
//! - [`process`]: find the built binaries, start them on free loopback
//!   ports with their output collected, wait, signal, poll;
//! - [`postgres`]: a fresh database per test, or a private cluster a test
//!   may stop and start;
//! - [`platform`]: the one harness, an API server (with its database and
//!   object store) and the executors a test starts against it;
//! - [`client`]: the one blocking client of the API, a facade over the
//!   typed async client (`trainyard-client`) with the reads and waits the
//!   tests share, and one raw path for the tests of HTTP behaviour;
//! - [`spec`]: the job specs the tests submit;
//! - [`async_matrix`]: users' models trained by the PS in sync, async and
//!   bounded modes, each judged by PyTorch against its sync job;
//! - [`compare`]: two models compared row by row on the same held-out rows;
//! - [`s3`]: the test S3 server;
//! - [`script_jobs`]: the DDP script's data, torchrun's reference run and
//!   PyTorch's accuracy of a script's output;
//! - [`lab`]: hosts in network namespaces on a bridge, link rates and
//!   faults (link down, a pair cut, a host cut from the API).
//!
//! The items are re-exported at the crate root.

pub mod async_matrix;
pub mod client;
pub mod compare;
pub mod lab;
pub mod metadata;
pub mod platform;
pub mod postgres;
pub mod process;
pub mod s3;
pub mod script_jobs;
pub mod spec;

pub use client::{
    safetensors_f32, safetensors_header, sse_events, ApiClient, PytorchEvaluation, TERMINAL,
};
pub use compare::Paired;
pub use lab::{Fault, Host, Lab};
pub use metadata::Metadata;
pub use platform::{Platform, PlatformBuilder, HEARTBEAT_MS};
pub use postgres::{admin_url, drop_database, fresh_database, TestPostgres};
pub use process::{
    binary, children_where, eventually, free_port, kill9, python_script, repo_root, run_ok,
    sandboxed_children, start_executor, tail, target_dir, wait_ready, Proc,
};
pub use s3::TestS3;
pub use spec::{digits_url, example_digits, torchscript, write_torchscript, Consistency, MlpSpec};
