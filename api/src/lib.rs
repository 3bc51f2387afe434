//! Trainyard's control plane: the REST API.
//!
//! [`Application::build`] wires the production server from a [`Config`]:
//! a Postgres pool (migrations from `migrations/` applied on start-up), the
//! routes of [`routes`] (jobs, executors, tokens, health, metrics) behind
//! the callers' credentials and roles of [`auth`], served by [`serve`]
//! (header timeout, connection cap, graceful drain), the scheduler
//! loop (unless `--no-scheduler`; see `trainyard-scheduler`), the OpenAPI document of
//! [`openapi`] with an interactive page at `/docs`, and the web UI of
//! [`web`] (kept live by [`routes::stream`]), and the exporter of
//! [`tracking`] that logs jobs to MLflow in the background. Every error leaves as
//! `application/problem+json` through [`error::ApiError`]. `trainyard
//! serve` (crate `trainyard-cli`) is a thin shell over this, and the
//! integration tests build the same [`Application`] on port 0 against a
//! fresh database, so they exercise the production wiring. The resources
//! the routes answer with are `trainyard_common::api`'s, shared with the
//! typed client (`trainyard-client`).
//!
//! The rules behind the routes are modules of their own: [`checkpointing`]
//! (committing checkpoints from shard reports, retention, resume points),
//! [`data_policy`] (what a job may read), [`divergence`] (a job whose
//! loss diverged fails, or is warned about), [`fencing`] (a role report only
//! from the role's holder at its generation) and [`wakeup`] (long-polling
//! heartbeats woken by job changes).
//!
//! When no `DATABASE_URL` is given, [`embedded_pg`] runs a private Postgres
//! cluster in the data folder with the machine's PostgreSQL binaries,
//! reachable only through a Unix socket in its folder and with a password.

pub mod auth;
pub mod checkpointing;
pub mod config;
pub mod data_policy;
pub mod divergence;
pub mod embedded_pg;
pub mod error;
pub mod extract;
pub mod fencing;
pub mod metrics;
pub mod openapi;
pub mod routes;
pub mod serve;
pub mod tfevents;
pub mod tracking;
pub mod wakeup;
pub mod web;

use anyhow::Context;
pub use config::Config;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use sqlx::{Connection, PgConnection};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use trainyard_scheduler::fleet::{Fleet, FleetConfig};
use trainyard_scheduler::local::{LocalConfig, LocalProvisioner};
use trainyard_scheduler::provision::Limits;
use trainyard_scheduler::service::{Scheduler, SchedulerConfig, SchedulerMetrics};
use trainyard_scheduler::slurm::{SlurmConfig, SlurmProvisioner};

/// The migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// The Postgres pool.
    pub db: PgPool,
    /// Prometheus metrics.
    pub metrics: Arc<metrics::Metrics>,
    /// The configuration the server runs with.
    pub config: Arc<Config>,
    /// The cluster join token executors register with.
    pub join_token: Arc<String>,
    /// Fans Postgres notifications out to `/v1/events/stream`.
    pub events: routes::stream::EventHub,
    /// Wakes long-polling heartbeats when a job changes.
    pub wakeup: wakeup::Wakeup,
    /// The object store of checkpoints and models.
    pub store: Arc<trainyard_store::Store>,
    /// The provisioner's settings (`kind: none` without one).
    pub provisioner: Arc<routes::provisioner::ProvisionerSettings>,
    /// The per-user submit rate limit.
    pub submits: Arc<auth::SubmitLimiter>,
}

/// A built server: bound to its port and connected to its database.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    state: AppState,
    scheduler: Option<Scheduler>,
}

impl Application {
    /// Connects to `database_url`, applies migrations, and binds the listen
    /// address (port 0 picks a free port).
    pub async fn build(config: Config, database_url: &str) -> anyhow::Result<Application> {
        config.check_auth().map_err(|e| anyhow::anyhow!(e))?;
        let options: PgConnectOptions = database_url.parse().context("parsing the Postgres URL")?;
        // Migrations run on a connection of their own, without the
        // statement timeout (an index on a large table may take a while).
        let mut migrating = PgConnection::connect_with(&options)
            .await
            .context("connecting to Postgres")?;
        MIGRATOR
            .run(&mut migrating)
            .await
            .context("applying migrations")?;
        migrating.close().await.ok();
        // Every statement of the server is bounded: a lock wait or a stuck
        // query becomes an error (a 503 to the caller) instead of a request
        // that never ends.
        let db = PgPoolOptions::new()
            .max_connections(config.db_max_connections)
            .acquire_timeout(Duration::from_secs(config.db_acquire_timeout_secs))
            .connect_with(options.options([(
                "statement_timeout",
                format!("{}s", config.db_statement_timeout_secs),
            )]))
            .await
            .context("connecting to Postgres")?;
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let join_token = config
            .resolve_join_token()
            .context("reading or making the join token")?;
        let store = trainyard_store::Store::open(
            &config.object_store_url(),
            &config
                .object_store_pairs()
                .map_err(|e| anyhow::anyhow!(e))?,
        )
        .context("opening the object store")?;
        let metrics = Arc::new(metrics::Metrics::new()?);
        let (settings, fleet) = provisioner(&config, &listener, &join_token, &db)?;
        let scheduler = if config.no_scheduler {
            None
        } else {
            let sm = SchedulerMetrics::register(metrics.registry())?;
            let s = Scheduler::new(db.clone(), scheduler_config(&config), sm);
            Some(match fleet {
                Some(f) => s.with_fleet(f),
                None => s,
            })
        };
        let submits = Arc::new(auth::SubmitLimiter::new(
            config.submit_rate_per_user,
            config.submit_burst_per_user,
        ));
        let state = AppState {
            events: routes::stream::EventHub::new(db.clone()),
            wakeup: wakeup::Wakeup::new(db.clone()),
            db,
            metrics,
            join_token: Arc::new(join_token),
            store: Arc::new(store),
            provisioner: Arc::new(settings),
            config: Arc::new(config),
            submits,
        };
        let router = routes::router(state.clone(), openapi::routes());
        Ok(Application {
            listener,
            router,
            state,
            scheduler,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The shared state (for tests and embedding).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` resolves, then drains in-flight requests and
    /// closes the pool.
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let db = self.state.db.clone();
        let stop = trainyard_shutdown::Shutdown::new();
        let scheduler = self.scheduler.map(|s| tokio::spawn(s.run(stop.clone())));
        let sweeps = tokio::spawn(routes::sweeps::controller::run(
            self.state.clone(),
            stop.clone(),
        ));
        let exporter = tokio::spawn(tracking::export::run(
            db.clone(),
            self.state.store.clone(),
            stop.clone(),
        ));
        // Event streams never end by themselves: close them when shutdown
        // begins, or the graceful drain would wait for every open page.
        // The scheduler stops first, while HTTP still answers: executors
        // it provisioned drain and leave through this API.
        let events = self.state.events.clone();
        let shutdown = async move {
            shutdown.await;
            stop.trigger();
            if let Some(s) = scheduler {
                let _ = s.await;
            }
            let _ = sweeps.await;
            // The exporter ends its turn at the next batch; a call still
            // waiting on a tracker is cut (its batch is sent again later).
            let abort = exporter.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), exporter)
                .await
                .is_err()
            {
                abort.abort();
            }
            events.close();
        };
        let config = self.state.config.clone();
        serve::serve(
            self.listener,
            self.router,
            serve::Limits {
                header_read_timeout: Duration::from_secs(config.header_read_timeout_secs),
                max_connections: config.max_connections as usize,
                drain_limit: Duration::from_secs(config.request_timeout_secs + 5),
            },
            shutdown,
        )
        .await;
        db.close().await;
        Ok(())
    }
}

/// The provisioner the configuration asks for: its settings, and the fleet
/// the scheduler runs it with (none with `--provisioner none`, or without a
/// scheduler loop in this process).
fn provisioner(
    config: &Config,
    listener: &TcpListener,
    join_token: &str,
    db: &PgPool,
) -> anyhow::Result<(routes::provisioner::ProvisionerSettings, Option<Fleet>)> {
    let cpus = config
        .provision_cpus
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64));
    let memory_mb = config
        .provision_memory_mb
        .unwrap_or_else(|| available_memory_mb().unwrap_or(4096));
    let local = LocalConfig {
        executor_bin: match &config.provision_executor_bin {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .context("locating this binary")?
                .with_file_name("trainyard-executor"),
        },
        api_url: {
            let addr = listener.local_addr()?;
            let ip = if addr.ip().is_unspecified() {
                std::net::IpAddr::from([127, 0, 0, 1])
            } else {
                addr.ip()
            };
            format!("http://{}", SocketAddr::new(ip, addr.port()))
        },
        join_token: join_token.to_owned(),
        dir: std::path::absolute(config.data_dir.join("executors"))
            .unwrap_or_else(|_| config.data_dir.join("executors")),
        executor_cpus: config.provision_executor_cpus,
        executor_memory_mb: config.provision_executor_memory_mb,
        host_label: "local".into(),
        env: if config.object_store_options.is_empty() {
            Vec::new()
        } else {
            vec![(
                "TRAINYARD_OBJECT_STORE_OPTIONS".into(),
                config.object_store_options.join(","),
            )]
        },
    };
    if config.provisioner == config::ProvisionerKind::Slurm {
        return slurm_provisioner(config, local, db);
    }
    let max = config
        .provision_max_executors
        .min(local.fits(cpus, memory_mb));
    let on = config.local_provisioner();
    let settings = routes::provisioner::ProvisionerSettings {
        kind: if on { "local" } else { "none" }.into(),
        max_executors: if on { max } else { 0 },
        max_per_job: config.provision_max_per_job,
        idle_timeout_secs: config.provision_idle_timeout_secs,
        start_timeout_secs: config.provision_start_timeout_secs,
        cpu_budget: cpus,
        memory_budget_mb: memory_mb,
        executor_cpus: config.provision_executor_cpus,
        executor_memory_mb: config.provision_executor_memory_mb,
    };
    if !on || config.no_scheduler {
        return Ok((settings, None));
    }
    if !local.executor_bin.exists() {
        anyhow::bail!(
            "the local provisioner starts {}, which does not exist: build it (cargo build --bins), set --provision-executor-bin, or run with --provisioner none",
            local.executor_bin.display()
        );
    }
    tracing::info!(
        max_executors = max,
        executor_cpus = local.executor_cpus,
        executor_memory_mb = local.executor_memory_mb,
        "local provisioner: executors start on demand and go when idle"
    );
    let fleet = Fleet::new(
        db.clone(),
        Box::new(LocalProvisioner::new(local)),
        fleet_config(
            config,
            max,
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "localhost".into()),
        ),
    );
    Ok((settings, Some(fleet)))
}

/// The Slurm provisioner (`--provisioner slurm`): the local provisioner's
/// executor settings, submitted as Slurm batch jobs with the `--slurm-*`
/// settings. Its limit is `--provision-max-executors`: the cluster, not
/// this machine, holds the executors.
fn slurm_provisioner(
    config: &Config,
    local: LocalConfig,
    db: &PgPool,
) -> anyhow::Result<(routes::provisioner::ProvisionerSettings, Option<Fleet>)> {
    let cpus = (config.provision_executor_cpus.ceil() as u32).max(1);
    let max = config.provision_max_executors;
    let settings = routes::provisioner::ProvisionerSettings {
        kind: "slurm".into(),
        max_executors: max,
        max_per_job: config.provision_max_per_job,
        idle_timeout_secs: config.provision_idle_timeout_secs,
        start_timeout_secs: config.provision_start_timeout_secs,
        cpu_budget: f64::from(cpus * max),
        memory_budget_mb: config.provision_executor_memory_mb * u64::from(max),
        executor_cpus: f64::from(cpus),
        executor_memory_mb: config.provision_executor_memory_mb,
    };
    if config.no_scheduler {
        return Ok((settings, None));
    }
    let mut pass_env: Vec<String> = ["PATH", "LD_LIBRARY_PATH", "HOME", "RUST_LOG"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    pass_env.extend(config.slurm_export.iter().cloned());
    let slurm = SlurmConfig {
        executor_bin: local.executor_bin,
        api_url: config.slurm_api_url.clone().unwrap_or(local.api_url),
        join_token: local.join_token,
        dir: match &config.slurm_dir {
            Some(d) => std::path::absolute(d).unwrap_or_else(|_| d.clone()),
            None => local.dir,
        },
        partition: config.slurm_partition.clone(),
        account: config.slurm_account.clone(),
        qos: config.slurm_qos.clone(),
        time_limit: config.slurm_time_limit.clone(),
        gres: config.slurm_gres.clone(),
        cpus,
        memory_mb: config.provision_executor_memory_mb,
        gpu_memory_mb: 16_384,
        signal_secs: config.slurm_signal_secs,
        data_listen: config.slurm_data_listen.to_string(),
        comment: config.slurm_comment.clone(),
        extra_args: config.slurm_sbatch_args.clone(),
        env: local.env,
        pass_env,
    };
    // sbatch must answer here, or nothing could ever start.
    let probe = std::process::Command::new("sbatch")
        .arg("--version")
        .output()
        .context("the Slurm provisioner runs sbatch, which cannot be started here: install Slurm's client commands or run with --provisioner none")?;
    if !probe.status.success() {
        anyhow::bail!(
            "sbatch --version failed: {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        );
    }
    tracing::info!(
        max_executors = max,
        partition = slurm.partition.as_deref().unwrap_or("(default)"),
        cpus,
        memory_mb = slurm.memory_mb,
        "slurm provisioner: executors start as Slurm batch jobs on demand and go when idle"
    );
    let fleet = Fleet::new(
        db.clone(),
        Box::new(SlurmProvisioner::new(slurm)),
        // Jobs are the cluster's, not this machine's: any server with the
        // same comment adopts them after a restart.
        fleet_config(config, max, format!("slurm:{}", config.slurm_comment)),
    );
    Ok((settings, Some(fleet)))
}

/// The fleet settings every provisioner shares: at most `max` executors,
/// the configured per-job limit and timeouts, adopted by servers on `host`.
fn fleet_config(config: &Config, max: u32, host: String) -> FleetConfig {
    FleetConfig {
        limits: Limits {
            max_executors: max,
            max_per_job: config.provision_max_per_job,
            idle_timeout: Duration::from_secs(config.provision_idle_timeout_secs),
        },
        start_timeout: Duration::from_secs(config.provision_start_timeout_secs),
        stop_timeout: Duration::from_secs(60),
        host,
    }
}

fn available_memory_mb() -> Option<u64> {
    trainyard_common::host::available_memory().map(|b| b / (1024 * 1024))
}

/// The scheduler loop's settings from the server's.
pub fn scheduler_config(c: &Config) -> SchedulerConfig {
    SchedulerConfig {
        heartbeat_interval: Duration::from_millis(c.heartbeat_interval_ms),
        heartbeat_misses: c.heartbeat_misses,
        sharing: trainyard_scheduler::service::SharingConfig {
            half_life: Duration::from_secs(c.fair_share_half_life_secs),
            grace: Duration::from_secs(c.preemption_grace_secs),
            max_wait: Duration::from_secs(c.fair_share_max_wait_secs),
        },
    }
}

/// Resolves on SIGINT or SIGTERM (then the server drains its requests).
pub use trainyard_shutdown::termination as shutdown_signal;
