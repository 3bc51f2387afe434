//! `trainyard-confined`: the trust boundary of Trainyard's executor, as
//! its own crate and program.
//!
//! Everything that runs on the confined side of the sandbox is here: how
//! a child enters its confinement ([`enter`]), the inspection of a user's
//! TorchScript module ([`inspect`]), a user's module serving its steps
//! ([`serve`]) and the launcher of a spare script interpreter
//! ([`protocol::spare`]), with [`protocol`], the one module for what
//! crosses the boundary. The binary `trainyard-confined` is the sandboxed
//! child: the executor starts it (found beside its own binary) under the
//! confinement it prepared and keeps the parent half (the workspace, the
//! conversation, the limits, the network relay).
//!
//! It links no client, store, data-plane or API code (`tests/boundary.rs`
//! checks the lockfile's graph and the binary's symbols): a module that
//! escaped libtorch would find no credential, no connection and no code
//! here to reach the platform. The model code a step runs ([`core`],
//! [`model`], [`tensors`], [`torchscript`], [`shm`]) is shared with the
//! executor, whose built-in models train through the same step.

pub mod core;
pub mod enter;
pub mod inspect;
pub mod model;
pub mod protocol;
pub mod serve;
pub mod shm;
pub mod tensors;
pub mod torchscript;
