//! Postgres for the end-to-end tests: a fresh database per test on the
//! shared test server (dropped again by the harness), or a cluster of one
//! test's own ([`TestPostgres`]) that the test may stop and start.

use crate::process::{free_port, tail};
use anyhow::{bail, Context};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::process::Command;

pub use trainyard_testdb::admin_url;

/// Makes a fresh database on the test server and returns its URL.
pub fn fresh_database() -> anyhow::Result<String> {
    Ok(trainyard_testdb::TestDatabase::fresh_blocking("ty_test").url)
}

/// Drops a database [`fresh_database`] made (`db` is its URL), sessions
/// and all; errors are ignored (a leftover is dropped by `scripts/test`).
pub fn drop_database(db: &str) {
    let name = db.split('?').next().unwrap_or(db);
    let name = name.rsplit('/').next().unwrap_or_default();
    trainyard_testdb::drop_database_blocking(name);
}

/// A Postgres cluster of one test's own, so the test may stop and start it
/// (the chaos suite restarts Postgres under a running API) without touching
/// the shared test server.
///
/// It is made with the machine's `initdb` and `pg_ctl` (the newest in
/// `/usr/lib/postgresql/*/bin`, else on `PATH`) in a private scratch folder
/// (mode 0700) under the system's temp folder, which also holds its socket
/// and its superuser's generated password (the only way in: SCRAM, no
/// trust, as the test suite's own server), and it listens on a free
/// loopback port that stays the same across restarts. PostgreSQL refuses
/// to run as root: under root (as CI runs) the cluster runs as the
/// `postgres` user, as the API's embedded cluster does. Dropping it stops
/// the cluster (immediate mode) and removes the folder.
pub struct TestPostgres {
    dir: PathBuf,
    data: PathBuf,
    bin: PathBuf,
    run_as: Option<(u32, u32)>,
    port: u16,
    password: String,
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
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
        }
        let pg = TestPostgres {
            data: dir.join("data"),
            dir,
            bin,
            run_as,
            port: free_port()?,
            // Hex: nothing to escape in a URL.
            password: uuid::Uuid::new_v4().simple().to_string(),
        };
        let pwfile = pg.dir.join("password");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&pwfile)
            .and_then(|mut f| writeln!(f, "{}", pg.password))
            .with_context(|| format!("writing {}", pwfile.display()))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid))?;
        }
        let out = pg
            .command("initdb")
            .arg("-D")
            .arg(&pg.data)
            .arg(format!("--pwfile={}", pwfile.display()))
            .args(["-U", "postgres", "--auth=scram-sha-256", "--encoding=UTF8"])
            .output()
            .context("running initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        pg.start_again()?;
        Ok(pg)
    }

    /// URL of database `db` in the cluster (as its superuser, with its
    /// password).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/{db}",
            self.password, self.port
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn psql_ok(url: &str) -> bool {
        Command::new("psql")
            .args([url, "-w", "-Atqc", "SELECT 1"])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    #[test]
    fn a_test_cluster_asks_for_its_password_across_restarts() {
        let pg = TestPostgres::start().unwrap();
        let db = pg.create_database("ty_check").unwrap();
        assert!(psql_ok(&db));
        let without = format!("postgres://postgres@127.0.0.1:{}/ty_check", pg.port());
        assert!(!psql_ok(&without), "connected without the password");
        let socket = format!("host={} port={} user=postgres", pg.dir.display(), pg.port());
        assert!(
            !psql_ok(&socket),
            "connected over the socket without the password"
        );
        pg.stop("fast").unwrap();
        pg.start_again().unwrap();
        assert!(psql_ok(&db));
    }
}
