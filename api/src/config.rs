//! Typed configuration from flags and environment variables.
//!
//! Every setting has a flag and an environment variable (shown by
//! `trainyard serve --help`); flags win. The table in
//! docs/operators/configuration.md lists the same settings.

use clap::{Args, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Settings of the API server.
#[derive(Debug, Clone, Args)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "TRAINYARD_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Postgres URL. When absent, a private cluster is started in
    /// `<data-dir>/postgres` with the machine's PostgreSQL binaries.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Folder for embedded state: the private Postgres cluster and the
    /// default local object store.
    #[arg(long, env = "TRAINYARD_DATA_DIR", default_value = ".trainyard")]
    pub data_dir: PathBuf,

    /// Object-store URL for checkpoints and models (`file:///…`, `s3://bucket/prefix`, …).
    /// Default: `file://<data-dir>/objects`.
    #[arg(long, env = "TRAINYARD_OBJECT_STORE")]
    pub object_store: Option<String>,

    /// Object-store settings as `KEY=VALUE` (repeatable, or comma-separated
    /// in the variable): `aws_endpoint`, `aws_region`, `aws_access_key_id`,
    /// … of the `object_store` crate. The standard `AWS_*` variables are
    /// read too; these win.
    #[arg(
        long = "object-store-option",
        env = "TRAINYARD_OBJECT_STORE_OPTIONS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub object_store_options: Vec<String>,

    /// The bootstrap admin token: it acts as user `admin` with the admin
    /// role, and makes every other token (`POST /v1/tokens`). When set, every
    /// user-facing `/v1` request needs `Authorization: Bearer <token>`. When
    /// absent the server runs open (every caller is the admin), which is
    /// allowed only on a loopback listen address.
    #[arg(long, env = "TRAINYARD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Most jobs one user may have waiting (queued, inspecting or
    /// scheduling); a submit beyond it is a 429. Admins are exempt.
    #[arg(long, env = "TRAINYARD_MAX_WAITING_JOBS_PER_USER", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_waiting_jobs_per_user: u32,

    /// Submits a second one user may make on average (a token bucket per
    /// user and API process); beyond it a 429 with `Retry-After`. Admins
    /// are exempt.
    #[arg(long, env = "TRAINYARD_SUBMIT_RATE_PER_USER", default_value_t = 5.0, value_parser = positive_rate)]
    pub submit_rate_per_user: f64,

    /// Submits one user may make at once before the rate applies.
    #[arg(long, env = "TRAINYARD_SUBMIT_BURST_PER_USER", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub submit_burst_per_user: u32,

    /// Cluster join token executors register with. When absent, one is made
    /// and kept in `<data-dir>/join-token`.
    #[arg(long, env = "TRAINYARD_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,

    /// How often executors heartbeat, in milliseconds.
    #[arg(long, env = "TRAINYARD_HEARTBEAT_INTERVAL_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub heartbeat_interval_ms: u64,

    /// Missed heartbeats after which an executor is lost.
    #[arg(long, env = "TRAINYARD_HEARTBEAT_MISSES", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub heartbeat_misses: u32,

    /// Half-life, in seconds, of the usage fair share compares: among
    /// waiting jobs of one priority, the owner with the fewest decayed
    /// device-seconds goes first.
    #[arg(long, env = "TRAINYARD_FAIR_SHARE_HALF_LIFE_SECS", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    pub fair_share_half_life_secs: u64,

    /// A job queued this many seconds goes before every other waiting job
    /// of its priority, and later ones may not take what it needs.
    #[arg(long, env = "TRAINYARD_FAIR_SHARE_MAX_WAIT_SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    pub fair_share_max_wait_secs: u64,

    /// Seconds a job chosen for preemption may run on to commit a
    /// checkpoint before it is released (sooner once it has).
    #[arg(long, env = "TRAINYARD_PREEMPTION_GRACE_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub preemption_grace_secs: u64,

    /// Do not run the scheduler loop in this process (another replica does).
    #[arg(long, env = "TRAINYARD_NO_SCHEDULER")]
    pub no_scheduler: bool,

    /// Largest request body in bytes.
    #[arg(long, env = "TRAINYARD_MAX_BODY_BYTES", default_value_t = 1 << 20)]
    pub max_body_bytes: usize,

    /// Longest time a request may take, in seconds.
    #[arg(long, env = "TRAINYARD_REQUEST_TIMEOUT_SECS", default_value_t = 30)]
    pub request_timeout_secs: u64,

    /// Longest a client may take to send a request's headers, in seconds
    /// (also how long an idle keep-alive connection stays open).
    #[arg(long, env = "TRAINYARD_HEADER_READ_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub header_read_timeout_secs: u64,

    /// Most client connections served at once (more wait in the kernel's
    /// backlog).
    #[arg(long, env = "TRAINYARD_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// Most Postgres connections in the pool.
    #[arg(long, env = "TRAINYARD_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,

    /// Longest wait for a pooled Postgres connection, in seconds.
    #[arg(long, env = "TRAINYARD_DB_ACQUIRE_TIMEOUT_SECS", default_value_t = 5)]
    pub db_acquire_timeout_secs: u64,

    /// Longest any one SQL statement of the server may run, in seconds
    /// (migrations excepted).
    #[arg(long, env = "TRAINYARD_DB_STATEMENT_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub db_statement_timeout_secs: u64,

    /// Log format.
    #[arg(long, env = "TRAINYARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// A URL prefix users' jobs may read data and models from besides their
    /// own artifacts (repeatable, or comma-separated in the variable), e.g.
    /// `s3://datasets/` or `file:///srv/datasets/`. Matched by whole path
    /// segments; the object store itself stays closed under any prefix.
    /// Admins' jobs read any URL.
    #[arg(long = "allow-data-url", env = "TRAINYARD_ALLOW_DATA_URLS", value_delimiter = ',', value_parser = data_url_prefix)]
    pub allow_data_urls: Vec<String>,

    /// Largest artifact (an uploaded model or dataset), in bytes.
    #[arg(long, env = "TRAINYARD_MAX_ARTIFACT_BYTES", default_value_t = 4 << 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_artifact_bytes: u64,

    /// Most bytes of artifacts one user may hold (versions that unfinished
    /// jobs still read count until those jobs end). Admins are exempt.
    #[arg(long, env = "TRAINYARD_MAX_ARTIFACT_BYTES_PER_USER", default_value_t = 16 << 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_artifact_bytes_per_user: u64,

    /// Seconds an upload may go without moving a byte before it is cut (a
    /// 408); past that first period it must also average 64 KiB/s. Uploads
    /// are not bound by the request timeout.
    #[arg(long, env = "TRAINYARD_ARTIFACT_IDLE_TIMEOUT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub artifact_idle_timeout_secs: u64,

    /// Who starts executors: `local` (executor processes on this machine,
    /// on demand, released when idle), `slurm` (Slurm batch jobs, see the
    /// `--slurm-*` settings), `none` (only hand-started ones), or
    /// `auto`: `local` when the server runs its private Postgres (one
    /// machine), else `none`.
    #[arg(long, env = "TRAINYARD_PROVISIONER", value_enum, default_value_t = ProvisionerKind::Auto)]
    pub provisioner: ProvisionerKind,

    /// Most executors the provisioner runs at once (also bounded by its CPU
    /// and memory budget).
    #[arg(long, env = "TRAINYARD_PROVISION_MAX_EXECUTORS", default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub provision_max_executors: u32,

    /// Most new executors one job may need; a larger job stays queued with
    /// the reason.
    #[arg(long, env = "TRAINYARD_PROVISION_MAX_PER_JOB", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub provision_max_per_job: u32,

    /// Seconds an executor the provisioner started may hold no role before
    /// it is released (scale to zero).
    #[arg(long, env = "TRAINYARD_PROVISION_IDLE_TIMEOUT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub provision_idle_timeout_secs: u64,

    /// Seconds a started executor may take to register before it is killed
    /// (and starts back off).
    #[arg(long, env = "TRAINYARD_PROVISION_START_TIMEOUT_SECS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub provision_start_timeout_secs: u64,

    /// CPU cores the local provisioner may give executors (default: all).
    #[arg(long, env = "TRAINYARD_PROVISION_CPUS", value_parser = positive_f64)]
    pub provision_cpus: Option<f64>,

    /// Memory the local provisioner may give executors, in MiB (default:
    /// the machine's available memory at start).
    #[arg(long, env = "TRAINYARD_PROVISION_MEMORY_MB")]
    pub provision_memory_mb: Option<u64>,

    /// CPU cores per provisioned executor (its libtorch threads, rounded
    /// down, at least 1; fractions let several share a core).
    #[arg(long, env = "TRAINYARD_PROVISION_EXECUTOR_CPUS", default_value_t = 1.0, value_parser = positive_f64)]
    pub provision_executor_cpus: f64,

    /// RAM each provisioned executor offers, in MiB.
    #[arg(long, env = "TRAINYARD_PROVISION_EXECUTOR_MEMORY_MB", default_value_t = 2048, value_parser = clap::value_parser!(u64).range(16..=4_194_304))]
    pub provision_executor_memory_mb: u64,

    /// The `trainyard-executor` binary the local provisioner starts
    /// (default: the one beside this binary). The Slurm provisioner's jobs
    /// run the same path on the nodes.
    #[arg(long, env = "TRAINYARD_PROVISION_EXECUTOR_BIN")]
    pub provision_executor_bin: Option<PathBuf>,

    /// Slurm: the partition executors' jobs run in (`--partition`).
    #[arg(long, env = "TRAINYARD_SLURM_PARTITION")]
    pub slurm_partition: Option<String>,

    /// Slurm: the account they are charged to (`--account`).
    #[arg(long, env = "TRAINYARD_SLURM_ACCOUNT")]
    pub slurm_account: Option<String>,

    /// Slurm: their quality of service (`--qos`).
    #[arg(long, env = "TRAINYARD_SLURM_QOS")]
    pub slurm_qos: Option<String>,

    /// Slurm: each executor's time limit, in Slurm's syntax (`--time`:
    /// `60`, `4:00:00`, `1-00`); the partition's default when absent.
    #[arg(long, env = "TRAINYARD_SLURM_TIME_LIMIT")]
    pub slurm_time_limit: Option<String>,

    /// Slurm: generic resources of each executor (`--gres`, e.g. `gpu:1`);
    /// the GPU count is what each executor offers the planner.
    #[arg(long, env = "TRAINYARD_SLURM_GRES")]
    pub slurm_gres: Option<String>,

    /// Slurm: seconds before the time limit Slurm sends SIGUSR1 (the
    /// executor drains with a checkpoint).
    #[arg(long, env = "TRAINYARD_SLURM_SIGNAL_SECS", default_value_t = 120, value_parser = clap::value_parser!(u32).range(1..=65_535))]
    pub slurm_signal_secs: u32,

    /// Slurm: the API's URL as the nodes reach it (default: this server's
    /// listen address).
    #[arg(long, env = "TRAINYARD_SLURM_API_URL")]
    pub slurm_api_url: Option<String>,

    /// Slurm: the executors' data-plane listen address; with `0.0.0.0`
    /// they advertise their node's host name.
    #[arg(long, env = "TRAINYARD_SLURM_DATA_LISTEN", default_value = "0.0.0.0:0")]
    pub slurm_data_listen: SocketAddr,

    /// Slurm: the folder of the executors' logs and caches, on a file
    /// system the nodes share (default: `<data-dir>/executors`).
    #[arg(long, env = "TRAINYARD_SLURM_DIR")]
    pub slurm_dir: Option<PathBuf>,

    /// Slurm: the comment every job of this server carries, its identity
    /// in `squeue` (adoption after a restart checks it).
    #[arg(long, env = "TRAINYARD_SLURM_COMMENT", default_value = "trainyard")]
    pub slurm_comment: String,

    /// Slurm: one more `sbatch` argument, verbatim (repeatable, or
    /// comma-separated in the variable).
    #[arg(
        long = "slurm-sbatch-arg",
        env = "TRAINYARD_SLURM_SBATCH_ARGS",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    pub slurm_sbatch_args: Vec<String>,

    /// Slurm: a variable of this server's environment the executors get
    /// too, when set (repeatable, or comma-separated; `PATH`,
    /// `LD_LIBRARY_PATH`, `HOME` and `RUST_LOG` always are).
    #[arg(
        long = "slurm-export",
        env = "TRAINYARD_SLURM_EXPORT",
        value_delimiter = ','
    )]
    pub slurm_export: Vec<String>,

    /// The MLflow tracking server jobs are logged to (params, metrics,
    /// model), unless a job's `tracking.mlflow` says otherwise; none by
    /// default. Users' jobs may always name this one.
    #[arg(long, env = "TRAINYARD_MLFLOW_URI", value_parser = tracking_uri)]
    pub mlflow_uri: Option<String>,

    /// The MLflow experiment of jobs that name none.
    #[arg(long, env = "TRAINYARD_MLFLOW_EXPERIMENT", default_value = "trainyard", value_parser = experiment_name)]
    pub mlflow_experiment: String,

    /// A URL prefix of tracking servers users' jobs may name in
    /// `tracking.mlflow.uri` besides `--mlflow-uri` (repeatable, or
    /// comma-separated in the variable), e.g. `http://mlflow.internal:5000/`.
    /// Matched by scheme, host, port and whole path segments. Without any,
    /// users may name only the default; admins' jobs name any http(s) URL.
    #[arg(
        long = "tracking-allowed-uri",
        env = "TRAINYARD_TRACKING_ALLOWED_URIS",
        value_delimiter = ',',
        value_parser = tracking_uri
    )]
    pub tracking_allowed_uris: Vec<String>,
}

/// A tracking server URL (`--mlflow-uri`, `--tracking-allowed-uri`): the
/// same form a job's `tracking.mlflow.uri` must have.
fn tracking_uri(s: &str) -> Result<String, String> {
    let s = s.trim();
    match trainyard_common::spec::tracking::tracking_uri_problem(s) {
        None => Ok(s.to_owned()),
        Some(why) => Err(format!("{s:?}: {why}")),
    }
}

fn experiment_name(s: &str) -> Result<String, String> {
    match trainyard_common::spec::tracking::experiment_problem(s) {
        None => Ok(s.to_owned()),
        Some(why) => Err(format!("{s:?}: {why}")),
    }
}

/// An `--allow-data-url` prefix: an absolute `file://` path or a
/// `scheme://bucket/…` URL, kept with one trailing `/`.
fn data_url_prefix(s: &str) -> Result<String, String> {
    let s = s.trim();
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err(format!(
            "{s:?} is not a URL prefix such as s3://datasets/ or file:///srv/data/"
        ));
    };
    if !trainyard_common::spec::URL_SCHEMES.contains(&scheme) {
        return Err(format!(
            "{s:?}: unsupported scheme; expected one of {}",
            trainyard_common::spec::URL_SCHEMES.join(", ")
        ));
    }
    let path = rest.trim_end_matches('/');
    if path.is_empty() || (scheme == "file" && !path.starts_with('/')) {
        return Err(format!(
            "{s:?}: a prefix names a bucket or an absolute folder (file:///folder/)"
        ));
    }
    if s.contains(['%', '?', '#', '\\'])
        || path
            .trim_start_matches('/')
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err(format!(
            "{s:?}: a prefix has no empty, '.' or '..' segments and no escapes"
        ));
    }
    Ok(trainyard_common::artifact::normalize_prefix(s))
}

fn positive_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.001..=1_000_000.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected submits per second between 0.001 and 1000000, got {s:?}"
        )),
    }
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 100_000.0 => Ok(v),
        _ => Err(format!("expected a number of cores above 0, got {s:?}")),
    }
}

/// Who starts executors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProvisionerKind {
    /// `local` with a private Postgres, else `none`.
    Auto,
    /// Executor processes on this machine.
    Local,
    /// Hand-started executors only.
    None,
    /// Executors as Slurm batch jobs (`--slurm-*` settings).
    Slurm,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

impl Config {
    /// The defaults, listening on `listen` (tests use port 0).
    pub fn for_tests(listen: SocketAddr) -> Config {
        Config {
            listen,
            database_url: None,
            data_dir: PathBuf::from(".trainyard"),
            object_store: None,
            object_store_options: Vec::new(),
            admin_token: None,
            max_waiting_jobs_per_user: 100,
            submit_rate_per_user: 5.0,
            submit_burst_per_user: 20,
            join_token: Some("test-join-token".into()),
            heartbeat_interval_ms: 1000,
            heartbeat_misses: 3,
            fair_share_half_life_secs: 3600,
            fair_share_max_wait_secs: 600,
            preemption_grace_secs: 30,
            no_scheduler: false,
            max_body_bytes: 1 << 20,
            request_timeout_secs: 30,
            max_connections: 4096,
            header_read_timeout_secs: 30,
            db_max_connections: 8,
            db_acquire_timeout_secs: 5,
            db_statement_timeout_secs: 30,
            log_format: LogFormat::Text,
            allow_data_urls: Vec::new(),
            max_artifact_bytes: 4 << 30,
            max_artifact_bytes_per_user: 16 << 30,
            artifact_idle_timeout_secs: 60,
            provisioner: ProvisionerKind::None,
            provision_max_executors: 4,
            provision_max_per_job: 4,
            provision_idle_timeout_secs: 60,
            provision_start_timeout_secs: 120,
            provision_cpus: None,
            provision_memory_mb: None,
            provision_executor_cpus: 1.0,
            provision_executor_memory_mb: 2048,
            provision_executor_bin: None,
            slurm_partition: None,
            slurm_account: None,
            slurm_qos: None,
            slurm_time_limit: None,
            slurm_gres: None,
            slurm_signal_secs: 120,
            slurm_api_url: None,
            slurm_data_listen: SocketAddr::from(([0, 0, 0, 0], 0)),
            slurm_dir: None,
            slurm_comment: "trainyard".into(),
            slurm_sbatch_args: Vec::new(),
            slurm_export: Vec::new(),
            mlflow_uri: None,
            mlflow_experiment: "trainyard".into(),
            tracking_allowed_uris: Vec::new(),
        }
    }

    /// Whether the local provisioner runs (`auto` means: when the server
    /// runs its private Postgres).
    pub fn local_provisioner(&self) -> bool {
        match self.provisioner {
            ProvisionerKind::Local => true,
            ProvisionerKind::None | ProvisionerKind::Slurm => false,
            ProvisionerKind::Auto => self.database_url.is_none(),
        }
    }

    /// Refuses configurations that would expose an open server: without an
    /// admin token only a loopback listen address is allowed. Also refuses
    /// an empty admin token.
    pub fn check_auth(&self) -> Result<(), String> {
        match self.admin_token.as_deref() {
            Some(t) if t.trim().is_empty() => {
                Err("--admin-token (TRAINYARD_ADMIN_TOKEN) is empty".into())
            }
            Some(_) => Ok(()),
            None if self.listen.ip().is_loopback() => Ok(()),
            None => Err(format!(
                "listening on {} without an admin token would let anyone on the network act as admin: set --admin-token (TRAINYARD_ADMIN_TOKEN), or listen on 127.0.0.1",
                self.listen
            )),
        }
    }

    /// The join token in force: the configured one, else the one kept in
    /// `<data-dir>/join-token` (made on first use).
    pub fn resolve_join_token(&self) -> std::io::Result<String> {
        if let Some(t) = &self.join_token {
            return Ok(t.clone());
        }
        let path = self.data_dir.join("join-token");
        if let Ok(t) = std::fs::read_to_string(&path) {
            if !t.trim().is_empty() {
                return Ok(t.trim().to_owned());
            }
        }
        std::fs::create_dir_all(&self.data_dir)?;
        let token = hex::encode(trainyard_scheduler::service::new_secret());
        // Readable by its owner only: it admits executors to the cluster.
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(token.as_bytes())?;
        Ok(token)
    }

    /// The object-store options as pairs; a malformed one is named.
    pub fn object_store_pairs(&self) -> Result<Vec<(String, String)>, String> {
        trainyard_store::parse_options(&self.object_store_options)
    }

    /// The object-store URL in force.
    pub fn object_store_url(&self) -> String {
        match &self.object_store {
            Some(url) => url.clone(),
            None => {
                let dir = std::path::absolute(self.data_dir.join("objects"))
                    .unwrap_or_else(|_| self.data_dir.join("objects"));
                format!("file://{}", dir.display())
            }
        }
    }
}
