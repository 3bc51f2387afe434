//! The client commands' flags, and where the API is ([`Connection`]: the
//! `--api`/`TRAINYARD_API` address, default `http://127.0.0.1:8080`, the
//! server's default listen address, and the `--token`/`TRAINYARD_API_TOKEN`
//! bearer token).

use crate::error::CliError;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use trainyard_client::{Client, ModelFormat};

/// Longest wait for one answer of the API.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the API is and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// Base URL of the Trainyard API.
    #[arg(long, env = "TRAINYARD_API", default_value = "http://127.0.0.1:8080")]
    pub api: String,
    /// Bearer token: a user's or an admin's (`trainyard token create`, or
    /// the server's `--admin-token`). Not needed by an open, loopback-only
    /// server.
    #[arg(long, env = "TRAINYARD_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// `trainyard submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The job spec (JSON); `-` reads it from standard input.
    pub file: PathBuf,
    /// Makes a retried submit return the same job instead of a second one.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Follow the job until it ends, as `trainyard job` does.
    #[arg(long)]
    pub follow: bool,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard jobs`.
#[derive(Debug, Args)]
pub struct JobsArgs {
    /// Only jobs in these states (comma-separated, e.g. `queued,running`).
    #[arg(long)]
    pub state: Option<String>,
    /// How many (newest first).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    #[command(flatten)]
    pub conn: Connection,
}

/// Commands that take a job id.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// The job id.
    pub id: String,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard model`.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// The job id.
    pub id: String,
    /// `safetensors` (every tensor of the model's `state_dict()` by name)
    /// or `torchscript` (the trained module, for `torch.jit.load`;
    /// TorchScript jobs only).
    #[arg(long, default_value = "safetensors", value_parser = parse_model_format)]
    pub format: ModelFormat,
    /// Where to write the file (default: `ID.safetensors` or `ID.pt` in
    /// the current folder).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub conn: Connection,
}

/// `--format`: clap prints the message with the flag's name.
fn parse_model_format(s: &str) -> Result<ModelFormat, String> {
    s.parse()
}

/// `trainyard upload`.
#[derive(Debug, Args)]
pub struct UploadArgs {
    /// The file (a TorchScript model, a dataset): streamed, never read whole.
    pub file: PathBuf,
    /// The artifact's name (default: the file's name); a spec names it
    /// `artifact:NAME`. Uploading a name again replaces it.
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard run-script`.
#[derive(Debug, Args)]
pub struct RunScriptArgs {
    /// Your training script (a `.py` file): it runs unmodified on every
    /// rank, under torchrun's variables.
    pub script: PathBuf,
    /// Files and folders packed beside the script (a `.tar.gz` whose top
    /// folder holds them all); repeatable.
    #[arg(long = "files", num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// An input: a local file (uploaded under its own name, found by it in
    /// `TRAINYARD_INPUT_DIR`) or `artifact:NAME` / an allowed URL;
    /// repeatable.
    #[arg(long = "input")]
    pub inputs: Vec<String>,
    /// The world: `N`, or `MIN:MAX` for an elastic job.
    #[arg(long, default_value = "1")]
    pub workers: String,
    /// An argument of the script (repeatable; or everything after `--`).
    #[arg(long = "arg", allow_hyphen_values = true)]
    pub arg: Vec<String>,
    /// A variable of the script's own, `KEY=VALUE` (repeatable).
    #[arg(long = "env")]
    pub env: Vec<String>,
    /// The executors' Python runtime to use (their `--python NAME=PATH`).
    #[arg(long)]
    pub python: Option<String>,
    /// Restarts after a failure (default 3).
    #[arg(long)]
    pub max_restarts: Option<u32>,
    /// How long one run of the script may take, seconds (default a day);
    /// a script still running then is killed and the job fails.
    #[arg(long)]
    pub max_seconds: Option<u64>,
    /// Memory per rank, MiB.
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// The job's name (default: the script's).
    #[arg(long)]
    pub name: Option<String>,
    /// Follow the job until it ends, as `trainyard job` does.
    #[arg(long)]
    pub follow: bool,
    /// The script's arguments after `--`.
    #[arg(last = true)]
    pub rest: Vec<String>,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard outputs`.
#[derive(Debug, Args)]
pub struct OutputsArgs {
    /// The job id.
    pub id: String,
    /// Download this output (a path the listing shows) instead of listing.
    pub path: Option<String>,
    /// Where to write it (default: its file name in the current folder).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard artifacts`.
#[derive(Debug, Args)]
pub struct ArtifactsArgs {
    /// Only this user's (admins; a user sees only its own).
    #[arg(long)]
    pub owner: Option<String>,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard executors`.
#[derive(Debug, Args)]
pub struct ExecutorsArgs {
    /// Only executors in this state (`live`, `draining`, `lost`, `left`).
    #[arg(long)]
    pub state: Option<String>,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard token`.
#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

/// What to do with tokens (admins only).
#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Make a token and print it (shown only this once).
    Create {
        /// The user it acts as (its jobs belong to this name).
        #[arg(long)]
        owner: String,
        /// `user` (its own jobs only) or `admin`.
        #[arg(long, default_value = "user")]
        role: String,
        /// What it is for.
        #[arg(long, default_value = "")]
        label: String,
        /// Seconds until it stops working (default: until revoked).
        #[arg(long)]
        expires_in: Option<u64>,
        #[command(flatten)]
        conn: Connection,
    },
    /// List tokens (never the tokens themselves).
    List {
        #[command(flatten)]
        conn: Connection,
    },
    /// Revoke a token by its id.
    Revoke {
        /// The token's id (from `trainyard token list`).
        id: String,
        #[command(flatten)]
        conn: Connection,
    },
}

/// `trainyard quota`.
#[derive(Debug, Args)]
pub struct QuotaArgs {
    #[command(subcommand)]
    pub command: QuotaCommand,
}

/// What to do with quotas (admins only).
#[derive(Debug, clap::Subcommand)]
pub enum QuotaCommand {
    /// Set a user's limits; a limit not given is unlimited.
    Set {
        /// The user.
        owner: String,
        /// Most workers on CUDA devices at once.
        #[arg(long)]
        cuda_devices: Option<u32>,
        /// Most workers on CPU devices at once.
        #[arg(long)]
        cpu_workers: Option<u32>,
        /// Most PS shard RAM at once, in MiB.
        #[arg(long)]
        ps_ram_mb: Option<u64>,
        #[command(flatten)]
        conn: Connection,
    },
    /// A user's limits and what its jobs hold now.
    Get {
        /// The user.
        owner: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Every user with a quota.
    List {
        #[command(flatten)]
        conn: Connection,
    },
}

/// `trainyard usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Start of the window, RFC 3339 (default: a day before --to).
    #[arg(long)]
    pub from: Option<String>,
    /// End of the window, RFC 3339 (default: now).
    #[arg(long)]
    pub to: Option<String>,
    /// Only this user (admins; users always see their own).
    #[arg(long)]
    pub owner: Option<String>,
    #[command(flatten)]
    pub conn: Connection,
}

/// `trainyard sweep`.
#[derive(Debug, Args)]
pub struct SweepArgs {
    #[command(subcommand)]
    pub command: SweepCommand,
}

/// What to do with hyperparameter sweeps.
#[derive(Debug, clap::Subcommand)]
pub enum SweepCommand {
    /// Start a sweep from a spec (JSON file, or - for stdin) and print its id.
    Create {
        /// The sweep spec: `name`, `base` (a job spec), `parameters`,
        /// `metric`, `goal`, `search`, `max_trials`, `concurrency`,
        /// `early_stopping` (see docs/users/sweeps.md).
        file: PathBuf,
        /// Follow the sweep until it ends: a line per trial that changes
        /// state, then the trials; exit 0 when it succeeded, 1 when it
        /// failed, 3 when it was cancelled.
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// List your sweeps, newest first.
    List {
        #[command(flatten)]
        conn: Connection,
    },
    /// A sweep's trials as a table (`*` marks the best).
    Show {
        /// The sweep id.
        id: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Cancel a sweep and its running trials.
    Cancel {
        /// The sweep id.
        id: String,
        #[command(flatten)]
        conn: Connection,
    },
}

/// `trainyard whoami`.
#[derive(Debug, Args)]
pub struct WhoamiArgs {
    #[command(flatten)]
    pub conn: Connection,
}

/// Flags of `trainyard provisioner`.
#[derive(Debug, clap::Args)]
pub struct ProvisionerArgs {
    /// How many recent decisions to print.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    #[command(flatten)]
    pub conn: Connection,
}

impl Connection {
    /// A client of the API this names (one attempt per request).
    pub fn client(self) -> Result<Client, CliError> {
        Client::builder(self.api)
            .token(self.token)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| CliError::from_client(e, ""))
    }
}
