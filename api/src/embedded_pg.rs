//! A private Postgres cluster for the embedded default.
//!
//! When the API gets no `DATABASE_URL`, it runs its own cluster with the
//! machine's PostgreSQL binaries (`initdb`, `pg_ctl`; Debian keeps them in
//! `/usr/lib/postgresql/<major>/bin`): created on first start, started with
//! the API, stopped on shutdown, and reused when one from an earlier run is
//! still up.
//!
//! The cluster holds the platform's own state, API tokens included, so a
//! user's script that gets past its sandbox must find nothing to talk to:
//! the cluster listens on no TCP address, only on a Unix socket inside its
//! folder (mode 0700), and even there it asks for a password (SCRAM). The
//! password is generated at `initdb` and kept in [`PASSWORD_FILE`] (mode
//! 0600) in the same folder; the URL the API connects with names the
//! socket's folder and carries the password. A cluster made by an older
//! Trainyard (trust auth, listening on 127.0.0.1) is moved onto the socket
//! and given a password at its next start.
//!
//! PostgreSQL refuses to run as root. Under root the cluster therefore runs
//! as the `postgres` user, in `<data-dir>/postgres` when that user can reach
//! it, else under `/var/lib/trainyard` (named after the data folder) — a
//! folder under root's home is not reachable by that user.

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
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
/// The file in the cluster's folder that holds the superuser's password.
pub const PASSWORD_FILE: &str = "trainyard-password";
/// Random bytes in a generated password (written as hex, so it needs no
/// escaping in a URL or in SQL).
const PASSWORD_BYTES: usize = 32;
/// Settings of ours, included from `postgresql.conf` and rewritten at every
/// start, so that a cluster started by hand (`pg_ctl start`) is as closed
/// as one the API starts.
const SETTINGS_FILE: &str = "trainyard.conf";
const INCLUDE_LINE: &str = "include_if_exists = 'trainyard.conf'";
/// The cluster's `pg_hba.conf`: a password for every connection over the
/// socket. No `host` lines: should TCP ever be switched on, every TCP
/// connection is refused outright.
const HBA: &str = "\
# Written by Trainyard (api/src/embedded_pg.rs). Every connection needs the
# password in trainyard-password; there are no host lines, so connections
# over TCP are refused even if the server were made to listen on it.
local   all             all                                     scram-sha-256
local   replication     all                                     scram-sha-256
";
/// The `pg_hba.conf` of the moment it takes to give a cluster made by an
/// older Trainyard a password: trust, over the socket in the private folder
/// only (whoever can reach that socket can read the password file too).
const HBA_SETTING_PASSWORD: &str = "\
# Written by Trainyard while it sets the superuser's password; replaced right after.
local   all             all                                     trust
";

/// A running private cluster.
#[derive(Clone)]
pub struct EmbeddedPostgres {
    dir: PathBuf,
    bin: PathBuf,
    run_as: Option<(u32, u32)>,
    port: u16,
    password: String,
    url: String,
}

impl std::fmt::Debug for EmbeddedPostgres {
    // The password and the URL that carries it stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedPostgres")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .field("run_as", &self.run_as)
            .finish_non_exhaustive()
    }
}

/// The postmaster of a running cluster, from its `postmaster.pid`.
struct Postmaster {
    pid: u32,
    port: u16,
    /// The first TCP address it listens on; empty when it listens on none.
    listen: String,
}

impl EmbeddedPostgres {
    /// Creates (once) and starts the cluster for `data_dir`.
    pub async fn start(data_dir: &Path) -> anyhow::Result<EmbeddedPostgres> {
        let bin = find_bin_dir()?;
        let run_as = server_user()?;
        let dir = cluster_dir(data_dir, run_as)?;
        let mut pg = EmbeddedPostgres {
            dir,
            bin,
            run_as,
            port: 0,
            password: String::new(),
            url: String::new(),
        };
        pg = tokio::task::spawn_blocking(move || -> anyhow::Result<Self> {
            pg.prepare()?;
            pg.run()?;
            Ok(pg)
        })
        .await??;
        pg.password = match pg.read_password()? {
            Some(password) if pg.read_hba()? == HBA => password,
            _ => pg.set_password().await?,
        };
        pg.url = pg.url_of(DATABASE);
        pg.ensure_database().await?;
        Ok(pg)
    }

    /// URL of the API's database in the cluster: the socket's folder (a
    /// `host` parameter), the port that names the socket, and the password.
    /// Secret: log [`EmbeddedPostgres::socket`] instead.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster's folder (its socket and password file are in it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The Unix socket the cluster listens on, its only way in.
    pub fn socket(&self) -> PathBuf {
        self.dir.join(format!(".s.PGSQL.{}", self.port))
    }

    /// The file holding the superuser's password.
    pub fn password_file(&self) -> PathBuf {
        self.dir.join(PASSWORD_FILE)
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

    /// Makes the cluster if there is none, keeps its folder private and
    /// writes our settings.
    fn prepare(&self) -> anyhow::Result<()> {
        if !self.dir.join("PG_VERSION").exists() {
            self.init()?;
        }
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private", self.dir.display()))?;
        let settings = format!(
            "# Written by Trainyard at every start (api/src/embedded_pg.rs); edits are lost.\n\
             # No TCP: the only way in is the socket in this folder.\n\
             listen_addresses = ''\n\
             unix_socket_directories = '{}'\n\
             unix_socket_permissions = 0700\n\
             password_encryption = 'scram-sha-256'\n",
            self.dir.to_string_lossy().replace('\'', "''")
        );
        if std::fs::read_to_string(self.dir.join(SETTINGS_FILE)).ok() != Some(settings.clone()) {
            write_private(&self.dir.join(SETTINGS_FILE), &settings, self.run_as)?;
        }
        let conf = self.dir.join("postgresql.conf");
        let text = std::fs::read_to_string(&conf)
            .with_context(|| format!("reading {}", conf.display()))?;
        if !text.lines().any(|l| l.trim() == INCLUDE_LINE) {
            // Appending keeps the file's owner (the postgres user under root).
            let mut f = std::fs::OpenOptions::new().append(true).open(&conf)?;
            writeln!(
                f,
                "\n# Trainyard's settings (no TCP, the socket's folder)\n{INCLUDE_LINE}"
            )?;
        }
        Ok(())
    }

    /// Runs `initdb` with a fresh password. It works in a staging folder
    /// beside the cluster's and renames it into place at the end, so that
    /// an interrupted first start leaves no cluster rather than one without
    /// its password file.
    fn init(&self) -> anyhow::Result<()> {
        let parent = self
            .dir
            .parent()
            .context("the cluster's folder has no parent")?;
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        // An older Trainyard made the folder before initdb; an empty one is
        // what a failed initdb left.
        match std::fs::remove_dir(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => bail!(
                "{} is not a Postgres cluster; move it away ({e})",
                self.dir.display()
            ),
            _ => {}
        }
        let name = self
            .dir
            .file_name()
            .context("the cluster's folder has no name")?;
        let staging = parent.join(format!("{}.initdb", name.to_string_lossy()));
        if staging.exists() {
            std::fs::remove_dir_all(&staging)
                .with_context(|| format!("removing {}", staging.display()))?;
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&staging)
            .with_context(|| format!("creating {}", staging.display()))?;
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::fs::chown(&staging, Some(uid), Some(gid))?;
        }
        let pwfile = staging.join(PASSWORD_FILE);
        write_private(&pwfile, &format!("{}\n", new_password()?), self.run_as)?;
        let data = staging.join("data");
        tracing::info!(dir = %self.dir.display(), "creating a private Postgres cluster");
        let out = self
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .arg(format!("--pwfile={}", pwfile.display()))
            .args([
                "-U",
                SUPERUSER,
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
            ])
            .output()
            .context("running initdb")?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&staging);
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::fs::rename(&pwfile, data.join(PASSWORD_FILE))?;
        write_private(&data.join("pg_hba.conf"), HBA, self.run_as)?;
        std::fs::rename(&data, &self.dir)
            .with_context(|| format!("moving the new cluster to {}", self.dir.display()))?;
        std::fs::remove_dir(&staging)?;
        Ok(())
    }

    /// Starts the cluster, or reuses the one running from an earlier run if
    /// it listens only on its socket; one an older Trainyard started on TCP
    /// is restarted.
    fn run(&mut self) -> anyhow::Result<()> {
        match self.running() {
            Some(pm) if pm.listen.is_empty() && self.socket_at(pm.port).exists() => {
                tracing::info!(
                    pid = pm.pid,
                    "reusing the private Postgres cluster that is already running"
                );
                // Makes whatever an interrupted start wrote (pg_hba.conf) live.
                self.pg_ctl(&["reload"])?;
                self.port = pm.port;
                return Ok(());
            }
            Some(pm) => {
                tracing::warn!(
                    pid = pm.pid,
                    listen = %pm.listen,
                    "restarting the private Postgres cluster, which listens on TCP, to move it onto its socket"
                );
                let out = self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", "60"])?;
                if !out.status.success() {
                    bail!(
                        "pg_ctl stop failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            None => {}
        }
        // No TCP listener: the number only names the socket. One that is
        // free on loopback keeps it from being mistaken for a server there.
        let port = free_port()?;
        // listen_addresses again on the command line: it outranks an
        // ALTER SYSTEM in postgresql.auto.conf.
        let opts = format!("-p {port} -c listen_addresses=''");
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
        self.port = port;
        Ok(())
    }

    /// Gives the superuser a password (the one in [`PASSWORD_FILE`], made
    /// now if there is none) and switches `pg_hba.conf` to asking for it:
    /// for a cluster an older Trainyard made with trust auth, or one whose
    /// password file is gone. The cluster already listens only on its
    /// socket. Each step may be repeated, so an interrupted run is finished
    /// by the next.
    async fn set_password(&self) -> anyhow::Result<String> {
        tracing::warn!(
            dir = %self.dir.display(),
            "the private Postgres cluster's password file or pg_hba.conf is not Trainyard's (made by an older Trainyard, which trusted local connections, or changed by hand): setting a password"
        );
        let pg = self.clone();
        let password = tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
            let password = match pg.read_password()? {
                Some(p) => p,
                None => {
                    let p = new_password()?;
                    write_private(&pg.password_file(), &format!("{p}\n"), pg.run_as)?;
                    p
                }
            };
            if pg.read_hba()? != HBA_SETTING_PASSWORD {
                write_private(&pg.dir.join("pg_hba.conf"), HBA_SETTING_PASSWORD, pg.run_as)?;
                pg.reload()?;
            }
            Ok(password)
        })
        .await??;

        let mut conn = connect_retrying(self.options("postgres", None)).await?;
        sqlx::query("SET password_encryption = 'scram-sha-256'")
            .execute(&mut conn)
            .await?;
        // Hex digits only: nothing to escape. (ALTER ROLE takes no bind
        // parameters; the connection logs no statements.)
        sqlx::query(&format!(
            "ALTER ROLE {SUPERUSER} WITH PASSWORD '{password}'"
        ))
        .execute(&mut conn)
        .await
        .context("setting the private cluster's password")?;
        conn.close().await?;

        let pg = self.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            write_private(&pg.dir.join("pg_hba.conf"), HBA, pg.run_as)?;
            pg.reload()
        })
        .await??;
        Ok(password)
    }

    /// The postmaster of the cluster, if it is running.
    fn running(&self) -> Option<Postmaster> {
        let status = self.pg_ctl(&["status"]).ok()?;
        if !status.status.success() {
            return None;
        }
        // Lines: pid, folder, start time, port, socket folder, first TCP
        // address (empty without one), shared memory key, status.
        let text = std::fs::read_to_string(self.dir.join("postmaster.pid")).ok()?;
        let lines: Vec<&str> = text.lines().collect();
        Some(Postmaster {
            pid: lines.first()?.trim().parse().ok()?,
            port: lines.get(3)?.trim().parse().ok()?,
            listen: lines.get(5).map_or("", |l| l.trim()).to_owned(),
        })
    }

    fn socket_at(&self, port: u16) -> PathBuf {
        self.dir.join(format!(".s.PGSQL.{port}"))
    }

    fn read_password(&self) -> anyhow::Result<Option<String>> {
        match std::fs::read_to_string(self.password_file()) {
            Ok(text) => {
                std::fs::set_permissions(
                    self.password_file(),
                    std::fs::Permissions::from_mode(0o600),
                )?;
                let password = text.trim().to_owned();
                Ok((!password.is_empty()).then_some(password))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).context("reading the private cluster's password file"),
        }
    }

    fn read_hba(&self) -> anyhow::Result<String> {
        let path = self.dir.join("pg_hba.conf");
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }

    fn reload(&self) -> anyhow::Result<()> {
        let out = self.pg_ctl(&["reload"])?;
        if !out.status.success() {
            bail!(
                "pg_ctl reload failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Options for database `db` over the socket, as the superuser.
    fn options(&self, db: &str, password: Option<&str>) -> PgConnectOptions {
        let options = PgConnectOptions::new()
            .socket(&self.dir)
            .port(self.port)
            .username(SUPERUSER)
            .database(db)
            .ssl_mode(PgSslMode::Disable)
            .disable_statement_logging();
        match password {
            Some(p) => options.password(p),
            None => options,
        }
    }

    fn url_of(&self, db: &str) -> String {
        let mut url = url::Url::parse("postgres://localhost").expect("a valid constant URL");
        let _ = url.set_username(SUPERUSER);
        let _ = url.set_password(Some(&self.password));
        let _ = url.set_port(Some(self.port));
        url.set_path(db);
        url.query_pairs_mut()
            .append_pair("host", &self.dir.to_string_lossy())
            .append_pair("sslmode", "disable");
        url.into()
    }

    async fn ensure_database(&self) -> anyhow::Result<()> {
        let mut conn = connect_retrying(self.options("postgres", Some(&self.password))).await?;
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

/// The cluster's folder for `data_dir` (made if missing) when the server
/// runs as `run_as`.
fn cluster_dir(data_dir: &Path, run_as: Option<(u32, u32)>) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let abs = std::fs::canonicalize(data_dir)?;
    Ok(match run_as {
        // The postgres user can reach the data folder: keep the cluster
        // there, so removing the folder resets everything.
        Some(_) if reachable_by_others(&abs) => abs.join("postgres"),
        None => abs.join("postgres"),
        Some(_) => {
            let tag = hex::encode(&Sha256::digest(abs.to_string_lossy().as_bytes())[..6]);
            Path::new(ROOT_CLUSTERS).join(format!("postgres-{tag}"))
        }
    })
}

/// A fresh password: [`PASSWORD_BYTES`] bytes of the kernel's randomness,
/// in hex.
fn new_password() -> anyhow::Result<String> {
    let mut bytes = [0u8; PASSWORD_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(hex::encode(bytes))
}

/// Writes `path` whole (through a temporary file and a rename), mode 0600,
/// owned by `run_as` when given.
fn write_private(path: &Path, contents: &str, run_as: Option<(u32, u32)>) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(&tmp, Some(uid), Some(gid))?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

async fn connect_retrying(options: PgConnectOptions) -> anyhow::Result<sqlx::PgConnection> {
    let mut last = None;
    for _ in 0..50 {
        match sqlx::PgConnection::connect_with(&options).await {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// A scratch data folder; dropping it stops its cluster and removes both.
    struct Scratch {
        data: PathBuf,
        cluster: EmbeddedPostgres,
    }

    impl Scratch {
        fn new() -> Scratch {
            let data = std::env::temp_dir().join(format!(
                "ty-embedded-pg-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            ));
            let run_as = server_user().unwrap();
            let cluster = EmbeddedPostgres {
                dir: cluster_dir(&data, run_as).unwrap(),
                bin: find_bin_dir().unwrap(),
                run_as,
                port: 0,
                password: String::new(),
                url: String::new(),
            };
            Scratch { data, cluster }
        }

        /// Makes and starts a cluster as Trainyard did before it had a
        /// password: trust auth, listening on 127.0.0.1.
        fn old_style_cluster(&self) -> u16 {
            let pg = &self.cluster;
            std::fs::create_dir_all(&pg.dir).unwrap();
            if let Some((uid, gid)) = pg.run_as {
                std::os::unix::fs::chown(&pg.dir, Some(uid), Some(gid)).unwrap();
            }
            let out = pg
                .command("initdb")
                .arg("-D")
                .arg(&pg.dir)
                .args(["-U", SUPERUSER, "--auth=trust", "--encoding=UTF8"])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let port = free_port().unwrap();
            let opts = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1",
                pg.dir.display()
            );
            let log = pg.dir.join("server.log");
            let out = pg
                .pg_ctl(&["start", "-w", "-o", &opts, "-l", &log.to_string_lossy()])
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            port
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = self
                .cluster
                .pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "60"]);
            let _ = std::fs::remove_dir_all(&self.cluster.dir);
            let _ = std::fs::remove_dir_all(&self.data);
        }
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    /// The TCP sockets process `pid` listens on (from /proc: its socket
    /// inodes, looked up in /proc/net/tcp and tcp6).
    fn tcp_listeners(pid: u32) -> Vec<String> {
        let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|l| {
                let l = l.to_string_lossy().into_owned();
                Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
            })
            .collect();
        assert!(!inodes.is_empty(), "the postmaster has no sockets at all?");
        ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|t| std::fs::read_to_string(t).ok())
            .flat_map(|t| t.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // Field 3 is the state (0A: listening), field 9 the inode.
                f.get(3) == Some(&"0A") && f.get(9).is_some_and(|i| inodes.contains(*i))
            })
            .collect()
    }

    /// What a client of the running cluster finds: no TCP, the socket
    /// refusing anyone without the password, the password file private.
    async fn assert_closed(pg: &EmbeddedPostgres) {
        let pm = pg.running().expect("the cluster runs");
        assert_eq!(pm.listen, "", "postmaster.pid names a TCP address");
        assert_eq!(tcp_listeners(pm.pid), Vec::<String>::new());
        assert!(std::net::TcpStream::connect(("127.0.0.1", pg.port)).is_err());
        assert!(pg.socket().exists());

        assert_eq!(mode(pg.dir()), 0o700);
        assert_eq!(mode(&pg.password_file()), 0o600);
        let password = std::fs::read_to_string(pg.password_file()).unwrap();
        assert_eq!(password.trim().len(), 2 * PASSWORD_BYTES);
        assert!(pg.url().contains(password.trim()));

        let refused = sqlx::PgConnection::connect_with(&pg.options(DATABASE, None)).await;
        assert!(refused.is_err(), "connected without a password");
        let wrong = pg.options(DATABASE, Some("not-the-password"));
        assert!(sqlx::PgConnection::connect_with(&wrong).await.is_err());
        let over_tcp = pg
            .url()
            .split('?')
            .next()
            .unwrap()
            .replace("localhost", "127.0.0.1");
        assert!(sqlx::PgConnection::connect(&over_tcp).await.is_err());

        let mut conn = sqlx::PgConnection::connect(pg.url()).await.unwrap();
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(one, 1);
        conn.close().await.unwrap();
    }

    #[tokio::test]
    async fn embedded_cluster_listens_only_on_its_socket_and_asks_for_a_password() {
        let scratch = Scratch::new();
        let pg = EmbeddedPostgres::start(&scratch.data).await.unwrap();
        assert_eq!(pg.dir(), scratch.cluster.dir);
        assert!(!format!("{pg:?}").contains(&pg.password));
        assert_closed(&pg).await;
        let url = pg.url().to_owned();

        // Reused while running; the same password after a stop and start.
        let again = EmbeddedPostgres::start(&scratch.data).await.unwrap();
        assert_eq!(again.url(), url);
        again.clone().stop().await.unwrap();
        let third = EmbeddedPostgres::start(&scratch.data).await.unwrap();
        assert_eq!(third.password, pg.password);
        assert_closed(&third).await;
    }

    #[tokio::test]
    async fn embedded_cluster_of_an_older_trainyard_gets_a_password_and_leaves_tcp() {
        let scratch = Scratch::new();
        let old_port = scratch.old_style_cluster();
        assert!(std::net::TcpStream::connect(("127.0.0.1", old_port)).is_ok());

        let pg = EmbeddedPostgres::start(&scratch.data).await.unwrap();
        assert!(std::net::TcpStream::connect(("127.0.0.1", old_port)).is_err());
        assert_eq!(pg.read_hba().unwrap(), HBA);
        assert_closed(&pg).await;

        // Nothing more to do at the next start.
        pg.clone().stop().await.unwrap();
        let again = EmbeddedPostgres::start(&scratch.data).await.unwrap();
        assert_eq!(again.password, pg.password);
        assert_closed(&again).await;
    }

    #[tokio::test]
    async fn embedded_cluster_without_its_password_file_gets_a_new_password() {
        let scratch = Scratch::new();
        let pg = EmbeddedPostgres::start(&scratch.data).await.unwrap();
        std::fs::remove_file(pg.password_file()).unwrap();
        let again = EmbeddedPostgres::start(&scratch.data).await.unwrap();
        assert_ne!(again.password, pg.password);
        assert_closed(&again).await;
    }
}
