//! The Trainyard executor: the agent that runs training roles on one machine.
//!
//! Layers, from the bottom up (each uses only those above it in this list):
//!
//! * [`signals`] — the small shared cells every layer may read or set
//!   (drain flag, checkpoint requests, pending uploads, peer checks, step
//!   progress);
//! * [`reports`] — what a role reports ([`reports::Item`]) and the
//!   [`reports::Reporter`] that carries it to the API;
//! * [`sandbox`] — the parent half of the confined child processes that
//!   load users' models (their inspection, and each TorchScript replica's
//!   module through [`replica::process`]) and run users' scripts, over the
//!   `trainyard-sandbox` crate; the child is `trainyard-confined`'s program;
//! * [`storage`] — object storage: the job's store, files at object-store
//!   URLs, final weights, checkpoints ([`storage::checkpoint`]);
//! * [`data`] — training data: generated sets, whole files, and sharded
//!   datasets streamed from the store in every format a user brings;
//! * [`replica`] — one data-parallel replica on libtorch: model, flat
//!   weights, optimizer, evaluation, and [`replica::progress`], what every
//!   training loop shares; nothing about rings or shards;
//! * [`context`] — what an executor's roles share (drain flag, pending
//!   uploads, the fetcher, test hooks), passed explicitly;
//! * [`error`] — why a role stopped ([`error::RoleError`]);
//! * [`role`] — one role's thread's world and the steps all patterns share;
//! * [`ring`] — the ring all-reduce pattern: step, join, loop, a rank's life;
//! * [`ps`] — the parameter-server pattern: shard servers, standbys and the
//!   workers that use them;
//! * [`script`] — a script job's rank: the user's own training script in a
//!   sandboxed process under torchrun's environment contract;
//! * [`roles`] — the set of roles an executor runs, started, stopped and
//!   handed over as generations change;
//! * [`control`] — the control plane: registration, heartbeats, drain and
//!   leave ([`control::agent`]), delivery of reports ([`control::report`]);
//! * [`probe`] — proof of the libtorch link (`--probe`).
//!
//! `docs/architecture.md` follows one gradient through each pattern.

pub mod context;
pub mod control;
pub mod data;
pub mod error;
pub mod probe;
pub mod ps;
pub mod replica;
pub mod reports;
pub mod ring;
pub mod role;
pub mod roles;
pub mod sandbox;
pub mod script;
pub mod signals;
pub mod storage;
