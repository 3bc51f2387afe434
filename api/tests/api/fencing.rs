//! Role reports are fenced like the data plane: metrics, log lines,
//! checkpoint shards and outcomes are stored only from the executor that
//! held the role they name, in the generation they name. A stranger (an
//! executor registered with nothing but the join token) is refused with a
//! 403, a zombie claiming a role or generation it did not hold with a 409,
//! every report kind alike, and nothing of theirs reaches the job.

use crate::executors::{holder_of_rank, place_ring_job, register, wait_for_generation};
use crate::helpers::{assert_problem, digits_spec, spawn_app_with, TestApp};
use serde_json::{json, Value};
use std::collections::HashMap;

fn shard(job: &str, generation: i64, step: u64, shard: u32, sha: &str) -> Value {
    json!({
        "step": step, "generation": generation, "shard": shard, "shards": 2,
        "key": format!("{job}/step-{step}/shard-{shard}.safetensors"),
        "bytes": 100, "sha256": sha.repeat(32),
        "ranges": [{"param": "fc0.weight", "start": shard * 5, "end": shard * 5 + 5}],
        "numel": 10, "state_tensors": 0, "optimizer_t": step,
        "cursor": {"epoch": 0, "offset": step * 32}
    })
}

fn metric(step: u64, loss: f64) -> Value {
    json!({"step": step, "loss": loss, "lr": 0.1, "samples_per_sec": 100.0,
           "data_seconds": 0.0, "compute_seconds": 0.01, "comm_seconds": 0.0})
}

/// One report of each kind for role (`generation`, worker `rank`).
fn every_kind(job: &str, generation: i64, rank: u32) -> Vec<(&'static str, Value)> {
    let key = json!({"job_id": job, "generation": generation, "role": "worker", "index": rank});
    vec![
        (
            "metrics",
            json!({"key": key, "metrics": [metric(999_999, 0.001)]}),
        ),
        (
            "logs",
            json!({"key": key, "logs": [{"seq": 1, "at_ms": 0, "level": "error", "message": "written by someone else"}]}),
        ),
        (
            "checkpoints",
            json!({"key": key, "checkpoints": [shard(job, generation, 10, 0, "ee")]}),
        ),
        (
            "outcome",
            json!({"key": key, "outcome": {"failed": {"reason": "written by someone else"}}}),
        ),
    ]
}

async fn report(app: &TestApp, (id, token): (&str, &str), body: &Value) -> reqwest::Response {
    app.post_as(&format!("/v1/executors/{id}/reports"), token, body)
        .await
}

async fn shard_rows(app: &TestApp) -> Vec<(i64, i64, i32, String)> {
    sqlx::query_as(
        "SELECT step, generation, shard, report->>'sha256' FROM checkpoint_shards ORDER BY 1, 2, 3",
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
}

async fn curve(app: &TestApp, job: &str) -> Vec<(u64, f64)> {
    let m: Value = app.get_json(&format!("/v1/jobs/{job}/metrics")).await;
    m["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["step"].as_u64().unwrap(), p["loss"].as_f64().unwrap()))
        .collect()
}

fn store(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("ty-api-{name}-{}", uuid::Uuid::new_v4()));
    format!("file://{}", dir.display())
}

#[tokio::test]
async fn a_stranger_and_a_zombie_are_refused_for_every_report_kind() {
    let url = store("fence");
    let app = spawn_app_with(|c| c.object_store = Some(url.clone())).await;
    let (holder, ht) = register(&app, "holder").await;
    let mut spec = digits_spec("fenced");
    spec["checkpoint"] = json!({"every_steps": 10, "keep": 2});
    let job = place_ring_job(&app, spec, 1).await;
    assert_eq!(holder_of_rank(&app, &job, 0).await, holder);
    // Registered with nothing but the join token, after the placement.
    let (stranger, st) = register(&app, "stranger").await;

    for (kind, body) in every_kind(&job, 1, 0) {
        let r = report(&app, (&stranger, &st), &body).await;
        let p = assert_problem(r, 403, None).await;
        assert!(
            p["detail"].as_str().unwrap().contains("holds no role"),
            "{kind}: {p}"
        );
    }
    // The holder itself, claiming a rank or a generation it never held.
    for (generation, rank) in [(1, 1), (2, 0), (0, 0)] {
        for (kind, body) in every_kind(&job, generation, rank) {
            let r = report(&app, (&holder, &ht), &body).await;
            let p = assert_problem(r, 409, None).await;
            assert!(
                p["detail"]
                    .as_str()
                    .unwrap()
                    .contains("never this executor's role"),
                "{kind} as generation {generation} rank {rank}: {p}"
            );
        }
    }
    // None of it reached the job.
    assert!(curve(&app, &job).await.is_empty());
    let logs: Value = app.get_json(&format!("/v1/jobs/{job}/logs")).await;
    assert_eq!(logs["lines"], json!([]), "{logs}");
    assert!(shard_rows(&app).await.is_empty());
    let j: Value = app.get_json(&format!("/v1/jobs/{job}")).await;
    assert_eq!(j["state"], "scheduling", "{j}");

    // What the holder reports for its own role is stored.
    let key = json!({"job_id": job, "generation": 1, "role": "worker", "index": 0});
    let r = report(
        &app,
        (&holder, &ht),
        &json!({"key": key, "metrics": [metric(5, 1.0)], "checkpoints": [shard(&job, 1, 10, 0, "aa")]}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(curve(&app, &job).await, [(5, 1.0)]);

    // The holder is drained: the role moves to the other executor in
    // generation 2, and the first holder is a zombie of generation 1.
    let r = app
        .client
        .post(app.url(&format!("/v1/executors/{holder}/drain")))
        .bearer_auth(&ht)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_for_generation(&app, &job, 2).await;
    assert_eq!(holder_of_rank(&app, &job, 0).await, stranger);
    let key2 = json!({"job_id": job, "generation": 2, "role": "worker", "index": 0});
    // The new holder may not write into generation 1's checkpoint.
    let r = report(
        &app,
        (&stranger, &st),
        &json!({"key": key2, "checkpoints": [shard(&job, 1, 10, 1, "bb")]}),
    )
    .await;
    let p = assert_problem(r, 409, None).await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("held no role in generation 1"),
        "{p}"
    );
    // Nor may the zombie write into generation 2, whatever the kind.
    for (kind, body) in every_kind(&job, 2, 0) {
        let r = report(&app, (&holder, &ht), &body).await;
        let p = assert_problem(r, 409, None).await;
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .contains("never this executor's role"),
            "{kind}: {p}"
        );
    }
    // Generation 2 measures step 5 again (it resumed before it): the newer
    // measurement is the curve's, and the zombie's late report of its
    // own step 5 does not replace it.
    let r = report(
        &app,
        (&stranger, &st),
        &json!({"key": key2, "metrics": [metric(5, 0.5)]}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let late = report(
        &app,
        (&holder, &ht),
        &json!({"key": key, "metrics": [metric(5, 1.0)], "outcome": {"failed": {"reason": "late"}}}),
    )
    .await;
    // Its metrics are its own generation's (stored, not replacing), its
    // outcome is a stale generation's.
    assert_problem(late, 409, None).await;
    assert_eq!(curve(&app, &job).await, [(5, 0.5)]);
    assert_eq!(
        shard_rows(&app).await,
        [(10, 1, 0, "aa".repeat(32))],
        "only the holder's own shard"
    );
    let j: Value = app.get_json(&format!("/v1/jobs/{job}")).await;
    assert_ne!(j["state"], "failed", "{j}");
}

#[tokio::test]
async fn a_checkpoint_shard_is_never_replaced_by_another_executor_of_its_generation() {
    let url = store("fence-shards");
    let app = spawn_app_with(|c| c.object_store = Some(url.clone())).await;
    let mut tokens = HashMap::new();
    for name in ["r0", "r1"] {
        let (id, token) = register(&app, name).await;
        tokens.insert(id, token);
    }
    let mut spec = digits_spec("two-ranks");
    spec["checkpoint"] = json!({"every_steps": 10, "keep": 2});
    let job = place_ring_job(&app, spec, 2).await;
    let r0 = holder_of_rank(&app, &job, 0).await;
    let r1 = holder_of_rank(&app, &job, 1).await;
    let (t0, t1) = (&tokens[&r0], &tokens[&r1]);
    let key = |rank: u32| json!({"job_id": job, "generation": 1, "role": "worker", "index": rank});
    let dir = url.trim_start_matches("file://");
    std::fs::create_dir_all(format!("{dir}/{job}/step-10")).unwrap();

    let r = report(
        &app,
        (&r0, t0),
        &json!({"key": key(0), "checkpoints": [shard(&job, 1, 10, 0, "aa")]}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // A retry of the same executor is taken again.
    let r = report(
        &app,
        (&r0, t0),
        &json!({"key": key(0), "checkpoints": [shard(&job, 1, 10, 0, "aa")]}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // Rank 1 held a role in generation 1, but shard 0 is rank 0's.
    let r = report(
        &app,
        (&r1, t1),
        &json!({"key": key(1), "metrics": [metric(3, 2.0)], "checkpoints": [shard(&job, 1, 10, 0, "cc")]}),
    )
    .await;
    let p = assert_problem(r, 409, None).await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("reported by executor"),
        "{p}"
    );
    // Its own shard completes the checkpoint with rank 0's shard as rank 0
    // reported it.
    let r = report(
        &app,
        (&r1, t1),
        &json!({"key": key(1), "checkpoints": [shard(&job, 1, 10, 1, "bb")]}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let listed: Value = app.get_json(&format!("/v1/jobs/{job}/checkpoints")).await;
    assert_eq!(listed["checkpoints"][0]["step"], 10, "{listed}");
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(format!("{dir}/{job}/step-10/manifest.json")).unwrap(),
    )
    .unwrap();
    let shas: Vec<&str> = manifest["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sha256"].as_str().unwrap())
        .collect();
    assert_eq!(shas, ["aa".repeat(32), "bb".repeat(32)], "{manifest}");
}

fn progress(job: &str, generation: i64, rank: u32, busy_ms: f64) -> Value {
    json!({"key": {"job_id": job, "generation": generation, "role": "worker", "index": rank},
           "step": 12, "phase": "compute", "phase_ms": 40, "median_step_ms": 20.0,
           "busy_ms": busy_ms, "window": 10})
}

async fn beat(app: &TestApp, (id, token): (&str, &str), body: &Value) -> reqwest::Response {
    app.post_as(&format!("/v1/executors/{id}/heartbeat"), token, body)
        .await
}

/// What heartbeats say of a role's progress (the stuck check and the
/// straggler figures read it) is kept only from the executor holding
/// that rank now, and a malformed entry is refused naming its field.
#[tokio::test]
async fn role_progress_is_kept_only_from_the_current_holder_and_is_checked() {
    let app = spawn_app_with(|_| {}).await;
    let (holder, ht) = register(&app, "holder").await;
    let job = place_ring_job(&app, digits_spec("progress"), 1).await;
    assert_eq!(holder_of_rank(&app, &job, 0).await, holder);
    let (stranger, st) = register(&app, "stranger").await;
    let key = json!({"job_id": job, "generation": 1, "role": "worker", "index": 0});

    // A stranger naming the holder's role: nothing is kept.
    let r = beat(
        &app,
        (&stranger, &st),
        &json!({"roles": [key], "progress": [progress(&job, 1, 0, 999.0)]}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let m: Value = app.get_json(&format!("/v1/jobs/{job}/metrics")).await;
    assert_eq!(m["ranks"], json!([]), "{m}");

    // Progress of a role the beat does not list, or with a figure that is
    // no number of milliseconds, names its field.
    let r = beat(
        &app,
        (&holder, &ht),
        &json!({"roles": [], "progress": [progress(&job, 1, 0, 5.0)]}),
    )
    .await;
    assert_problem(r, 422, Some("progress[0].key")).await;
    let r = beat(
        &app,
        (&holder, &ht),
        &json!({"roles": [key], "progress": [progress(&job, 1, 0, -1.0)]}),
    )
    .await;
    assert_problem(r, 422, Some("progress[0].busy_ms")).await;

    // The holder's own is kept and shown.
    let r = beat(
        &app,
        (&holder, &ht),
        &json!({"roles": [key], "progress": [progress(&job, 1, 0, 5.0)]}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let m: Value = app.get_json(&format!("/v1/jobs/{job}/metrics")).await;
    let ranks = m["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 1, "{m}");
    assert_eq!(ranks[0]["executor_id"], json!(holder));
    assert_eq!(ranks[0]["phase"], "compute");
    assert_eq!(ranks[0]["busy_ms"], 5.0);
    assert_eq!(
        ranks[0]["straggler"], false,
        "one rank is nobody's straggler"
    );
}
