//! The job spec: what a user submits, and its validation.
//!
//! [`UncheckedJobSpec`] is the wire form (JSON, unknown fields rejected at every
//! level). [`JobSpec::parse`] checks every bound and every cross-field rule
//! and reports *all* violations at once, each naming its field by a path such
//! as `optimizer.lr` or `model.hidden[2]`. A [`JobSpec`] can be made in no
//! other way (deserializing one runs the same checks), so code that holds a
//! `JobSpec` never re-checks it.
//!
//! The module's parts, all re-exported here so that every item keeps its
//! `trainyard_common::spec::…` path:
//!
//! * `limits` — the named bounds (`MAX_*`, [`URL_SCHEMES`]);
//! * `input` — the wire types ([`UncheckedJobSpec`] and everything it nests) and
//!   their defaults and derived values;
//! * `script` — a script job's own part and its rules;
//! * `workload` — the two kinds of job as the code that runs them sees
//!   them ([`ModelJob`], a checked model job's accessors, a worker's
//!   memory charge);
//! * `tracking` — where a job's params, metrics and model are logged
//!   (MLflow), and the checks of that field's form;
//! * `check` — the rules behind [`JobSpec::parse`], collecting every
//!   violation with its field path;
//! * this file — [`JobSpec`] itself, [`Violation`] and the errors.

mod check;
mod input;
mod limits;
pub mod script;
pub mod tracking;
mod workload;

pub use check::input_name;
pub use input::*;
pub use limits::*;
pub use script::ScriptSpec;
pub use tracking::{MlflowTracking, Tracking};
pub use workload::ModelJob;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Deref;
use utoipa::ToSchema;

/// One broken rule of a job spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Violation {
    /// Path of the offending field, e.g. `optimizer.lr` or `model.hidden[2]`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Why a JSON document is not a job spec.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The bytes are not JSON.
    #[error("malformed JSON: {0}")]
    Syntax(String),
    /// JSON of the wrong shape: a missing or unknown field, or a wrong type.
    #[error("{}", .0[0])]
    Shape(Vec<Violation>),
    /// Well-formed, but some bounds or rules are broken.
    #[error("{} violation(s), first: {}", .0.len(), .0[0])]
    Invalid(Vec<Violation>),
}

impl SpecError {
    /// The violations, for the shape and rule errors.
    pub fn violations(&self) -> &[Violation] {
        match self {
            SpecError::Syntax(_) => &[],
            SpecError::Shape(v) | SpecError::Invalid(v) => v,
        }
    }
}

/// A job spec that passed every check. Read it through `Deref`; make one
/// with [`JobSpec::parse`] or [`JobSpec::from_json`]; read a stored one with
/// [`JobSpec::from_stored`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "UncheckedJobSpec", into = "UncheckedJobSpec")]
pub struct JobSpec(UncheckedJobSpec);

impl Deref for JobSpec {
    type Target = UncheckedJobSpec;
    fn deref(&self) -> &UncheckedJobSpec {
        &self.0
    }
}

impl From<JobSpec> for UncheckedJobSpec {
    fn from(s: JobSpec) -> Self {
        s.0
    }
}

impl TryFrom<UncheckedJobSpec> for JobSpec {
    type Error = InvalidSpec;
    fn try_from(input: UncheckedJobSpec) -> Result<Self, InvalidSpec> {
        JobSpec::parse(input).map_err(InvalidSpec)
    }
}

/// The violations of a spec that failed [`JobSpec::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSpec(pub Vec<Violation>);

impl fmt::Display for InvalidSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&all.join("; "))
    }
}

impl JobSpec {
    /// Checks every rule and returns the spec, or all its violations.
    pub fn parse(input: UncheckedJobSpec) -> Result<JobSpec, Vec<Violation>> {
        let violations = check::violations(&input);
        if violations.is_empty() {
            Ok(JobSpec(input))
        } else {
            Err(violations)
        }
    }

    /// Parses JSON bytes: a syntax error, the first shape error (with its
    /// field path), or all rule violations.
    pub fn from_json(bytes: &[u8]) -> Result<JobSpec, SpecError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let input: UncheckedJobSpec = match serde_path_to_error::deserialize(de) {
            Ok(input) => input,
            Err(e) => {
                let path = e.path().to_string();
                let inner = e.into_inner();
                // A shape error can come before a syntax error later in the
                // document (`[1, 2` fails on the 1); bad JSON is a 400 first.
                if let Err(syntax) = serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                    return Err(SpecError::Syntax(syntax.to_string()));
                }
                return Err(match inner.classify() {
                    serde_json::error::Category::Data => SpecError::Shape(vec![Violation {
                        field: if path == "." { String::new() } else { path },
                        message: strip_position(&inner.to_string()),
                    }]),
                    _ => SpecError::Syntax(inner.to_string()),
                });
            }
        };
        JobSpec::parse(input).map_err(SpecError::Invalid)
    }

    /// Reads a spec the API stored (`jobs.spec`): the one place a stored
    /// spec is decoded, and checked again, so every reader sees a valid
    /// spec or one error that says what is wrong with it.
    pub fn from_stored(stored: serde_json::Value) -> Result<JobSpec, StoredSpecError> {
        let input: UncheckedJobSpec =
            serde_path_to_error::deserialize(stored).map_err(|e| StoredSpecError::Decode {
                path: e.path().to_string(),
                message: strip_position(&e.into_inner().to_string()),
            })?;
        JobSpec::parse(input).map_err(|v| StoredSpecError::Invalid(InvalidSpec(v)))
    }
}

/// A stored job spec that does not read as a valid one: written by
/// another version, or changed behind the API's back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoredSpecError {
    /// It is not the shape of a spec.
    #[error("the stored spec does not decode at {path}: {message}")]
    Decode {
        /// Where (a field path).
        path: String,
        /// What.
        message: String,
    },
    /// It breaks the rules.
    #[error("the stored spec breaks the rules: {0}")]
    Invalid(InvalidSpec),
}

/// serde_json appends " at line L column C" to data errors; the field path
/// says more to a user than a column does.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

#[cfg(test)]
mod tests;
