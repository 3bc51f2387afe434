//! `trainyard serve` on embedded defaults: it makes and starts its own
//! Postgres cluster, keeps jobs across a graceful restart, and stops the
//! cluster when it stops.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use trainyard_common::{EventKind, JobState};
use trainyard_e2e::{binary, example_digits, free_port, wait_ready, ApiClient, Proc};

fn serve(data_dir: &Path, port: u16) -> Proc {
    let mut cmd = Command::new(binary("trainyard").unwrap());
    cmd.args([
        "serve",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
    ])
    .arg(data_dir)
    .env_remove("DATABASE_URL")
    // These tests are about the server and its private cluster: no
    // executors are started for their jobs (tests/e2e/provisioner.rs tests
    // the embedded default's local provisioner).
    .env("TRAINYARD_PROVISIONER", "none")
    .env("TRAINYARD_LOG_FORMAT", "json");
    Proc::spawn(cmd).unwrap()
}

/// The `fields` of the first JSON log line whose message is `message`.
fn log_fields(output: &str, message: &str) -> Option<Value> {
    output
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["fields"]["message"] == message)
        .map(|v| v["fields"].clone())
}

struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

#[test]
fn embedded_server_keeps_jobs_across_a_graceful_restart() {
    let data = std::env::temp_dir().join(format!("trainyard-e2e-{}", std::process::id()));
    let mut cleanup = Cleanup(vec![data.clone()]);
    let port = free_port().unwrap();
    let api = format!("http://127.0.0.1:{port}");
    let client = ApiClient::at(&api, Duration::from_secs(10));

    let mut server = serve(&data, port);
    wait_ready(
        &format!("{api}/readyz"),
        &mut server,
        Duration::from_secs(120),
    )
    .unwrap();
    let pg = log_fields(&server.output(), "private Postgres cluster running")
        .unwrap_or_else(|| panic!("no cluster log line:\n{}", server.output()));
    let cluster_dir = PathBuf::from(pg["dir"].as_str().unwrap());
    cleanup.0.push(cluster_dir.clone());
    // The cluster listens only on the socket in its folder (postmaster.pid
    // names no TCP address), and the log names that socket, never the
    // password.
    let socket = PathBuf::from(pg["socket"].as_str().unwrap());
    assert!(socket.exists(), "{}", socket.display());
    let pid = std::fs::read_to_string(cluster_dir.join("postmaster.pid")).unwrap();
    assert_eq!(pid.lines().nth(5).map(str::trim), Some(""), "{pid}");
    let password =
        std::fs::read_to_string(cluster_dir.join(trainyard_api::embedded_pg::PASSWORD_FILE))
            .unwrap();
    assert!(!server.output().contains(password.trim()));
    assert!(
        server
            .output()
            .contains(&format!("UI:       http://127.0.0.1:{port}/")),
        "{}",
        server.output()
    );

    let (status, job) = client.post("/v1/jobs", &example_digits());
    assert_eq!(status, 201);
    let id = job["id"].as_str().unwrap().to_owned();

    server.terminate().unwrap();
    assert_eq!(
        server.wait_exit(Duration::from_secs(60)).unwrap(),
        Some(0),
        "{}",
        server.output()
    );
    assert!(
        !socket.exists(),
        "the private cluster still listens after shutdown"
    );

    let mut again = serve(&data, port);
    wait_ready(
        &format!("{api}/readyz"),
        &mut again,
        Duration::from_secs(120),
    )
    .unwrap();
    let got = client.job(&id);
    assert_eq!(got.id.to_string(), id);
    assert_eq!(got.state, JobState::Queued);
    assert_eq!(serde_json::to_value(&got.spec).unwrap(), job["spec"]);
    let events = client.event_page(&id, None, None);
    assert_eq!(events.events[0].kind, EventKind::Submitted);
    again.terminate().unwrap();
    assert_eq!(
        again.wait_exit(Duration::from_secs(60)).unwrap(),
        Some(0),
        "{}",
        again.output()
    );
}

#[test]
fn serve_with_an_unreachable_database_fails_clearly() {
    let port = free_port().unwrap();
    let dead = free_port().unwrap();
    let mut cmd = Command::new(binary("trainyard").unwrap());
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env(
            "DATABASE_URL",
            format!("postgres://nobody@127.0.0.1:{dead}/none"),
        )
        .env("TRAINYARD_DB_ACQUIRE_TIMEOUT_SECS", "2");
    let mut p = Proc::spawn(cmd).unwrap();
    let code = p.wait_exit(Duration::from_secs(60)).unwrap();
    assert_ne!(code, Some(0));
    assert!(
        p.output().contains("connecting to Postgres"),
        "{}",
        p.output()
    );
}
