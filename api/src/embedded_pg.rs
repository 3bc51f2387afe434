//! A private Postgres cluster for the embedded default.
//!
//! When the API gets no `DATABASE_URL`, it runs its own cluster with the
//! machine's PostgreSQL binaries (`initdb`, `pg_ctl`; Debian keeps them in
//! `/usr/lib/postgresql/<major>/bin`): created on first start, started on a
//! free loopback port, stopped on shutdown, and reused when one from an
//! earlier run is still up. The cluster trusts local connections only (it
//! listens on 127.0.0.1 and a socket inside its folder).
//!
//! PostgreSQL refuses to run as root. Under root the cluster therefore runs
//! as the `postgres` user, in `<data-dir>/postgres` when that user can reach
//! it, else under `/var/lib/trainyard` (named after the data folder) — a
//! folder under root's home is not reachable by that user.

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};
use sqlx::Connection;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The superuser of the private cluster.
pub const SUPERUSER: &str = "trainyard";
/// The database the API uses in it.
pub const DATABASE: &str = "trainyard";
/// Where clusters of root-run servers live.
pub const ROOT_CLUSTERS: &str = "/var/lib/trainyard";

/// A running private cluster.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    dir: PathBuf,
    bin: PathBuf,
    run_as: Option<(u32, u32)>,
    port: u16,
    url: String,
}

impl EmbeddedPostgres {
    /// Creates (once) and starts the cluster for `data_dir`.
    pub async fn start(data_dir: &Path) -> anyhow::Result<EmbeddedPostgres> {
        let bin = find_bin_dir()?;
        let run_as = server_user()?;
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating {}", data_dir.display()))?;
        let abs = std::fs::canonicalize(data_dir)?;
        let dir = match run_as {
            // The postgres user can reach the data folder: keep the cluster
            // there, so removing the folder resets everything.
            Some(_) if reachable_by_others(&abs) => abs.join("postgres"),
            None => abs.join("postgres"),
            Some(_) => {
                let tag = hex::encode(&Sha256::digest(abs.to_string_lossy().as_bytes())[..6]);
                Path::new(ROOT_CLUSTERS).join(format!("postgres-{tag}"))
            }
        };
        let pg = EmbeddedPostgres {
            dir,
            bin,
            run_as,
            port: 0,
            url: String::new(),
        };
        let pg = tokio::task::spawn_blocking(move || pg.start_blocking()).await??;
        pg.ensure_database().await?;
        Ok(pg)
    }

    /// URL of the API's database in the cluster.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops the cluster (fast shutdown: open sessions are ended).
    pub async fn stop(self) -> anyhow::Result<()> {
        tokio::task::spawn_blocking(move || {
            let out = self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", "60"])?;
            if !out.status.success() {
                bail!(
                    "pg_ctl stop failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(())
        })
        .await?
    }

    fn start_blocking(mut self) -> anyhow::Result<Self> {
        if !self.dir.join("PG_VERSION").exists() {
            std::fs::create_dir_all(&self.dir)?;
            if let Some((uid, gid)) = self.run_as {
                std::os::unix::fs::chown(&self.dir, Some(uid), Some(gid))?;
            }
            tracing::info!(dir = %self.dir.display(), "creating a private Postgres cluster");
            let out = self
                .command("initdb")
                .args(["-D"])
                .arg(&self.dir)
                .args([
                    "-U",
                    SUPERUSER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C.UTF-8",
                ])
                .output()
                .context("running initdb")?;
            if !out.status.success() {
                bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        let port = match self.running_port() {
            Some(port) => {
                tracing::info!(
                    port,
                    "reusing the private Postgres cluster that is already running"
                );
                port
            }
            None => {
                let port = free_port()?;
                let opts = format!(
                    "-p {port} -k {} -c listen_addresses=127.0.0.1",
                    self.dir.display()
                );
                let log = self.dir.join("server.log");
                let out = self.pg_ctl(&[
                    "start",
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    &opts,
                    "-l",
                    &log.to_string_lossy(),
                ])?;
                if !out.status.success() {
                    let tail = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: Vec<&str> = tail.lines().rev().take(10).collect();
                    bail!(
                        "pg_ctl start failed: {}{}",
                        String::from_utf8_lossy(&out.stderr),
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    );
                }
                port
            }
        };
        self.port = port;
        self.url = format!("postgres://{SUPERUSER}@127.0.0.1:{port}/{DATABASE}");
        Ok(self)
    }

    /// The port of a cluster from an earlier run that is still up.
    fn running_port(&self) -> Option<u16> {
        let status = self.pg_ctl(&["status"]).ok()?;
        if !status.status.success() {
            return None;
        }
        let pid = std::fs::read_to_string(self.dir.join("postmaster.pid")).ok()?;
        pid.lines().nth(3)?.trim().parse().ok()
    }

    async fn ensure_database(&self) -> anyhow::Result<()> {
        let admin = format!("postgres://{SUPERUSER}@127.0.0.1:{}/postgres", self.port);
        let mut conn = connect_retrying(&admin).await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(DATABASE)
                .fetch_one(&mut conn)
                .await?;
        if !exists {
            sqlx::query(&format!("CREATE DATABASE {DATABASE}"))
                .execute(&mut conn)
                .await?;
        }
        conn.close().await?;
        Ok(())
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        // The postgres user may not be able to enter the caller's folder.
        cmd.current_dir("/");
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn pg_ctl(&self, args: &[&str]) -> anyhow::Result<Output> {
        self.command("pg_ctl")
            .arg("-D")
            .arg(&self.dir)
            .args(args)
            .output()
            .context("running pg_ctl")
    }
}

async fn connect_retrying(url: &str) -> anyhow::Result<sqlx::PgConnection> {
    let mut last = None;
    for _ in 0..50 {
        match sqlx::PgConnection::connect(url).await {
            Ok(c) => return Ok(c),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last.map_or_else(|| anyhow::anyhow!("cannot connect"), anyhow::Error::from))
        .context("connecting to the private Postgres cluster")
}

/// The folder holding `initdb` and `pg_ctl`: the newest Debian major
/// version, else wherever `PATH` has them. (The end-to-end tests' private
/// cluster uses it too.)
pub fn find_bin_dir() -> anyhow::Result<PathBuf> {
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((major, bin))
        })
        .collect();
    debian.sort();
    if let Some((_, bin)) = debian.pop() {
        return Ok(bin);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        if dir.join("initdb").exists() && dir.join("pg_ctl").exists() {
            return Ok(dir);
        }
    }
    bail!("PostgreSQL's initdb/pg_ctl not found; install PostgreSQL (Debian: apt-get install postgresql) or set DATABASE_URL")
}

/// Whether every folder above `dir` (and `dir` itself) can be entered by
/// other users, as the `postgres` user must.
fn reachable_by_others(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    dir.ancestors()
        .all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

/// The uid and gid a Postgres server started by this process must run as:
/// none (this process's own) unless this process is root, which PostgreSQL
/// refuses; then the `postgres` user's.
pub fn server_user() -> anyhow::Result<Option<(u32, u32)>> {
    if current_uid()? != 0 {
        return Ok(None);
    }
    postgres_user()
        .context("running as root, PostgreSQL needs the unprivileged `postgres` user")
        .map(Some)
}

fn current_uid() -> anyhow::Result<u32> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|uid| uid.parse().ok())
        .context("reading the effective uid")
}

fn postgres_user() -> anyhow::Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&"postgres") && f.len() > 3)
                .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
                .flatten()
        })
        .context("no `postgres` user in /etc/passwd")
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}
