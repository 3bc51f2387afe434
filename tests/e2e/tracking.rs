//! Experiment tracking with the real trackers: a real `mlflow server`
//! (SQLite store, artifacts served by the server, on a free loopback port)
//! receives a ring job's run (its experiment named in the spec), a PS
//! job's and a script job's (the server's default experiment), and
//! MLflow's own Python client reads back the spec's params, the tags,
//! EVERY step metric the metrics API shows (asked for undownsampled; a
//! script's are what it gave `trainyard.report()`) and the model, byte for
//! byte what `GET /v1/jobs/{id}/model` serves (a script job's outputs, as
//! `/v1/jobs/{id}/outputs/…` serves them), across a restart of the API
//! server mid-run; TensorBoard's `EventAccumulator`
//! reads `GET /v1/jobs/{id}/tensorboard` back to the same points. A job
//! logged to a closed port trains to success all the same, with a
//! `tracking` warning event.
//!
//! MLflow and TensorBoard live in a venv of their own
//! (`scripts/tracking.sh`), found through `TRAINYARD_TRACKING_PYTHON`,
//! which `scripts/test` exports.

use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use trainyard_common::api::MetricSample;
use trainyard_common::event::TrackingWarning;
use trainyard_common::{EventData, EventKind, JobState};
use trainyard_e2e::script_jobs::{scripts_dir, split_digits};
use trainyard_e2e::{
    eventually, free_port, repo_root, run_ok, tail, Consistency, MlpSpec, Platform, Proc,
};

/// The tracking venv's Python.
fn tracking_python() -> PathBuf {
    let py = std::env::var_os("TRAINYARD_TRACKING_PYTHON").unwrap_or_else(|| {
        panic!(
            "TRAINYARD_TRACKING_PYTHON is not set: run ./scripts/test, or `source scripts/common.sh; source scripts/tracking.sh; ensure_tracking`"
        )
    });
    PathBuf::from(py)
}

/// A real MLflow tracking server in a folder of its own, stopped (its whole
/// process group: it runs its web server as a child) when dropped.
struct MlflowServer {
    proc: Proc,
    uri: String,
    dir: PathBuf,
}

impl MlflowServer {
    fn start(label: &str) -> MlflowServer {
        let python = tracking_python();
        let dir =
            std::env::temp_dir().join(format!("trainyard-mlflow-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port().unwrap();
        let mut cmd = Command::new(python.with_file_name("mlflow"));
        cmd.args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--artifacts-destination")
            .arg(dir.join("artifacts"))
            .args(["--serve-artifacts", "--workers", "1"])
            .env("MLFLOW_DISABLE_TELEMETRY", "true")
            .current_dir(&dir)
            .process_group(0);
        let mut proc = Proc::spawn(cmd).expect("starting mlflow server");
        let uri = format!("http://127.0.0.1:{port}");
        let health = format!("{uri}/health");
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let up = eventually(Duration::from_secs(180), || {
            assert!(
                proc.running(),
                "mlflow server exited:\n{}",
                tail(&proc.output(), 40)
            );
            http.get(&health)
                .send()
                .ok()
                .filter(|r| r.status().is_success())
        });
        assert!(
            up.is_some(),
            "mlflow server did not answer {health}:\n{}",
            tail(&proc.output(), 40)
        );
        MlflowServer { proc, uri, dir }
    }

    /// The run of job `id` as MLflow's client reads it (waiting for it to
    /// end), with the model downloaded under the server's folder.
    fn run_of(&self, id: &str) -> Value {
        let out = self.dir.join(format!("download-{id}"));
        std::fs::create_dir_all(&out).unwrap();
        let o = run_ok(
            Command::new(tracking_python())
                .arg(repo_root().join("tests/python/tracking_read.py"))
                .args(["mlflow", &self.uri, id])
                .arg(&out)
                .env("MLFLOW_DISABLE_TELEMETRY", "true"),
            "tracking_read.py mlflow",
        );
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&o.stdout));
        })
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.proc.pid())])
            .status();
        self.proc.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Rank 0's stored steps as the metrics API gives them, every one.
fn every_point(p: &Platform, id: &str) -> Vec<MetricSample> {
    let series = p.metrics(id, Some(10_000));
    assert!(!series.downsampled);
    assert_eq!(series.points.len() as i64, series.steps_recorded);
    assert!(series.steps_recorded > 0);
    series.points
}

/// The (step, value) pairs of each metric, by its MLflow key.
fn by_key(points: &[MetricSample]) -> Vec<(&'static str, Vec<(i64, f64)>)> {
    type Get = fn(&MetricSample) -> Option<f64>;
    let keys: [(&str, Get); 8] = [
        ("loss", |m| Some(m.loss)),
        ("lr", |m| Some(m.lr)),
        ("samples_per_sec", |m| Some(m.samples_per_sec)),
        ("data_seconds", |m| Some(m.data_seconds)),
        ("compute_seconds", |m| Some(m.compute_seconds)),
        ("comm_seconds", |m| Some(m.comm_seconds)),
        ("eval_loss", |m| m.eval_loss),
        ("eval_accuracy", |m| m.eval_accuracy),
    ];
    keys.iter()
        .map(|(k, get)| {
            (
                *k,
                points
                    .iter()
                    .filter_map(|m| get(m).map(|v| (m.step, v)))
                    .collect(),
            )
        })
        .collect()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    a == b || (a - b).abs() <= rel * a.abs().max(b.abs())
}

/// Checks MLflow's run of job `id` against what Trainyard shows.
fn check_run(p: &Platform, mlflow: &MlflowServer, id: &str, experiment: &str, pattern: &str) {
    let job = p.job(id);
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let run = mlflow.run_of(id);
    assert_eq!(run["status"], "FINISHED", "{run}");
    assert_eq!(run["experiment"], experiment);
    assert_eq!(run["run_name"], job.name.as_str());

    // Params: the spec, flattened.
    let params = &run["params"];
    assert_eq!(params["name"], job.name.as_str());
    assert_eq!(params["optimizer.kind"], "adam");
    assert_eq!(params["optimizer.lr"], "0.003");
    assert_eq!(params["model.hidden"], "[64]");
    assert_eq!(params["batch_size"], "32");
    assert_eq!(params["workers.min"], "2");

    // Tags: who and what.
    let tags = &run["tags"];
    assert_eq!(tags["trainyard.job_id"], id);
    assert_eq!(tags["trainyard.owner"], job.owner.as_str());
    assert_eq!(tags["trainyard.strategy"], pattern);
    assert_eq!(tags["trainyard.generation"], job.generation.to_string());
    if pattern == "parameter_server" {
        assert_eq!(tags["trainyard.consistency"], "sync");
    }

    check_metrics(p, &run, id);
    assert!(
        !run["metrics"]["eval_accuracy"]
            .as_array()
            .unwrap()
            .is_empty(),
        "the job evaluated"
    );

    // The model: the very bytes GET /v1/jobs/{id}/model serves.
    let served = p
        .get_response(&format!("/v1/jobs/{id}/model"))
        .bytes()
        .unwrap();
    let downloaded = std::fs::read(run["model"].as_str().expect("a model artifact")).unwrap();
    assert!(!served.is_empty());
    assert!(served[..] == downloaded[..], "the model artifact differs");
}

/// MLflow's `run` holds every point of every metric of job `id`, as the
/// metrics API has it (and no metric the job has no point of).
fn check_metrics(p: &Platform, run: &Value, id: &str) {
    let points = every_point(p, id);
    for (key, want) in by_key(&points) {
        if want.is_empty() {
            assert!(run["metrics"][key].is_null(), "{key}: {}", run["metrics"]);
            continue;
        }
        let got: Vec<(i64, f64)> = run["metrics"][key]
            .as_array()
            .unwrap_or_else(|| panic!("no metric {key} in {}", run["metrics"]))
            .iter()
            .map(|m| (m[0].as_i64().unwrap(), m[1].as_f64().unwrap()))
            .collect();
        assert_eq!(got.len(), want.len(), "{key}: {got:?} vs {want:?}");
        for ((gs, gv), (ws, wv)) in got.iter().zip(&want) {
            assert_eq!(gs, ws, "{key}");
            assert!(close(*gv, *wv, 1e-12), "{key} at step {ws}: {gv} vs {wv}");
        }
    }
}

/// A script job's run: its spec, what it reported with
/// `trainyard.report()`, and its outputs as artifacts, byte for byte what
/// `GET /v1/jobs/{id}/outputs/model.pt` serves.
fn check_script_run(p: &Platform, mlflow: &MlflowServer, id: &str) {
    let job = p.job(id);
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let run = mlflow.run_of(id);
    assert_eq!(run["status"], "FINISHED", "{run}");
    assert_eq!(run["experiment"], "trainyard-e2e");
    assert_eq!(run["tags"]["trainyard.job_id"], id);
    assert_eq!(run["params"]["script.code"], "artifact:train.py", "{run}");
    assert!(
        run["params"]["script.args"]
            .as_str()
            .is_some_and(|a| a.contains("--epochs")),
        "{run}"
    );
    // One report a epoch, loss and lr among them.
    let steps: Vec<i64> = every_point(p, id).iter().map(|m| m.step).collect();
    assert_eq!(steps, [1, 2, 3]);
    check_metrics(p, &run, id);
    assert!(
        run["model"].is_null(),
        "a script job has no model.safetensors"
    );
    let outputs = PathBuf::from(
        run["outputs"]
            .as_str()
            .expect("an outputs/ artifact folder"),
    );
    let served = p
        .get_response(&format!("/v1/jobs/{id}/outputs/model.pt"))
        .bytes()
        .unwrap();
    assert!(!served.is_empty());
    let logged = std::fs::read(outputs.join("model.pt")).unwrap();
    assert!(served[..] == logged[..], "the outputs artifact differs");
}

/// Uploads the DDP digits script and its training rows as artifacts and
/// submits it as a one-rank script job of 3 epochs.
fn submit_script(p: &Platform) -> String {
    let (train, _) = split_digits(p);
    p.upload("train.py", &scripts_dir().join("ddp_digits.py"));
    p.upload("digits-train.npz", &train);
    p.submit(&serde_json::json!({
        "name": "tracked-script",
        "script": {"code": "artifact:train.py", "args": ["--epochs", "3"]},
        "inputs": ["artifact:digits-train.npz"],
        "workers": {"min": 1, "max": 1},
        "resources": {"memory_mb": 1024},
    }))
}

/// Job `id`'s TensorBoard file, read back by TensorBoard's own reader,
/// holds the metrics API's points.
fn check_tensorboard(p: &Platform, id: &str, dir: &Path) {
    let r = p.get_response(&format!("/v1/jobs/{id}/tensorboard"));
    assert_eq!(r.status(), 200);
    let disposition = r.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .to_owned();
    let name = disposition
        .split("filename=\"")
        .nth(1)
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{disposition}"))
        .to_owned();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    let folder = dir.join(format!("tb-{id}"));
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join(&name), r.bytes().unwrap()).unwrap();
    let o = run_ok(
        Command::new(tracking_python())
            .arg(repo_root().join("tests/python/tracking_read.py"))
            .arg("tensorboard")
            .arg(&folder),
        "tracking_read.py tensorboard",
    );
    let read: Value = serde_json::from_slice(&o.stdout).unwrap();
    let points = every_point(p, id);
    for (key, want) in by_key(&points) {
        let tag = match key {
            "eval_loss" => "eval/loss".to_owned(),
            "eval_accuracy" => "eval/accuracy".to_owned(),
            k => format!("train/{k}"),
        };
        if want.is_empty() {
            assert!(read[&tag].is_null(), "{tag} has no points");
            continue;
        }
        let got: Vec<(i64, f64)> = read[&tag]
            .as_array()
            .unwrap_or_else(|| panic!("no tag {tag} in the event file"))
            .iter()
            .map(|e| (e[0].as_i64().unwrap(), e[1].as_f64().unwrap()))
            .collect();
        assert_eq!(got.len(), want.len(), "{tag}");
        for ((gs, gv), (ws, wv)) in got.iter().zip(&want) {
            assert_eq!(gs, ws, "{tag}");
            // Event files hold 32-bit floats (and serde_json's parsing
            // of a printed double may be off by an ulp).
            let want = f64::from(*wv as f32);
            assert!(
                close(*gv, want, 1e-12),
                "{tag} at step {ws}: {gv} vs {want}"
            );
        }
    }
}

#[test]
fn ring_ps_and_script_jobs_log_params_every_metric_and_their_model_to_mlflow() {
    let mlflow = MlflowServer::start("jobs");
    let mut p = Platform::builder("tracking")
        .env("TRAINYARD_MLFLOW_URI", &mlflow.uri)
        .env("TRAINYARD_MLFLOW_EXPERIMENT", "trainyard-e2e")
        .start();
    let _execs: Vec<Proc> = (0..3)
        .map(|i| p.executor(&format!("tracked-{i}")))
        .collect();
    let mut ring = MlpSpec::digits("tracked-ring")
        .batch_size(32)
        .epochs(8)
        .workers(2, 2)
        .seed(5)
        .build();
    ring["tracking"] =
        serde_json::json!({"mlflow": {"uri": mlflow.uri, "experiment": "ring runs"}});
    let ps = MlpSpec::digits("tracked-ps")
        .batch_size(32)
        .epochs(5)
        .workers(2, 2)
        .ps(1)
        .consistency(Consistency::Sync)
        .seed(5)
        .build();
    let ring = p.submit(&ring);
    let ps = p.submit(&ps);
    let script = submit_script(&p);
    // The API restarts (gracefully) while the ring job trains: its export
    // goes on from the cursor it committed, nothing sent twice or lost.
    p.wait_steps(&ring, 40, Duration::from_secs(300));
    p.server.terminate().unwrap();
    p.server.wait_exit(Duration::from_secs(60)).unwrap();
    p.start_api();
    for id in [&ring, &ps, &script] {
        let job = p.wait_end(id, Duration::from_secs(600));
        assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    }
    // More steps than one batch of the export (125 steps of 8 metrics).
    assert!(p.steps_recorded(&ring) > 125);
    check_run(&p, &mlflow, &ring, "ring runs", "allreduce");
    check_run(&p, &mlflow, &ps, "trainyard-e2e", "parameter_server");
    check_script_run(&p, &mlflow, &script);
    for id in [&ring, &ps, &script] {
        check_tensorboard(&p, id, &mlflow.dir);
        // Nothing went wrong on the way.
        let warnings: Vec<_> = p
            .events(id)
            .into_iter()
            .filter(|e| e.kind == EventKind::Tracking)
            .map(|e| e.reason)
            .collect();
        assert!(warnings.is_empty(), "{warnings:?}");
    }
}

#[test]
fn an_unreachable_tracking_server_leaves_the_job_training_with_a_warning() {
    // A port nobody listens on.
    let closed = format!("http://127.0.0.1:{}", free_port().unwrap());
    let p = Platform::builder("tracking-down")
        .env("TRAINYARD_MLFLOW_URI", &closed)
        .start();
    let _exec = p.executor("untracked");
    let id = p.submit(&MlpSpec::digits("tracked-nowhere").epochs(5).seed(2).build());
    let job = p.wait_end(&id, Duration::from_secs(300));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert!(p.result_accuracy(&id) > 0.8);
    let warning = eventually(Duration::from_secs(30), || {
        p.events(&id).into_iter().find_map(|e| match e.typed() {
            Ok(EventData::Tracking(w)) => Some((w, e.reason)),
            _ => None,
        })
    });
    let (w, reason): (TrackingWarning, String) =
        warning.expect("a tracking warning event on the job");
    assert_eq!(w.tracker, "mlflow");
    assert_eq!(w.uri, closed);
    assert_eq!(w.action, "retrying");
    assert!(reason.contains("trains on"), "{reason}");
    // One warning for the outage, not one per try (it was tried all
    // through the training).
    let n = p
        .events(&id)
        .iter()
        .filter(|e| e.kind == EventKind::Tracking)
        .count();
    assert_eq!(n, 1);
}
