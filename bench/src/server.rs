//! The release API as the whole-system benchmarks (`api-bench`,
//! `e2e-bench`) run it: a fresh database on the test Postgres server, the
//! `trainyard` binary beside the benchmark's own, production settings (no
//! provisioner), a scratch folder; stopped, folder and database removed, by
//! [`Server::stop`].

use anyhow::Context;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use trainyard_e2e::{drop_database, free_port, fresh_database, wait_ready, Proc};

/// A running API.
pub struct Server {
    /// The process.
    pub proc: Proc,
    /// Its database's URL.
    pub db: String,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its port.
    pub port: u16,
    /// Its scratch folder (data directory, executor caches).
    pub work: PathBuf,
}

impl Server {
    /// Starts `trainyard serve` for benchmark `tag` with join token `join`
    /// and the extra environment `env`, and waits until it is ready. Also
    /// points the e2e helpers at the binaries beside this one.
    pub fn start(tag: &str, join: &str, env: &[(&str, &str)]) -> anyhow::Result<Server> {
        let exe = std::env::current_exe()?;
        std::env::set_var(
            "TRAINYARD_BIN_DIR",
            exe.parent().context("no binary folder")?,
        );
        let work = std::env::temp_dir().join(format!("ty-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&work)?;
        let db = fresh_database()?;
        let port = free_port()?;
        let mut cmd = Command::new(trainyard_e2e::binary("trainyard")?);
        cmd.args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--provisioner",
            "none",
        ])
        .arg("--data-dir")
        .arg(work.join("data"))
        .env("DATABASE_URL", &db)
        .env("TRAINYARD_JOIN_TOKEN", join)
        .env_remove("TRAINYARD_API_TOKEN")
        .env_remove("TRAINYARD_ADMIN_TOKEN");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut proc = Proc::spawn(cmd)?;
        let url = format!("http://127.0.0.1:{port}");
        wait_ready(&format!("{url}/readyz"), &mut proc, Duration::from_secs(60))?;
        Ok(Server {
            proc,
            db,
            url,
            port,
            work,
        })
    }

    /// Stops the process (SIGTERM, then waits); the folder and the
    /// database stay.
    pub fn halt(&mut self) {
        if self.proc.running() && self.proc.terminate().is_ok() {
            let _ = self.proc.wait_exit(Duration::from_secs(60));
        }
    }

    /// Stops the server, removes its folder and drops its database.
    pub fn stop(mut self) {
        self.halt();
        let _ = std::fs::remove_dir_all(&self.work);
        drop_database(&self.db);
    }
}
