//! `trainyard-executor`: the agent that runs training roles on one machine.
//!
//! `trainyard-executor --api URL --join-token T` registers this machine's
//! devices with the API, heartbeats, and runs the roles the scheduler
//! assigns to it (see the library's `agent` and `roles`). `--probe` only proves the
//! libtorch link: it prints, as JSON, the version and path of the libtorch
//! it loaded, whether CUDA is usable, and every device it sees.

use trainyard_executor::{control::agent, probe, sandbox};

use anyhow::Context;
use clap::Parser;
use std::collections::BTreeMap;
use trainyard_common::cluster::{DeviceInfo, ExecutorResources, RegisterRequest};
use trainyard_common::spec::Device;

/// Command-line flags of the executor.
#[derive(Debug, Parser)]
#[command(
    name = "trainyard-executor",
    version,
    about = "Trainyard executor agent (libtorch via tch)"
)]
struct Cli {
    /// Print libtorch's version and the devices it sees as JSON, then exit.
    #[arg(long)]
    probe: bool,

    /// Confine users' code (`on`, the default: refused where the kernel
    /// cannot confine it) or not (`off`: trusted single-user setups only).
    #[arg(long, env = "TRAINYARD_SANDBOX", value_enum, default_value = "on")]
    sandbox: sandbox::Mode,

    /// The unprivileged user that users' code runs as (an executor running
    /// as root should name one; it must be able to read libtorch). Without
    /// it, a root executor's children keep uid 0 with every capability
    /// dropped.
    #[arg(long, env = "TRAINYARD_SANDBOX_USER")]
    sandbox_user: Option<String>,

    /// Folder of the sandboxes' workspaces (default: a folder of this
    /// executor's under the system's temporary folder).
    #[arg(long, env = "TRAINYARD_SANDBOX_DIR")]
    sandbox_dir: Option<std::path::PathBuf>,

    /// Longest a model's inspection may take, and the longest one call of
    /// a training replica's model process (a step, an evaluation, a save)
    /// may take, in seconds.
    #[arg(long, env = "TRAINYARD_INSPECTION_TIMEOUT_SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    inspection_timeout_secs: u64,

    /// Base URL of the Trainyard API.
    #[arg(long, env = "TRAINYARD_API")]
    api: Option<String>,

    /// Cluster join token.
    #[arg(long, env = "TRAINYARD_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,

    /// Name shown in listings (default: the host name and data port).
    #[arg(long, env = "TRAINYARD_EXECUTOR_NAME")]
    name: Option<String>,

    /// Address of the data-plane listener (port 0 picks one).
    #[arg(long, env = "TRAINYARD_DATA_LISTEN", default_value = "127.0.0.1:0")]
    data_listen: std::net::SocketAddr,

    /// Host name or IP address peers reach this executor's data plane at
    /// (default: the listen address; set it when listening on 0.0.0.0,
    /// e.g. to the pod IP in Kubernetes).
    #[arg(long, env = "TRAINYARD_ADVERTISE_HOST")]
    advertise_host: Option<String>,

    /// RAM to offer in MiB (default: the machine's available memory).
    #[arg(long, env = "TRAINYARD_RAM_MB")]
    ram_mb: Option<u64>,

    /// Memory of each CUDA device to offer in MiB (libtorch does not report it).
    #[arg(long, env = "TRAINYARD_CUDA_MEMORY_MB", default_value_t = 16_384)]
    cuda_memory_mb: u64,

    /// Threads libtorch may use for one operation (default: libtorch's own
    /// choice, all cores). Several executors on one machine should share
    /// the cores: idle OpenMP threads spin and starve the other processes.
    #[arg(long, env = "TRAINYARD_TORCH_THREADS", value_parser = clap::value_parser!(i32).range(1..=1024))]
    torch_threads: Option<i32>,

    /// Labels, `key=value`, repeatable (`host=…` keeps ring ranks adjacent).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,

    /// A Python runtime script jobs may name, `NAME=PATH` to its
    /// interpreter (repeatable). `default` is the one a spec that names
    /// none gets: `$TRAINYARD_PYTHON`, else `python3` on the PATH.
    #[arg(long = "python", value_parser = parse_label)]
    pythons: Vec<(String, String)>,

    /// Object-store settings as KEY=VALUE (`aws_endpoint`, `aws_region`,
    /// `aws_access_key_id`, …; repeatable). The standard `AWS_*` variables
    /// are read too; these win.
    #[arg(
        long = "object-store-option",
        env = "TRAINYARD_OBJECT_STORE_OPTIONS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    object_store_options: Vec<String>,

    /// Local cache tier: checkpoint shards and dataset files kept on disk.
    /// Default: `$XDG_CACHE_HOME/trainyard/executor-cache/<name>`.
    #[arg(long, env = "TRAINYARD_CACHE_DIR")]
    cache_dir: Option<std::path::PathBuf>,

    /// Most bytes the local cache keeps, in MiB.
    #[arg(long, env = "TRAINYARD_CACHE_MB", default_value_t = 2048)]
    cache_mb: u64,

    /// The package index script jobs' own packages come from (their
    /// `script.requirements`); the install reaches this index and nothing
    /// else.
    #[arg(long, env = "TRAINYARD_PACKAGE_INDEX", default_value = trainyard_executor::script::packages::DEFAULT_INDEX)]
    package_index: String,

    /// Another host the index serves its files from, `HOST[:PORT]`
    /// (repeatable; `files.pythonhosted.org` goes with the public index).
    #[arg(long = "package-host")]
    package_hosts: Vec<String>,

    /// The uv binary that installs scripts' packages. Default: `uv` beside
    /// the default Python runtime, else on the PATH.
    #[arg(long, env = "TRAINYARD_UV")]
    uv: Option<std::path::PathBuf>,

    /// Where scripts' package environments are kept. Default: beside the
    /// cache tier's folder, `python-envs-<name>`.
    #[arg(long, env = "TRAINYARD_ENV_DIR")]
    env_dir: Option<std::path::PathBuf>,

    /// Most bytes scripts' package environments may take, in MiB (the
    /// least recently used ones not in use are removed first).
    #[arg(long, env = "TRAINYARD_ENV_CACHE_MB", default_value_t = 20 * 1024)]
    env_cache_mb: u64,

    /// Whether scripts see the host's C/C++ compiler and its headers
    /// (`on`, the default: `torch.compile` builds its kernels with them) or
    /// not (`off`: a compiled script's job fails, saying why).
    #[arg(
        long,
        env = "TRAINYARD_SCRIPT_COMPILER",
        value_enum,
        default_value = "on"
    )]
    script_compiler: Switch,

    /// Longest a drain (SIGTERM, SIGINT, SIGUSR1) may take, in seconds: the
    /// scheduler moving roles away, checkpoint uploads and report delivery.
    /// When it ends the executor exits, logging what the API did not
    /// receive; a second signal exits at once.
    #[arg(long, env = "TRAINYARD_SHUTDOWN_GRACE_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    shutdown_grace_secs: u64,

    /// Most memory, in MiB, a sharded dataset's loaded data may take in
    /// each role (shuffle windows, decoded shards, prefetched batches),
    /// where the job's `dataset.memory_mb` does not say.
    #[arg(long, env = "TRAINYARD_DATA_MEMORY_MB", default_value_t = trainyard_executor::data::DEFAULT_MEMORY_MB)]
    data_memory_mb: u64,
}

/// The data-plane address registered for peers: `host` (when given) with
/// the bound port.
fn advertised(bound: std::net::SocketAddr, host: Option<&str>) -> String {
    match host {
        Some(h) if h.contains(':') && !h.starts_with('[') => format!("[{h}]:{}", bound.port()),
        Some(h) => format!("{h}:{}", bound.port()),
        None => bound.to_string(),
    }
}

/// An on/off option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Switch {
    On,
    Off,
}

/// A `--label` or `--python` value without its `=`.
#[derive(Debug, thiserror::Error)]
#[error("expected key=value, got {0:?}")]
struct NotKeyValue(String);

fn parse_label(s: &str) -> Result<(String, String), NotKeyValue> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| NotKeyValue(s.to_owned()))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.probe {
        let report = probe::run()?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let (Some(api), Some(join_token)) = (cli.api.clone(), cli.join_token.clone()) else {
        anyhow::bail!("give --api URL and --join-token TOKEN to run as an agent, or --probe to check the libtorch link");
    };
    if cli.script_compiler == Switch::Off {
        trainyard_executor::script::toolchain::withhold();
    }
    if let Some(n) = cli.torch_threads {
        tch::set_num_threads(n);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let sandbox = std::sync::Arc::new(open_sandbox(&cli)?);
    let sandbox_report = sandbox.report();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let plane = std::sync::Arc::new(
        trainyard_dataplane::DataPlane::bind(cli.data_listen)
            .context("binding the data-plane listener")?,
    );
    let options =
        trainyard_store::parse_options(&cli.object_store_options).map_err(anyhow::Error::msg)?;
    let result = rt.block_on(async move {
        let address = advertised(plane.local_addr(), cli.advertise_host.as_deref());
        let name = cli.name.clone().unwrap_or_else(|| {
            format!(
                "{}:{}",
                hostname(),
                address.rsplit(':').next().unwrap_or("")
            )
        });
        let (cache_dir, env_dir) = folders(&cli, &name);
        trainyard_executor::script::packages::configure(
            trainyard_executor::script::packages::Config::new(
                cli.uv.clone(),
                sandbox.python(None)?,
                &cli.package_index,
                &cli.package_hosts,
                env_dir,
                cli.env_cache_mb,
            )
            .map_err(|e| anyhow::anyhow!("--package-index: {e}"))?,
        );
        let cache = trainyard_store::cache::Cache::open(&cache_dir, cli.cache_mb << 20)
            .with_context(|| format!("opening the local cache in {}", cache_dir.display()))?;
        tracing::info!(dir = %cache_dir.display(), bytes = cache.size(), "local cache tier");
        let registration = RegisterRequest {
            name,
            address,
            resources: resources(&cli)?,
            labels: cli.labels.iter().cloned().collect::<BTreeMap<_, _>>(),
            sandbox: Some(sandbox_report.clone()),
        };
        agent::run(agent::AgentConfig {
            api,
            join_token,
            registration,
            plane,
            fetcher: trainyard_executor::storage::Fetcher::new(
                options,
                std::sync::Arc::new(cache),
                tokio::runtime::Handle::current(),
            )
            .with_data_memory_mb(cli.data_memory_mb),
            sandbox,
            inspection_timeout: std::time::Duration::from_secs(cli.inspection_timeout_secs),
            grace: std::time::Duration::from_secs(cli.shutdown_grace_secs),
        })
        .await
        .context("the agent stopped")
    });
    // Spare script interpreters (and their cgroups) go with the executor.
    trainyard_executor::script::warm::spares().clear();
    trainyard_executor::script::relay::clear();
    // Whatever still runs on the runtime (a role thread stuck in libtorch,
    // a report the grace period gave up on) must not hold the exit.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// The sandbox users' code runs in, as the flags ask; its state said in
/// the log (loudly where it is off).
fn open_sandbox(cli: &Cli) -> anyhow::Result<sandbox::Sandbox> {
    let sandbox = sandbox::Sandbox::new(
        cli.sandbox,
        cli.sandbox_user.as_deref(),
        cli.sandbox_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("trainyard-sandbox-{}", std::process::id()))
        }),
        sandbox::child_program(&std::env::current_exe().context("finding this executable")?)?,
        cli.torch_threads,
    )?
    .with_pythons(
        cli.pythons
            .iter()
            .map(|(name, path)| (name.clone(), std::path::PathBuf::from(path))),
    );
    match (cli.sandbox, sandbox.refusal(), sandbox.script_refusal()) {
        (sandbox::Mode::Off, _, _) => tracing::warn!(
            "SANDBOX OFF: users' models and scripts run unconfined, with this executor's rights \
             over the host's files, and script ranks on the host's network (its loopback \
             services, the API, the database); only for a trusted single-user setup"
        ),
        (_, Some(why), _) => tracing::error!("users' code is refused: {why}"),
        (_, None, Some(why)) => {
            tracing::error!(sandbox = %sandbox.summary(), "script jobs are refused: {why}")
        }
        (_, None, None) => {
            tracing::info!(sandbox = %sandbox.summary(), "users' code is confined")
        }
    }
    Ok(sandbox)
}

/// The local cache tier's folder and the Python environments' folder
/// (beside it) of the executor `name`, unless the flags name them.
fn folders(cli: &Cli, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let cache_dir = cli.cache_dir.clone().unwrap_or_else(|| {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache"))
            })
            .unwrap_or_else(std::env::temp_dir);
        base.join("trainyard")
            .join("executor-cache")
            .join(name.replace(['/', ':'], "_"))
    });
    let env_dir = cli.env_dir.clone().unwrap_or_else(|| {
        cache_dir
            .parent()
            .unwrap_or(&cache_dir)
            .join(format!("python-envs-{}", name.replace(['/', ':'], "_")))
    });
    (cache_dir, env_dir)
}

fn resources(cli: &Cli) -> anyhow::Result<ExecutorResources> {
    let ram = match cli.ram_mb {
        Some(mb) => mb << 20,
        None => trainyard_common::host::available_memory().unwrap_or(1 << 30),
    };
    let mut devices = vec![DeviceInfo {
        kind: Device::Cpu,
        index: 0,
        name: "cpu".into(),
        memory_bytes: ram,
    }];
    if tch::Cuda::is_available() {
        for i in 0..tch::Cuda::device_count() {
            devices.push(DeviceInfo {
                kind: Device::Cuda,
                index: u32::try_from(i)?,
                name: format!("cuda:{i}"),
                memory_bytes: cli.cuda_memory_mb << 20,
            });
        }
    }
    Ok(ExecutorResources {
        devices,
        cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        ram_bytes: ram,
    })
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "executor".into(), |h| h.trim().to_owned())
}
