//! The one end-to-end platform harness: a real `trainyard serve` process on
//! a free loopback port against a fresh Postgres database (or one the test
//! brings), with its objects in a scratch folder or the test S3 server, and
//! the executors a test starts against it.
//!
//! [`Platform::builder`] takes the options the tests differ in (join and
//! admin tokens, heartbeat misses, provisioner, object store, a private
//! database, extra flags and environment, what every executor gets); the
//! started [`Platform`] derefs to its [`ApiClient`], so `p.submit(..)` and
//! `p.wait_end(..)` read as the tests think of them. Dropping it stops the
//! server, removes its folder and drops the database it made.

use crate::client::ApiClient;
use crate::postgres::{drop_database, fresh_database};
use crate::process::{binary, free_port, kill9, start_executor, wait_ready, Proc};
use crate::s3::TestS3;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The heartbeat interval every test server runs with.
pub const HEARTBEAT_MS: u32 = 200;

/// How long a starting server may take to answer `/readyz`.
const READY_LIMIT: Duration = Duration::from_secs(60);

/// What a [`Platform`] is started with; see [`Platform::builder`].
#[derive(Clone)]
pub struct PlatformBuilder {
    label: String,
    join: String,
    misses: u32,
    database: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    executor_env: Vec<(String, String)>,
    executor_ram_mb: u32,
    client_timeout: Duration,
    host: Option<String>,
}

impl PlatformBuilder {
    /// The join token executors present (`TRAINYARD_JOIN_TOKEN`).
    pub fn join_token(mut self, token: &str) -> Self {
        token.clone_into(&mut self.join);
        self
    }

    /// The admin token the API requires (`--admin-token`).
    pub fn admin_token(self, token: &str) -> Self {
        self.arg("--admin-token").arg(token)
    }

    /// Heartbeats (of [`HEARTBEAT_MS`]) an executor may miss before it is
    /// lost (default 25: 5 s).
    pub fn heartbeat_misses(mut self, misses: u32) -> Self {
        self.misses = misses;
        self
    }

    /// No provisioner: executors are only those the test starts.
    pub fn no_provisioner(self) -> Self {
        self.arg("--provisioner").arg("none")
    }

    /// The local provisioner with a machine of `cpus` CPUs and `memory_mb`
    /// of RAM, starting executors of `executor_memory_mb` each; its other
    /// settings through [`PlatformBuilder::env`].
    pub fn local_provisioner(self, cpus: u32, memory_mb: u32, executor_memory_mb: u32) -> Self {
        self.env("TRAINYARD_PROVISIONER", "local")
            .env("TRAINYARD_PROVISION_CPUS", &cpus.to_string())
            .env("TRAINYARD_PROVISION_MEMORY_MB", &memory_mb.to_string())
            .env(
                "TRAINYARD_PROVISION_EXECUTOR_MEMORY_MB",
                &executor_memory_mb.to_string(),
            )
    }

    /// Objects (checkpoints, weights) go to `s3` instead of the data
    /// folder: the API gets the AWS variables, every executor the store
    /// options.
    pub fn s3(mut self, s3: &TestS3) -> Self {
        self = self.arg("--object-store").arg(&s3.url);
        for (k, v) in s3.aws_env() {
            self = self.env(k, &v);
        }
        self.executor_env("TRAINYARD_OBJECT_STORE_OPTIONS", &s3.options())
    }

    /// The database `url` instead of a fresh one (not dropped at the end).
    pub fn database(mut self, url: &str) -> Self {
        self.database = Some(url.to_owned());
        self
    }

    /// One more flag of `trainyard serve`.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_owned());
        self
    }

    /// One more variable of the server's environment.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// One more variable of every executor's environment.
    pub fn executor_env(mut self, key: &str, value: &str) -> Self {
        self.executor_env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The RAM [`Platform::executor`] offers (default 2048 MiB).
    pub fn executor_ram_mb(mut self, mb: u32) -> Self {
        self.executor_ram_mb = mb;
        self
    }

    /// The timeout of the platform's client's requests (default 10 s).
    pub fn client_timeout(mut self, timeout: Duration) -> Self {
        self.client_timeout = timeout;
        self
    }

    /// Binds the API to `host` instead of 127.0.0.1 (a lab's gateway
    /// address, [`crate::Lab::gateway`]).
    pub fn listen_host(mut self, host: &str) -> Self {
        self.host = Some(host.to_owned());
        self
    }

    /// Starts the server and waits until it is ready (panics if it is not).
    pub fn start(self) -> Platform {
        let (database, own_database) = match &self.database {
            Some(url) => (url.clone(), false),
            None => (fresh_database().expect("a fresh database"), true),
        };
        let port = free_port().expect("a free port");
        let data = std::env::temp_dir().join(format!(
            "trainyard-{}-{}-{port}",
            self.label,
            std::process::id()
        ));
        let server = self.spawn_server(&database, port, &data);
        Platform {
            server,
            client: ApiClient::at(
                &format!("http://{}:{port}", self.host()),
                self.client_timeout,
            ),
            port,
            db: database,
            data,
            own_database,
            options: self,
        }
    }

    fn host(&self) -> &str {
        self.host.as_deref().unwrap_or("127.0.0.1")
    }

    fn spawn_server(&self, db: &str, port: u16, data: &std::path::Path) -> Proc {
        let mut cmd = Command::new(binary("trainyard").expect("the trainyard binary"));
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .args([
                "serve",
                "--listen",
                &format!("{}:{port}", self.host()),
                "--heartbeat-interval-ms",
                &HEARTBEAT_MS.to_string(),
                "--heartbeat-misses",
                &self.misses.to_string(),
            ])
            .args(&self.args)
            .arg("--data-dir")
            .arg(data)
            .env("DATABASE_URL", db)
            .env("TRAINYARD_JOIN_TOKEN", &self.join);
        let mut server = Proc::spawn(cmd).expect("spawning trainyard serve");
        wait_ready(
            &format!("http://{}:{port}/readyz", self.host()),
            &mut server,
            READY_LIMIT,
        )
        .unwrap_or_else(|e| panic!("trainyard serve: {e}"));
        server
    }
}

/// A running API server and what it needs; see the module's doc.
pub struct Platform {
    /// The `trainyard serve` process.
    pub server: Proc,
    /// A client of it.
    pub client: ApiClient,
    /// Its port (on 127.0.0.1, or the host [`PlatformBuilder::listen_host`] gave).
    pub port: u16,
    /// The URL of its database.
    pub db: String,
    /// Its data folder (objects, unless they go to S3).
    pub data: PathBuf,
    own_database: bool,
    options: PlatformBuilder,
}

impl Platform {
    /// The options of a platform named `label` (its folder's name): a fresh
    /// database, heartbeats lost after 25 misses, no tokens, the default
    /// provisioner, objects in the data folder, 2 GiB executors.
    pub fn builder(label: &str) -> PlatformBuilder {
        PlatformBuilder {
            label: label.to_owned(),
            join: format!("e2e-{label}-token"),
            misses: 25,
            database: None,
            args: Vec::new(),
            env: Vec::new(),
            executor_env: Vec::new(),
            executor_ram_mb: 2048,
            client_timeout: Duration::from_secs(10),
            host: None,
        }
    }

    /// The join token of its executors.
    pub fn join_token(&self) -> &str {
        &self.options.join
    }

    /// Starts an executor named `name` with the platform's RAM and
    /// environment for executors.
    pub fn executor(&self, name: &str) -> Proc {
        self.executor_with(name, self.options.executor_ram_mb, &[])
    }

    /// Starts an executor named `name` offering `ram_mb`, with `env` added
    /// to the platform's environment for executors.
    pub fn executor_with(&self, name: &str, ram_mb: u32, env: &[(&str, &str)]) -> Proc {
        let mut all: Vec<(&str, &str)> = self
            .options
            .executor_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        all.extend_from_slice(env);
        start_executor(&self.client.base, &self.options.join, name, ram_mb, &all)
            .unwrap_or_else(|e| panic!("starting executor {name}: {e}"))
    }

    /// The path `name` in the data folder (which is made if missing), for
    /// files a test hands to the platform.
    pub fn file(&self, name: &str) -> PathBuf {
        std::fs::create_dir_all(&self.data)
            .unwrap_or_else(|e| panic!("creating {}: {e}", self.data.display()));
        self.data.join(name)
    }

    /// SIGKILLs the server, waits `down`, and starts it again on the same
    /// port against the same database; the killed process (its output).
    pub fn crash_api(&mut self, down: Duration) -> Proc {
        kill9(self.server.pid());
        let _ = self.server.wait_exit(Duration::from_secs(10));
        std::thread::sleep(down);
        let again = self.options.spawn_server(&self.db, self.port, &self.data);
        std::mem::replace(&mut self.server, again)
    }

    /// SIGKILLs the server and leaves it down, until [`Platform::start_api`].
    pub fn stop_api(&mut self) {
        kill9(self.server.pid());
        let _ = self.server.wait_exit(Duration::from_secs(10));
    }

    /// Starts the server again on its port against its database (after
    /// [`Platform::stop_api`]).
    pub fn start_api(&mut self) {
        self.server = self.options.spawn_server(&self.db, self.port, &self.data);
    }

    /// A second server with the same options against the same database, on
    /// a port (and in a folder) of its own; it leaves the database to this
    /// one.
    pub fn another_api(&self) -> Platform {
        self.options.clone().database(&self.db).start()
    }
}

/// A platform is used through its client: `p.get(..)`, `p.submit(..)`.
impl std::ops::Deref for Platform {
    type Target = ApiClient;

    fn deref(&self) -> &ApiClient {
        &self.client
    }
}

impl Drop for Platform {
    fn drop(&mut self) {
        self.server.kill();
        let _ = std::fs::remove_dir_all(&self.data);
        if self.own_database {
            drop_database(&self.db);
        }
    }
}
