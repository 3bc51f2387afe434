//! Script jobs through the API: a script and its inputs are artifacts
//! resolved like a model's, the job is placed without an inspection, a
//! model job's fields are refused by name, a failing script restarts until
//! its `max_restarts` are used up, and rank 0's `ran` outcome succeeds the
//! job, whose outputs are listed (none here: the store has none). A
//! script job's checkpoints are listed from the manifests in the store and
//! are its owner's alone to resume from.

use crate::executors::{place_ring_job, register, wait_for_generation};
use crate::helpers::{assert_problem, spawn_app_with, TestApp};
use serde_json::{json, Value};

async fn put_artifact(app: &TestApp, name: &str, body: &'static [u8]) {
    let r = app
        .client
        .put(app.url(&format!("/v1/artifacts/{name}")))
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

fn script_spec(max_restarts: u32) -> Value {
    json!({
        "name": "ddp",
        "script": {"code": "artifact:train.py", "args": ["--epochs", "2"], "max_restarts": max_restarts},
        "inputs": ["artifact:data.npz"],
        "workers": {"min": 1, "max": 1},
    })
}

#[tokio::test]
async fn a_script_job_is_placed_restarted_on_failure_and_succeeds_with_its_outputs() {
    let app = spawn_app_with(|_| {}).await;
    let (exec, token) = register(&app, "runner").await;
    put_artifact(&app, "train.py", b"import torch\n").await;
    put_artifact(&app, "data.npz", b"PK").await;

    // A model job's fields, the PS pattern and a missing artifact are
    // refused by name.
    for (field, value) in [
        ("batch_size", json!(32)),
        ("strategy", json!("parameter_server")),
        (
            "model",
            json!({"kind": "torchscript", "url": "artifact:train.py"}),
        ),
    ] {
        let mut spec = script_spec(1);
        spec[field] = value;
        let r = app.post_json("/v1/jobs", &spec).await;
        assert_problem(r, 422, Some(field)).await;
    }
    // A time limit that is not a positive number of seconds within the
    // bound is refused by name too (a problem+json, before any placement).
    for bad in [json!(0), json!(-5), json!(1.5), json!(31 * 24 * 3600)] {
        let mut spec = script_spec(1);
        spec["script"]["max_seconds"] = bad;
        let r = app.post_json("/v1/jobs", &spec).await;
        assert_problem(r, 422, Some("script.max_seconds")).await;
    }
    let mut spec = script_spec(1);
    spec["inputs"] = json!(["artifact:missing.npz"]);
    let r = app.post_json("/v1/jobs", &spec).await;
    assert_problem(r, 422, Some("inputs[0]")).await;

    // Placed at once (nothing to inspect), with its artifacts resolved in
    // the assignment.
    let id = place_ring_job(&app, script_spec(1), 1).await;
    let j: Value = app.get_json(&format!("/v1/jobs/{id}")).await;
    assert_eq!(j["strategy"], "allreduce", "{j}");
    let beat: Value = app
        .post_as(
            &format!("/v1/executors/{exec}/heartbeat"),
            &token,
            &json!({"roles": []}),
        )
        .await
        .json()
        .await
        .unwrap();
    let spec = &beat["assignments"][0]["spec"];
    assert!(
        spec["script"]["code"]
            .as_str()
            .unwrap()
            .starts_with("file://"),
        "{spec}"
    );
    assert!(
        spec["inputs"][0].as_str().unwrap().starts_with("file://"),
        "{spec}"
    );

    // The script fails: one restart (max_restarts 1), then the job fails.
    for generation in [1, 2] {
        let key = json!({"job_id": id, "generation": generation, "role": "worker", "index": 0});
        let r = app
            .post_as(
                &format!("/v1/executors/{exec}/heartbeat"),
                &token,
                &json!({"roles": [key]}),
            )
            .await;
        assert_eq!(r.status(), 200);
        let crash = json!({"key": key, "outcome": {"crashed": {"reason": "rank 0's script exited with code 1"}}});
        let r = app
            .post_as(&format!("/v1/executors/{exec}/reports"), &token, &crash)
            .await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        if generation == 1 {
            wait_for_generation(&app, &id, 2).await;
        }
    }
    let j: Value = app.get_json(&format!("/v1/jobs/{id}")).await;
    assert_eq!(j["state"], "failed", "{j}");
    let reason = j["state_reason"].as_str().unwrap();
    assert!(
        reason.contains("the script failed on each of its 2 tries (max_restarts 1)")
            && reason.contains("code 1"),
        "{reason}"
    );

    // Another one ends: rank 0's outcome succeeds it.
    let id = place_ring_job(&app, script_spec(0), 1).await;
    let key = json!({"job_id": id, "generation": 1, "role": "worker", "index": 0});
    let ran = json!({"key": key, "outcome": {"ran": {"outputs": 1, "bytes": 10}}});
    let r = app
        .post_as(&format!("/v1/executors/{exec}/reports"), &token, &ran)
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let j: Value = app.get_json(&format!("/v1/jobs/{id}")).await;
    assert_eq!(j["state"], "succeeded", "{j}");
    assert!(
        j["state_reason"]
            .as_str()
            .unwrap()
            .contains("1 output file(s), 10 bytes"),
        "{j}"
    );
    let listed: Value = app.get_json(&format!("/v1/jobs/{id}/outputs")).await;
    assert_eq!(listed["outputs"], json!([]), "{listed}");
    let r = app
        .client
        .get(app.url(&format!("/v1/jobs/{id}/outputs/a/../../b")))
        .send()
        .await
        .unwrap();
    assert!(r.status() == 400 || r.status() == 404, "{}", r.status());
    let r = app
        .client
        .get(app.url(&format!("/v1/jobs/{id}/outputs/model.pt")))
        .send()
        .await
        .unwrap();
    assert_problem(r, 404, None).await;

    // It committed no checkpoint, and a model job's are not a script's.
    let mut spec = script_spec(0);
    spec["resume_from"] = json!({"job_id": id});
    let r = app.post_json("/v1/jobs", &spec).await;
    let p = assert_problem(r, 422, Some("resume_from.job_id")).await;
    assert!(p.to_string().contains("no committed checkpoint"), "{p}");
    let model_job = app
        .submit(&crate::helpers::digits_spec("a-model-job"))
        .await;
    spec["resume_from"] = json!({"job_id": model_job["id"]});
    let r = app.post_json("/v1/jobs", &spec).await;
    let p = assert_problem(r, 422, Some("resume_from.job_id")).await;
    assert!(p.to_string().contains("is a model job"), "{p}");
}

/// A script job's checkpoints are listed from the manifests its rank 0's
/// executor wrote to the store, newest first (a folder without a manifest,
/// a commit that never finished, and an unreadable manifest are not); its
/// owner may start another script job from one of them, another user may
/// not even learn that they exist.
#[tokio::test]
async fn a_script_jobs_checkpoints_are_listed_from_its_manifests_and_are_its_owners_alone() {
    const ADMIN: &str = "scripts-admin-token";
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into())).await;
    let (alice, bob) = (
        app.user_token(ADMIN, "alice").await,
        app.user_token(ADMIN, "bob").await,
    );
    for token in [&alice, &bob] {
        for (name, body) in [("train.py", &b"import torch\n"[..]), ("data.npz", b"PK")] {
            let r = app
                .client
                .put(app.url(&format!("/v1/artifacts/{name}")))
                .bearer_auth(token)
                .body(body)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{}", r.text().await.unwrap());
        }
    }
    async fn submit(app: &TestApp, token: &str, spec: &Value) -> reqwest::Response {
        app.send_as(reqwest::Method::POST, "/v1/jobs", Some(token), Some(spec))
            .await
    }
    let r = submit(&app, &alice, &script_spec(0)).await;
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // What the executor writes: `{job}/script-checkpoints/{seq:010}/`.
    let folder = std::env::temp_dir()
        .join(format!("{}-objects", app.db_name))
        .join(&id)
        .join("script-checkpoints");
    let put = |seq: u32, name: &str, body: String| {
        let dir = folder.join(format!("{seq:010}"));
        std::fs::create_dir_all(dir.join("files")).unwrap();
        std::fs::write(dir.join(name), body).unwrap();
    };
    let manifest = |seq: u64, generation: u64, sizes: &[u64]| {
        json!({
            "seq": seq, "generation": generation, "step": seq * 10,
            "committed_at": "2026-12-04T12:00:00Z",
            "files": sizes.iter().enumerate().map(|(i, s)| json!({
                "path": format!("f{i}.pt"), "size": s, "sha256": "00"
            })).collect::<Vec<_>>(),
        })
        .to_string()
    };
    put(1, "manifest.json", manifest(1, 1, &[100]));
    put(2, "manifest.json", manifest(2, 2, &[5, 7]));
    put(3, "files/f0.pt", "half a commit".into());
    put(4, "manifest.json", "{not a manifest".into());

    let listed = app
        .get_json_as(&format!("/v1/jobs/{id}/checkpoints"), &alice)
        .await;
    let rows = listed["checkpoints"].as_array().unwrap();
    let got: Vec<(u64, i64, u64, u64)> = rows
        .iter()
        .map(|c| {
            (
                c["step"].as_u64().unwrap(),
                c["generation"].as_i64().unwrap(),
                c["shards"].as_u64().unwrap(),
                c["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, [(2, 2, 2, 12), (1, 1, 1, 100)], "{listed}");
    assert!(
        rows[0]["manifest_url"]
            .as_str()
            .unwrap()
            .ends_with("/script-checkpoints/0000000002/manifest.json"),
        "{listed}"
    );

    // Its owner starts from checkpoint 2, not from the unfinished 3.
    let mut spec = script_spec(0);
    spec["resume_from"] = json!({"job_id": id, "step": 2});
    assert_eq!(submit(&app, &alice, &spec).await.status(), 201);
    spec["resume_from"] = json!({"job_id": id, "step": 3});
    assert_problem(
        submit(&app, &alice, &spec).await,
        422,
        Some("resume_from.step"),
    )
    .await;

    // Another user is told there is nothing to start from.
    spec["resume_from"] = json!({"job_id": id});
    let p = assert_problem(
        submit(&app, &bob, &spec).await,
        422,
        Some("resume_from.job_id"),
    )
    .await;
    assert!(p.to_string().contains("no committed checkpoint"), "{p}");
    let _ = std::fs::remove_dir_all(folder.parent().unwrap());
}
