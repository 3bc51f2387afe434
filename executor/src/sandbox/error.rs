//! What can go wrong when users' code is run in the sandbox: the
//! sandbox refuses (the kernel cannot confine it), a child does not start,
//! or it ends without an answer ([`SandboxError`]). Its text is the reason
//! users read.

use super::RUNTIME_MB;
use std::path::PathBuf;
use trainyard_confined::protocol::Kind;
use trainyard_sandbox::Ending;

/// Why the sandbox could not run a child, or what ended it without an
/// answer. Its text is the reason users read.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// This kernel cannot confine what was asked (`--sandbox on`).
    #[error("{0}")]
    Refused(String),
    /// `trainyard-confined` is not beside the executor.
    #[error("{} is missing: the executor starts users' code in it and does not run without it (install it beside {}; `cargo build --bins` builds both)", .program.display(), .executable.display())]
    NoProgram {
        /// Where it was looked for.
        program: PathBuf,
        /// The executor's binary.
        executable: PathBuf,
    },
    /// The sandbox's user (`--sandbox-user`) does not exist.
    #[error("{0}")]
    User(String),
    /// A script job names a runtime this executor does not have.
    #[error("this executor has no Python runtime named {name:?} (it has: {})", .have.join(", "))]
    NoPython {
        /// The name asked for.
        name: String,
        /// The runtimes it has.
        have: Vec<String>,
    },
    /// A folder or file of a child could not be made, given or copied.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming the path.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The child did not start or did not take its task.
    #[error("{what}: {source}")]
    Start {
        /// What was being started.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A confined script rank without its network namespace.
    #[error("a confined script rank needs its network namespace")]
    NoNetns,
    /// The child's task line could not be written or amended.
    #[error("the sandboxed child's task: {0}")]
    Task(#[from] serde_json::Error),
    /// The child exited cleanly but its answer is not readable.
    #[error("the sandboxed {kind} answered nothing readable ({source}): {last}")]
    Unreadable {
        /// What the child was.
        kind: Kind,
        /// Why its answer is not readable.
        source: serde_json::Error,
        /// The last line it wrote on stderr.
        last: String,
    },
    /// The child ran out of its memory.
    #[error("the {kind} {ending} ({asked_mb} MiB asked by resources.memory_mb, {RUNTIME_MB} MiB for the runtime)")]
    Memory {
        /// What the child was.
        kind: Kind,
        /// How it ended.
        ending: Ending,
        /// What the job asked for.
        asked_mb: u64,
    },
    /// The child ended otherwise (a signal, a time limit, an exit code).
    #[error("the {kind} {ending}{}", colon(.last))]
    Ended {
        /// What the child was.
        kind: Kind,
        /// How it ended.
        ending: Ending,
        /// The last line it wrote on stderr.
        last: String,
    },
}

/// `": LAST"`, or nothing where `last` is empty.
fn colon(last: &str) -> String {
    if last.is_empty() {
        String::new()
    } else {
        format!(": {last}")
    }
}

impl SandboxError {
    pub(super) fn io(what: String) -> impl FnOnce(std::io::Error) -> SandboxError {
        move |source| SandboxError::Io { what, source }
    }

    pub(super) fn start(what: String) -> impl FnOnce(std::io::Error) -> SandboxError {
        move |source| SandboxError::Start { what, source }
    }
}
