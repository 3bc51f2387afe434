//! Helpers of the end-to-end tests: find the built binaries, start them as
//! real processes on free loopback ports, wait for them, and signal them.
//!
//! The binaries come from the workspace's target folder (`cargo build
//! --workspace --bins` first; `scripts/test` does that), or from
//! `TRAINYARD_BIN_DIR` when set: the end-to-end benchmarks (`bench/`) use
//! these helpers with the release binaries.

use anyhow::{bail, Context};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Path of a built binary of the workspace: in `TRAINYARD_BIN_DIR` when
/// set, else in the target folder's `debug/`.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("TRAINYARD_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("target"))
            .join("debug"),
    };
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} is missing: run `cargo build --workspace --bins` first",
            path.display()
        );
    }
    Ok(path)
}

/// A free port on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A child process whose output is collected, killed when dropped.
pub struct Proc {
    child: Child,
    output: Arc<Mutex<String>>,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr captured.
    pub fn spawn(mut cmd: Command) -> anyhow::Result<Proc> {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning")?;
        let output = Arc::new(Mutex::new(String::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let out = output.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Ok(mut o) = out.lock() {
                        o.push_str(&line);
                        o.push('\n');
                    }
                }
            });
        }
        Ok(Proc { child, output })
    }

    /// Everything printed so far.
    pub fn output(&self) -> String {
        self.output.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// Sends SIGTERM (graceful shutdown).
    pub fn terminate(&self) -> anyhow::Result<()> {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?
            .success();
        if !ok {
            bail!("kill -TERM failed");
        }
        Ok(())
    }

    /// Waits up to `limit` for the process to exit and returns its code.
    pub fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<Option<i32>> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.code());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("still running after {limit:?}; output:\n{}", self.output())
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `url` until it answers 200 or `limit` passes (or `proc` exits).
pub fn wait_ready(url: &str, proc: &mut Proc, limit: Duration) -> anyhow::Result<()> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let start = Instant::now();
    while start.elapsed() < limit {
        if !proc.running() {
            bail!(
                "process exited before becoming ready; output:\n{}",
                proc.output()
            );
        }
        if client.get(url).send().is_ok_and(|r| r.status() == 200) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!(
        "{url} not ready after {limit:?}; output:\n{}",
        proc.output()
    )
}

/// The admin URL of the test Postgres server (as the API tests use).
pub fn admin_url() -> String {
    std::env::var("TRAINYARD_TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// Makes a fresh database with `psql` and returns its URL.
pub fn fresh_database() -> anyhow::Result<String> {
    let admin = admin_url();
    let name = format!("ty_test_{}", uuid::Uuid::new_v4().simple());
    let ok = Command::new("psql")
        .args([admin.as_str(), "-qc", &format!("CREATE DATABASE {name}")])
        .status()
        .context("running psql")?
        .success();
    if !ok {
        bail!("cannot create a database on {admin}");
    }
    let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
    Ok(format!("{base}/{name}"))
}

/// Drops a database [`fresh_database`] made (`db` is its URL), sessions
/// and all; errors are ignored (a leftover is dropped by `scripts/test`).
pub fn drop_database(db: &str) {
    let admin = admin_url();
    let name = db.rsplit('/').next().unwrap_or_default();
    let _ = Command::new("psql")
        .args([
            admin.as_str(),
            "-qc",
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        ])
        .status();
}

/// Sends SIGKILL to a process id.
pub fn kill9(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

impl Proc {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Polls `check` every 100 ms until it returns `Some` or `limit` passes.
pub fn eventually<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(v) = check() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// Starts `trainyard serve` on `port` against `db`, with its data in `data`,
/// the test heartbeat (200 ms, lost after `misses` silent beats), the join
/// token `join` and `extra` flags, and waits until it is ready.
pub fn start_server(
    db: &str,
    port: u16,
    data: &std::path::Path,
    join: &str,
    misses: u32,
    extra: &[&str],
) -> anyhow::Result<Proc> {
    start_server_env(db, port, data, join, misses, extra, &[])
}

/// [`start_server`] with the environment `env` added.
pub fn start_server_env(
    db: &str,
    port: u16,
    data: &std::path::Path,
    join: &str,
    misses: u32,
    extra: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(binary("trainyard")?);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args([
        "serve",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--heartbeat-interval-ms",
        "200",
        "--heartbeat-misses",
        &misses.to_string(),
    ])
    .args(extra)
    .arg("--data-dir")
    .arg(data)
    .env("DATABASE_URL", db)
    .env("TRAINYARD_JOIN_TOKEN", join);
    let mut api = Proc::spawn(cmd)?;
    wait_ready(
        &format!("http://127.0.0.1:{port}/readyz"),
        &mut api,
        Duration::from_secs(60),
    )?;
    Ok(api)
}

/// Starts `trainyard-executor` against the API at `api` with `ram_mb` of
/// RAM, one libtorch thread (several executors share this machine's cores,
/// and idle OpenMP threads spin) and the environment `env`. Its local cache
/// tier is a folder of this test process named after the executor (unless
/// `env` sets `TRAINYARD_CACHE_DIR`), so an executor restarted under the
/// same name finds its cache warm.
pub fn start_executor(
    api: &str,
    join: &str,
    name: &str,
    ram_mb: u32,
    env: &[(&str, &str)],
) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(binary("trainyard-executor")?);
    cmd.args([
        "--api",
        api,
        "--join-token",
        join,
        "--name",
        name,
        "--ram-mb",
        &ram_mb.to_string(),
        "--torch-threads",
        "1",
    ]);
    cmd.env(
        "TRAINYARD_CACHE_DIR",
        std::env::temp_dir().join(format!("ty-e2e-cache-{}-{name}", std::process::id())),
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc::spawn(cmd)
}

/// A small blocking JSON client of the API, for tests.
pub struct ApiClient {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    client: reqwest::blocking::Client,
}

impl ApiClient {
    /// A client of the API on `port`.
    pub fn new(port: u16) -> ApiClient {
        ApiClient {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("a reqwest client"),
        }
    }

    /// GET `path` as JSON (panics on a transport error or a non-JSON body).
    pub fn get(&self, path: &str) -> serde_json::Value {
        self.client
            .get(format!("{}{path}", self.base))
            .send()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .json()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// POST `body` to `path`: the status and the JSON answer.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = r.status().as_u16();
        (status, r.json().unwrap_or(serde_json::Value::Null))
    }

    /// Submits a job spec; its id (panics unless 201).
    pub fn submit(&self, spec: &serde_json::Value) -> String {
        let (status, body) = self.post("/v1/jobs", spec);
        assert_eq!(status, 201, "submit: {body}");
        body["id"].as_str().expect("an id").to_owned()
    }

    /// The names of the live executors.
    pub fn live_executors(&self) -> Vec<String> {
        self.get("/v1/executors?state=live")["executors"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The float32 tensors of a safetensors file at a `file://` URL (a job's
/// final weights), by name.
pub fn safetensors_f32(url: &str) -> std::collections::BTreeMap<String, Vec<f32>> {
    let path = url.strip_prefix("file://").unwrap_or(url);
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let off = v["data_offsets"].as_array().unwrap();
            let (a, b) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            let vals = data[a..b]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (k.clone(), vals)
        })
        .collect()
}

/// The last `n` lines of `text` (for failure messages).
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A Postgres cluster of one test's own, so the test may stop and start it
/// (the chaos suite restarts Postgres under a running API) without touching
/// the shared test server.
///
/// It is made with the machine's `initdb` and `pg_ctl` (the newest in
/// `/usr/lib/postgresql/*/bin`, else on `PATH`) in a scratch folder under
/// the system's temp folder, trusts local connections, and listens on a
/// free loopback port that stays the same across restarts. PostgreSQL
/// refuses to run as root: under root (as CI runs) the cluster runs as the
/// `postgres` user, as the API's embedded cluster does. Dropping it stops
/// the cluster (immediate mode) and removes the folder.
pub struct TestPostgres {
    dir: PathBuf,
    data: PathBuf,
    bin: PathBuf,
    run_as: Option<(u32, u32)>,
    port: u16,
}

/// How long `pg_ctl` may take to start or stop the cluster.
const PG_CTL_WAIT_SECS: &str = "60";

impl TestPostgres {
    /// Creates the cluster and starts it.
    pub fn start() -> anyhow::Result<TestPostgres> {
        let bin = trainyard_api::embedded_pg::find_bin_dir()?;
        let run_as = trainyard_api::embedded_pg::server_user()?;
        let dir = std::env::temp_dir().join(format!(
            "ty-test-pg-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
        }
        let pg = TestPostgres {
            data: dir.join("data"),
            dir,
            bin,
            run_as,
            port: free_port()?,
        };
        let out = pg
            .command("initdb")
            .arg("-D")
            .arg(&pg.data)
            .args(["-U", "postgres", "--auth=trust", "--encoding=UTF8"])
            .output()
            .context("running initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        pg.start_again()?;
        Ok(pg)
    }

    /// URL of database `db` in the cluster (as its superuser).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Makes database `name` and returns its URL.
    pub fn create_database(&self, name: &str) -> anyhow::Result<String> {
        let ok = Command::new("psql")
            .args([self.url("postgres").as_str(), "-qc"])
            .arg(format!("CREATE DATABASE {name}"))
            .status()
            .context("running psql")?
            .success();
        if !ok {
            bail!("cannot create database {name} on port {}", self.port);
        }
        Ok(self.url(name))
    }

    /// Stops the cluster and waits until it is down; `mode` is `pg_ctl`'s
    /// shutdown mode: `smart`, `fast` (sessions are ended, a clean
    /// checkpoint) or `immediate` (no checkpoint: crash recovery at the next
    /// start).
    pub fn stop(&self, mode: &str) -> anyhow::Result<()> {
        let out = self.pg_ctl(&["stop", "-m", mode, "-w", "-t", PG_CTL_WAIT_SECS])?;
        if !out.status.success() {
            bail!(
                "pg_ctl stop -m {mode} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Starts the (stopped) cluster again on the same port and waits until
    /// it accepts connections.
    pub fn start_again(&self) -> anyhow::Result<()> {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log");
        let out = self.pg_ctl(&[
            "start",
            "-w",
            "-t",
            PG_CTL_WAIT_SECS,
            "-o",
            &opts,
            "-l",
            &log.to_string_lossy(),
        ])?;
        if !out.status.success() {
            bail!(
                "pg_ctl start failed: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log_tail(20)
            );
        }
        Ok(())
    }

    /// The last `n` lines of the server's log.
    pub fn log_tail(&self, n: usize) -> String {
        tail(
            &std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default(),
            n,
        )
    }

    fn command(&self, program: &str) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(self.bin.join(program));
        // The postgres user may not be able to enter the caller's folder.
        cmd.current_dir("/");
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn pg_ctl(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        self.command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(args)
            .output()
            .context("running pg_ctl")
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", PG_CTL_WAIT_SECS]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
