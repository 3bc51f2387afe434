//! Sweeps through the API with hand-driven executors: a sweep that names
//! a field it may not set, a range that is not one, a value no job may
//! have or a rung past the end is refused naming the field, and nothing
//! is stored; another user's sweep is a 404. A sweep of three trials
//! under ASHA starts them as jobs of its owner (each knows its sweep);
//! when their rank 0 reports the metric at the first rung, the two below
//! the keep line (⌈3/4⌉ = 1) are stopped — their jobs cancelled with the
//! rung, the rank and the value — and once the survivor succeeds the
//! sweep has succeeded with it as the best.

use crate::executors::{holder_of_rank, register};
use crate::helpers::{assert_problem, spawn_app, spawn_app_with, TestApp};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

fn base() -> Value {
    json!({
        "model": {"kind": "mlp", "inputs": 64, "hidden": [16], "outputs": 10},
        "dataset": {"kind": "file", "url": "file:///data/digits.npz"},
        "loss": "cross_entropy",
        "optimizer": {"kind": "momentum", "lr": 0.1},
        "batch_size": 32,
        "steps": 100,
        "strategy": "allreduce",
        "workers": {"min": 1, "max": 1}
    })
}

fn sweep(parameters: Value) -> Value {
    json!({
        "name": "lr",
        "base": base(),
        "parameters": parameters,
        "search": "grid",
        "metric": "eval_accuracy",
        "goal": "maximize",
        "concurrency": 3,
        "early_stopping": {"asha": {"reduction_factor": 4, "min_steps": 10}}
    })
}

async fn get(app: &TestApp, id: &str) -> Value {
    app.get_json(&format!("/v1/sweeps/{id}")).await
}

async fn until(app: &TestApp, id: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..200 {
        let s = get(app, id).await;
        if ok(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("sweep {id}: never {what}: {}", get(app, id).await);
}

/// A sweep over a script job (the base runs `train.py`).
fn script_sweep(parameters: Value) -> Value {
    let mut s = sweep(parameters);
    s["base"] = json!({
        "name": "script",
        "script": {"code": "artifact:train.py", "args": ["--epochs", "3"]},
        "workers": {"min": 1, "max": 1}
    });
    s["early_stopping"] = json!({"asha": {"min_steps": 1, "max_steps": 3}});
    s
}

#[tokio::test]
async fn bad_sweeps_are_refused_naming_the_field() {
    let app = spawn_app().await;
    for (body, field) in [
        (
            sweep(json!({"dataset.url": {"values": ["file:///etc/shadow"]}})),
            "parameters.dataset.url",
        ),
        (
            sweep(json!({"optimizer.lr": {"log_uniform": [0, 1]}})),
            "parameters.optimizer.lr.log_uniform",
        ),
        (
            sweep(json!({"optimizer.lr": {"values": [0.1, -1.0]}})),
            "parameters.optimizer.lr",
        ),
        (
            sweep(json!({"optimizer.lr": {"values": [0.1]}, "name": {"values": ["x"]}})),
            "parameters.name",
        ),
        (
            {
                let mut s = sweep(json!({"optimizer.lr": {"values": [0.1]}}));
                s["early_stopping"]["asha"]["min_steps"] = json!(100);
                s
            },
            "early_stopping.asha.min_steps",
        ),
        (
            {
                let mut s = sweep(json!({"optimizer.lr": {"values": [0.1]}}));
                s["concurrency"] = json!(0);
                s
            },
            "concurrency",
        ),
        // A script's arguments: only for a script job, one word each; the
        // script itself stays the base's.
        (
            sweep(json!({"script.args.lr": {"values": [0.1]}})),
            "parameters.script.args.lr",
        ),
        (
            script_sweep(json!({"script.args.lr": {"values": [[0.1, "--evil"]]}})),
            "parameters.script.args.lr",
        ),
        (
            script_sweep(json!({"script.args.-x": {"values": [1]}})),
            "parameters.script.args.-x",
        ),
        (
            script_sweep(json!({"script.code": {"values": ["artifact:other.py"]}})),
            "parameters.script.code",
        ),
        (
            {
                let mut s = script_sweep(json!({"script.args.lr": {"values": [0.1]}}));
                s["early_stopping"] = json!({"asha": {"min_steps": 2}});
                s
            },
            "base.steps",
        ),
        (
            {
                let mut s = sweep(json!({"optimizer.lr": {"values": [0.1]}}));
                s["surprise"] = json!(1);
                s
            },
            "",
        ),
    ] {
        let r = app.post_json("/v1/sweeps", &body).await;
        let problem = assert_problem(r, 422, (!field.is_empty()).then_some(field)).await;
        assert!(problem["detail"].is_string(), "{problem}");
    }
    let list: Value = app.get_json("/v1/sweeps").await;
    assert_eq!(list["sweeps"], json!([]), "nothing was stored");
    assert_problem(app.get("/v1/sweeps/not-a-uuid").await, 400, Some("id")).await;
}

#[tokio::test]
async fn asha_stops_trials_below_the_rung_and_the_survivor_wins() {
    let app = spawn_app().await;
    let mut tokens = HashMap::new();
    for i in 0..3 {
        let (id, token) = register(&app, &format!("sweeper-{i}")).await;
        tokens.insert(id, token);
    }
    let r = app
        .post_json(
            "/v1/sweeps",
            &sweep(json!({"optimizer.lr": {"values": [0.01, 0.1, 0.5]}})),
        )
        .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let created: Value = r.json().await.unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["rungs"], json!([10, 40]));
    let s = until(&app, &id, "three trials running", |s| {
        s["trials"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["state"] == "running")
    })
    .await;
    let jobs: Vec<String> = s["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["job_id"].as_str().unwrap().to_owned())
        .collect();
    for (i, job) in jobs.iter().enumerate() {
        let j: Value = app.get_json(&format!("/v1/jobs/{job}")).await;
        assert_eq!(j["sweep"], json!({"id": id, "trial": i}), "{j}");
        assert_eq!(j["name"], format!("lr/t{i}"));
        assert_eq!(
            j["spec"]["optimizer"]["lr"],
            s["trials"][i]["params"]["optimizer.lr"]
        );
    }
    // Rank 0 of each trial reports its accuracy at step 10 (the first
    // rung): trial 1 is the best, trials 0 and 2 rank below ⌈3/4⌉ = 1.
    let mut holders = Vec::new();
    for (job, accuracy) in jobs.iter().zip([0.6, 0.9, 0.3]) {
        let mut holder = String::new();
        for _ in 0..200 {
            let a: Value = app.get_json(&format!("/v1/jobs/{job}/assignments")).await;
            if a["workers"].as_array().is_some_and(|w| !w.is_empty()) {
                holder = holder_of_rank(&app, job, 0).await;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!holder.is_empty(), "job {job} was never placed");
        let token = tokens[&holder].clone();
        let key = json!({"job_id": job, "generation": 1, "role": "worker", "index": 0});
        let r = app
            .post_as(
                &format!("/v1/executors/{holder}/heartbeat"),
                &token,
                &json!({"roles": [key]}),
            )
            .await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let point = json!({"step": 10, "loss": 1.0, "lr": 0.1, "samples_per_sec": 100.0,
            "data_seconds": 0.0, "compute_seconds": 0.01, "comm_seconds": 0.0,
            "eval_loss": 1.0, "eval_accuracy": accuracy});
        let r = app
            .post_as(
                &format!("/v1/executors/{holder}/reports"),
                &token,
                &json!({"key": key, "metrics": [point]}),
            )
            .await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        holders.push((holder, token, key));
    }
    let s = until(&app, &id, "two trials stopped", |s| {
        s["trials"][0]["state"] == "stopped" && s["trials"][2]["state"] == "stopped"
    })
    .await;
    assert_eq!(s["trials"][1]["state"], "running", "{s}");
    assert_eq!(s["trials"][0]["rung_metrics"], json!([0.6]));
    let reason = s["trials"][2]["reason"].as_str().unwrap();
    assert!(
        reason.contains("rung 0 (10 steps)") && reason.contains("ranks 3 of 3"),
        "{reason}"
    );
    let stopped: Value = app.get_json(&format!("/v1/jobs/{}", jobs[2])).await;
    assert_eq!(stopped["state"], "cancelled", "{stopped}");
    assert!(
        stopped["state_reason"]
            .as_str()
            .unwrap()
            .contains("stopped by ASHA"),
        "{stopped}"
    );
    // The survivor ends; the sweep ends with it as the best.
    let (holder, token, key) = &holders[1];
    let end = json!({"key": key, "metrics": [{"step": 100, "loss": 0.1, "lr": 0.1,
        "samples_per_sec": 100.0, "data_seconds": 0.0, "compute_seconds": 0.01,
        "comm_seconds": 0.0, "eval_loss": 0.2, "eval_accuracy": 0.95}],
        "outcome": {"succeeded": {"steps": 100, "final_loss": 0.1, "eval_loss": 0.2,
        "eval_accuracy": 0.95, "weights_url": "file:///tmp/w.safetensors"}}});
    let r = app
        .post_as(&format!("/v1/executors/{holder}/reports"), token, &end)
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let s = until(&app, &id, "succeeded", |s| s["state"] == "succeeded").await;
    assert_eq!(s["best"]["index"], 1, "{s}");
    assert_eq!(s["best"]["metric"], 0.95);
    assert_eq!(s["trials"][1]["state"], "completed");
    assert!(
        s["reason"]
            .as_str()
            .unwrap()
            .contains("1 completed, 2 stopped early"),
        "{s}"
    );
}

#[tokio::test]
async fn a_user_sees_only_its_own_sweeps() {
    const ADMIN: &str = "sweep-admin-token";
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into())).await;
    let alice = app.user_token(ADMIN, "alice").await;
    let mallory = app.user_token(ADMIN, "mallory").await;
    let body = sweep(json!({"optimizer.lr": {"values": [0.01, 0.1]}}));
    let r = app
        .send_as(
            reqwest::Method::POST,
            "/v1/sweeps",
            Some(&alice),
            Some(&body),
        )
        .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let created: Value = r.json().await.unwrap();
    assert_eq!(created["owner"], "alice");
    let id = created["id"].as_str().unwrap();
    for path in [
        format!("/v1/sweeps/{id}"),
        format!("/v1/sweeps/{id}/cancel"),
    ] {
        let method = if path.ends_with("cancel") {
            reqwest::Method::POST
        } else {
            reqwest::Method::GET
        };
        let r = app.send_as(method, &path, Some(&mallory), None).await;
        assert_problem(r, 404, None).await;
    }
    let theirs = app.get_json_as("/v1/sweeps", &mallory).await;
    assert_eq!(theirs["sweeps"], json!([]));
    let mine = app.get_json_as("/v1/sweeps", &alice).await;
    assert_eq!(mine["sweeps"][0]["id"], id);
    // Alice cancels it: its trials' jobs are cancelled too.
    let r = app
        .send_as(
            reqwest::Method::POST,
            &format!("/v1/sweeps/{id}/cancel"),
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(r.status(), 200);
    let s: Value = r.json().await.unwrap();
    assert_eq!(s["state"], "cancelled");
    for t in s["trials"].as_array().unwrap() {
        assert_eq!(t["state"], "cancelled", "{s}");
        if let Some(job) = t["job_id"].as_str() {
            let j = app.get_json_as(&format!("/v1/jobs/{job}"), &alice).await;
            assert_eq!(j["state"], "cancelled", "{j}");
        }
    }
}
