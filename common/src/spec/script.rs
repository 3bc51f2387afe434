//! A script job's own part of the spec: the user's unmodified PyTorch
//! training script (one `.py` file, or an archive of a folder), how it is
//! started (entrypoint, arguments, environment, Python runtime), how
//! often it may be restarted and how long it may run, with the rules a
//! valid one follows. Each rank
//! runs the script in its role's sandbox under torchrun's environment
//! contract ([`TORCHRUN_ENV`]); the executor sets those variables, so a
//! spec may not.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Most arguments a script takes.
pub const MAX_SCRIPT_ARGS: usize = 256;
/// Most environment variables a spec sets.
pub const MAX_SCRIPT_ENV: usize = 64;
/// Longest argument or environment value, bytes.
pub const MAX_SCRIPT_VALUE_BYTES: usize = 4096;
/// Longest entrypoint path, characters.
pub const MAX_ENTRYPOINT_CHARS: usize = 256;
/// Most restarts a script job may ask for.
pub const MAX_SCRIPT_RESTARTS: u32 = 100;
/// Restarts when the spec does not say (`TORCHELASTIC_MAX_RESTARTS`).
pub const DEFAULT_SCRIPT_RESTARTS: u32 = 3;
/// Most inputs a job names.
pub const MAX_INPUTS: usize = 64;
/// Host memory a script rank's spare interpreter holds, MiB. While a rank
/// runs, its executor keeps one spare for the job's next generation, with
/// PyTorch (and what DistributedDataParallel's constructor imports)
/// already imported: measured with torch 2.11 on x86-64, 335 MiB of its
/// own (anonymous) memory and 414 MiB of libtorch's code mapped from files
/// that the rank beside it maps too; rounded up. The scheduler charges it
/// with the rank ([`super::UncheckedJobSpec::worker_memory_mb`]).
pub const SPARE_INTERPRETER_MB: u64 = 512;
/// Longest a script may run, seconds (30 days): `script.max_seconds`.
pub const MAX_SCRIPT_SECONDS: u64 = 30 * 24 * 3600;
/// How long a script may run when the spec does not say, seconds (a day).
/// A job spec has no overall time limit of its own, so this is the bound
/// that ends a script that never exits.
pub const DEFAULT_SCRIPT_SECONDS: u64 = 24 * 3600;

/// The variables torchrun gives every rank, which Trainyard sets with the
/// values torchrun would give.
pub const TORCHRUN_ENV: [&str; 16] = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "OMP_NUM_THREADS",
];

/// Variables a spec may not set besides [`TORCHRUN_ENV`]: the sandbox's
/// own (folders, the loader's and Python's search paths).
pub const RESERVED_ENV: [&str; 14] = [
    "PATH",
    "HOME",
    "TMPDIR",
    "XDG_CACHE_HOME",
    "HF_HOME",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "MPLCONFIGDIR",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "PYTHONHOME",
    "PYTHONPATH",
    "PYTHONSTARTUP",
];

/// A user's training script and how to start it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptSpec {
    /// The code: `artifact:NAME` (or an admin-allowed URL) of one `.py`
    /// file, or of a `.tar.gz`, `.tgz` or `.zip` of a folder.
    #[schema(example = "artifact:train.py")]
    pub code: String,
    /// The file to run, relative to the code's folder; for a single `.py`
    /// file, that file (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "train.py")]
    pub entrypoint: Option<String>,
    /// Its command-line arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables of its own (not torchrun's, not the
    /// sandbox's: see `TORCHRUN_ENV`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The executor's Python runtime to run it with, by name (an admin's
    /// `--python NAME=PATH`); `default` when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// How many times its ranks may be restarted after a failure
    /// (`TORCHELASTIC_MAX_RESTARTS`; 3 when not given). A changed world
    /// (a join, a loss) restarts them too but is not a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    /// How long one run of the script may take, in seconds (1–2592000;
    /// 86400, a day, when not given). A rank whose script still runs then
    /// is killed and the job fails, naming this limit: it is not
    /// restarted. Each generation's run (after a restart, a join, a loss)
    /// has the whole limit again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = 3600)]
    pub max_seconds: Option<u64>,
    /// The script's own Python packages, which each executor installs with
    /// uv into an environment layered over its runtime (the runtime's
    /// torch is kept): a requirements file (`artifact:NAME`, or an
    /// admin-allowed URL) or a list of requirement lines (`"tqdm==4.66.5"`).
    /// Not given: the code archive's own `requirements.txt`, or the
    /// `dependencies` its `pyproject.toml` declares. Only packages from
    /// the executors' package index: no options, paths or direct URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirements: Option<Requirements>,
}

/// A script's own packages ([`ScriptSpec::requirements`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Requirements {
    /// A requirements file: `artifact:NAME` or an admin-allowed URL.
    #[schema(example = "artifact:requirements.txt")]
    File(String),
    /// Requirement lines, as in a requirements file.
    #[schema(example = json!(["tqdm==4.66.5", "scikit-learn>=1.5"]))]
    Lines(Vec<String>),
}

/// Most requirement lines a script may name.
pub const MAX_REQUIREMENTS: usize = 200;
/// Longest requirement line, bytes.
pub const MAX_REQUIREMENT_BYTES: usize = 400;

/// Why `line` (one line of a requirements file, comments and blank lines
/// already dropped) is not taken, if it is not: only packages from the
/// executors' index, so nothing of a requirement can name a host file, an
/// index or another host.
pub fn requirement_problem(line: &str) -> Option<&'static str> {
    let line = line.trim();
    if line.is_empty() {
        return Some("must name a package");
    }
    if line.len() > MAX_REQUIREMENT_BYTES || line.chars().any(char::is_control) {
        return Some("must be at most 400 bytes, without control characters");
    }
    if line.starts_with('-') {
        return Some("options (-r, -c, -e, --index-url, --find-links, …) are not taken: the executor's admin chooses the package index");
    }
    let lower = line.to_ascii_lowercase();
    if line.contains('@') || lower.contains("file:") || lower.contains("://") {
        return Some("direct references (`name @ URL`, `file:`, VCS URLs) are not taken: name a package of the index, with a version if you like (`tqdm==4.66.5`)");
    }
    if !line.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Some("must start with a package name (local paths are not taken)");
    }
    None
}

/// The requirement lines of a requirements file's `text`: without blank
/// lines, comments (`# …`, and after ` #`) and line continuations.
pub fn requirement_lines(text: &str) -> Vec<String> {
    text.replace("\\\n", " ")
        .lines()
        .map(|l| match l.find(" #") {
            Some(i) => &l[..i],
            None => l,
        })
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

impl ScriptSpec {
    /// The entrypoint: as given, or the code's own file name for a single
    /// `.py` file.
    pub fn entrypoint(&self) -> Option<String> {
        if let Some(e) = &self.entrypoint {
            return Some(e.clone());
        }
        let name = self
            .code
            .rsplit(['/', ':'])
            .next()
            .unwrap_or(&self.code)
            .to_owned();
        name.ends_with(".py").then_some(name)
    }

    /// The restarts allowed.
    pub fn max_restarts(&self) -> u32 {
        self.max_restarts.unwrap_or(DEFAULT_SCRIPT_RESTARTS)
    }

    /// How long one run of the script may take: `max_seconds`, or
    /// [`DEFAULT_SCRIPT_SECONDS`].
    pub fn time_limit(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.max_seconds.unwrap_or(DEFAULT_SCRIPT_SECONDS))
    }

    /// The code's packaging, from its URL's extension.
    pub fn packaging(&self) -> Option<CodePackaging> {
        CodePackaging::of(&self.code)
    }
}

/// How a script's code is packaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodePackaging {
    /// One Python file.
    Python,
    /// A gzipped tar archive of a folder.
    TarGz,
    /// A zip archive of a folder.
    Zip,
}

impl CodePackaging {
    /// The packaging `url`'s extension names, if any.
    pub fn of(url: &str) -> Option<CodePackaging> {
        let lower = url.to_ascii_lowercase();
        if lower.ends_with(".py") {
            Some(CodePackaging::Python)
        } else if lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
            Some(CodePackaging::TarGz)
        } else if lower.ends_with(".zip") {
            Some(CodePackaging::Zip)
        } else {
            None
        }
    }
}

/// Why `path` (a path inside the code's folder, from a spec or an
/// archive) is not a safe relative path, if it is not: absolute, with a
/// `..`, empty or control characters.
pub fn relative_path_problem(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("must not be empty");
    }
    if path.starts_with('/') || path.starts_with('\\') {
        return Some("must be a path relative to the code's folder, not an absolute one");
    }
    if path.chars().any(char::is_control) {
        return Some("must not contain control characters");
    }
    if path.contains('\\') {
        return Some("must use `/` between folders");
    }
    if path.split('/').any(|p| p == "..") {
        return Some("must not contain `..`");
    }
    None
}

/// Why `key` may not be set by a spec's `env`, if it may not.
pub fn env_key_problem(key: &str) -> Option<String> {
    let valid = !key.is_empty()
        && key.len() <= 128
        && key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Some("must be a variable name: letters, digits and `_`, not starting with a digit, at most 128".into());
    }
    if TORCHRUN_ENV.contains(&key) {
        return Some("is set by Trainyard, with the value torchrun would give".into());
    }
    if RESERVED_ENV.contains(&key) || key.starts_with("TRAINYARD_") || key.starts_with("LD_") {
        return Some("is set by the sandbox".into());
    }
    None
}

/// The first port of the range a script job's rendezvous port (its
/// `MASTER_PORT`) is taken from.
pub const RENDEZVOUS_PORT_BASE: u16 = 20_000;
/// How many ports that range has (below Linux's ephemeral range, where a
/// connection's own port could collide).
pub const RENDEZVOUS_PORTS: u16 = 12_000;

/// The rendezvous port of script job `job` at `generation`: the same on
/// every rank (each computes it), another at each generation (so that a
/// port still held by the last generation's store, or taken by something
/// else, is not tried twice in a row).
pub fn rendezvous_port(job: uuid::Uuid, generation: u64) -> u16 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // A stride prime to the range's size: consecutive generations never
    // share a port.
    let n = u64::from(RENDEZVOUS_PORTS);
    let at = (h % n + (generation % n) * 7919) % n;
    RENDEZVOUS_PORT_BASE + at as u16
}
