//! Typed configuration from flags and environment variables.
//!
//! Every setting has a flag and an environment variable (shown by
//! `trainyard serve --help`); flags win. The README's configuration table
//! lists the same settings.

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

    /// When set, every `/v1` request must carry `Authorization: Bearer <token>`.
    #[arg(long, env = "TRAINYARD_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,

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

    /// Do not run the scheduler loop in this process (another replica does).
    #[arg(long, env = "TRAINYARD_NO_SCHEDULER")]
    pub no_scheduler: bool,

    /// Largest request body in bytes.
    #[arg(long, env = "TRAINYARD_MAX_BODY_BYTES", default_value_t = 1 << 20)]
    pub max_body_bytes: usize,

    /// Longest time a request may take, in seconds.
    #[arg(long, env = "TRAINYARD_REQUEST_TIMEOUT_SECS", default_value_t = 30)]
    pub request_timeout_secs: u64,

    /// Most Postgres connections in the pool.
    #[arg(long, env = "TRAINYARD_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,

    /// Longest wait for a pooled Postgres connection, in seconds.
    #[arg(long, env = "TRAINYARD_DB_ACQUIRE_TIMEOUT_SECS", default_value_t = 5)]
    pub db_acquire_timeout_secs: u64,

    /// Log format.
    #[arg(long, env = "TRAINYARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
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
            api_token: None,
            join_token: Some("test-join-token".into()),
            heartbeat_interval_ms: 1000,
            heartbeat_misses: 3,
            no_scheduler: false,
            max_body_bytes: 1 << 20,
            request_timeout_secs: 30,
            db_max_connections: 8,
            db_acquire_timeout_secs: 5,
            log_format: LogFormat::Text,
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
