//! Everything that crosses the trust boundary, both ways: what the
//! executor writes to a confined child and what the child answers. The
//! executor (trusted) writes these; the child (running a user's code, or
//! about to) reads them; whatever the child writes back is untrusted and
//! bounded where it is read ([`frames`]).
//!
//! Every child reads one JSON line first, an [`Envelope`]: its confinement,
//! then its task, one of [`Kind`]'s. Then:
//! - an inspection ([`Kind::Inspection`], task [`Inspect`]) answers one
//!   JSON line, `trainyard_common::cluster::InspectionResult`;
//! - a model process ([`Kind::Model`], task [`frames::Load`]) converses in
//!   [`frames`] until its stdin closes;
//! - a script rank ([`Kind::Script`], task [`ScriptTask`]) becomes the
//!   interpreter; a spare one runs [`spare::LAUNCHER`], says it is ready
//!   and becomes the rank at its go line ([`spare::go_line`]).

pub mod frames;
pub mod spare;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use trainyard_common::spec::UncheckedJobSpec;
use trainyard_sandbox::Confinement;

/// What a confined child does: the binary's one argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Load a user's module and try it ([`Inspect`]).
    Inspection,
    /// Serve a user's module's steps ([`frames`]).
    Model,
    /// Become a user's script rank ([`ScriptTask`]).
    Script,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 3] = [Kind::Inspection, Kind::Model, Kind::Script];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Inspection => "inspection",
            Kind::Model => "model",
            Kind::Script => "script",
        }
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The task line a sandboxed child reads on stdin.
#[derive(Serialize, Deserialize)]
pub struct Envelope<T> {
    /// What it confines itself to (`None`: `--sandbox off`).
    pub confinement: Option<Confinement>,
    /// Threads libtorch may use.
    pub torch_threads: Option<i32>,
    /// The executor's pid: the child ends itself once its parent is
    /// another (the executor died and it was re-parented).
    #[serde(default)]
    pub parent: Option<u32>,
    /// The task.
    pub task: T,
}

/// What a script's sandboxed child runs once it is confined.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScriptTask {
    /// The interpreter.
    pub program: PathBuf,
    /// Its arguments (the entrypoint, then the script's own).
    pub args: Vec<String>,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// Its working folder (the code's).
    pub cwd: PathBuf,
}

/// What a confined inspection is given.
#[derive(Debug, Serialize, Deserialize)]
pub struct Inspect {
    /// The model file, in the workspace's inputs.
    pub model: PathBuf,
    /// The trial, when the spec came with the inspection.
    pub trial: Option<Trial>,
}

/// A forward to try: the spec, a batch of its data, its largest label.
#[derive(Debug, Serialize, Deserialize)]
pub struct Trial {
    /// The job's spec.
    pub spec: Box<UncheckedJobSpec>,
    /// `x` and `y` of the batch (safetensors, in the workspace's inputs).
    pub batch: PathBuf,
    /// The dataset's largest integer label.
    pub label_max: Option<i64>,
}
