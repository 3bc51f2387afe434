//! Checkpoint commits through the report endpoint: a checkpoint is listed
//! only once every shard of its step is reported, its manifest is written
//! to the object store first, the newest K are kept, partial ones are
//! removed, and malformed shard reports are refused naming the field.

use crate::executors::{place_ring_job, register};
use crate::helpers::{assert_problem, digits_spec, spawn_app_with};
use serde_json::{json, Value};

fn shard(job: &str, step: u64, shard: u32, start: u64, end: u64) -> Value {
    json!({
        "step": step, "generation": 1, "shard": shard, "shards": 2,
        "key": format!("{job}/step-{step}/shard-{shard}.safetensors"),
        "bytes": 100, "sha256": "ab".repeat(32),
        "ranges": [{"param": "fc0.weight", "start": start, "end": end}],
        "numel": 10, "state_tensors": 0, "optimizer_t": step,
        "cursor": {"epoch": 0, "offset": step * 32}
    })
}

#[tokio::test]
async fn checkpoints_commit_when_complete_keep_k_and_drop_partial_ones() {
    let store = std::env::temp_dir().join(format!("ty-api-ckpt-{}", uuid::Uuid::new_v4()));
    let url = format!("file://{}", store.display());
    let app = spawn_app_with(|c| c.object_store = Some(url.clone())).await;
    let (id, token) = register(&app, "writer").await;
    let mut spec = digits_spec("checkpointed");
    spec["checkpoint"] = json!({"every_steps": 10, "keep": 2});
    // Reports are taken from the executor holding the role they name.
    let job = place_ring_job(&app, spec, 1).await;
    let report = |shards: Vec<Value>| {
        let body = json!({
            "key": {"job_id": job, "generation": 1, "role": "worker", "index": 0},
            "checkpoints": shards
        });
        let req = app
            .client
            .post(app.url(&format!("/v1/executors/{id}/reports")))
            .bearer_auth(&token)
            .json(&body);
        async move { req.send().await.unwrap() }
    };
    let steps = || async {
        let l: Value = app
            .get(&format!("/v1/jobs/{job}/checkpoints"))
            .await
            .json()
            .await
            .unwrap();
        l["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["step"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    // Shard files as the roles would have uploaded them.
    for step in [10, 20, 25, 30] {
        let dir = store.join(&job).join(format!("step-{step}"));
        std::fs::create_dir_all(&dir).unwrap();
        for s in 0..2 {
            std::fs::write(dir.join(format!("shard-{s}.safetensors")), b"x").unwrap();
        }
    }
    // Half a checkpoint is not one.
    assert_eq!(report(vec![shard(&job, 10, 0, 0, 5)]).await.status(), 200);
    assert!(steps().await.is_empty());
    assert!(!store.join(&job).join("step-10/manifest.json").exists());
    assert_eq!(report(vec![shard(&job, 10, 1, 5, 10)]).await.status(), 200);
    assert_eq!(steps().await, [10]);
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(store.join(&job).join("step-10/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["step"], 10);
    assert_eq!(manifest["shards"].as_array().unwrap().len(), 2);
    assert_eq!(manifest["cursor"]["offset"], 320);
    // A retried report commits nothing twice.
    assert_eq!(report(vec![shard(&job, 10, 1, 5, 10)]).await.status(), 200);
    assert_eq!(steps().await, [10]);
    // Step 25 never completes; 20 and 30 do: keep 2 drops 10, and the
    // partial 25 is removed once a newer checkpoint is committed.
    report(vec![shard(&job, 20, 0, 0, 5), shard(&job, 20, 1, 5, 10)]).await;
    report(vec![shard(&job, 25, 0, 0, 5)]).await;
    report(vec![shard(&job, 30, 0, 0, 5), shard(&job, 30, 1, 5, 10)]).await;
    assert_eq!(steps().await, [30, 20]);
    let mut left: Vec<String> = std::fs::read_dir(store.join(&job))
        .unwrap()
        .map(|d| d.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["step-20", "step-30"]);
    let listed: Value = app
        .get(&format!("/v1/jobs/{job}/checkpoints"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["keep"], 2);
    assert_eq!(
        listed["checkpoints"][0]["manifest_url"],
        format!("{url}/{job}/step-30/manifest.json")
    );

    // Two roles report several checkpoints at once (a burst after an
    // outage): every complete one commits, oldest first, and retention
    // then keeps the newest two — none is lost to a concurrent clean-up.
    for _ in 0..5 {
        let base = steps().await[0];
        let (a, b, c) = (base + 10, base + 20, base + 30);
        for step in [a, b, c] {
            let dir = store.join(&job).join(format!("step-{step}"));
            std::fs::create_dir_all(&dir).unwrap();
        }
        let (r0, r1) = tokio::join!(
            report(vec![
                shard(&job, a, 0, 0, 5),
                shard(&job, b, 0, 0, 5),
                shard(&job, c, 0, 0, 5)
            ]),
            report(vec![
                shard(&job, a, 1, 5, 10),
                shard(&job, b, 1, 5, 10),
                shard(&job, c, 1, 5, 10)
            ]),
        );
        assert_eq!((r0.status().as_u16(), r1.status().as_u16()), (200, 200));
        assert_eq!(steps().await, [c, b]);
    }

    // Malformed shard reports are refused, naming the field.
    let mut bad = shard(&job, 40, 0, 0, 5);
    bad["key"] = json!("../../etc/passwd");
    assert_problem(report(vec![bad]).await, 422, Some("checkpoints[0].key")).await;
    let mut bad = shard(&job, 40, 0, 0, 5);
    bad["shard"] = json!(2);
    bad["key"] = json!(format!("{job}/step-40/shard-2.safetensors"));
    assert_problem(report(vec![bad]).await, 422, Some("checkpoints[0].shard")).await;
    let mut bad = shard(&job, 40, 0, 0, 5);
    bad["sha256"] = json!("nothex");
    assert_problem(report(vec![bad]).await, 422, Some("checkpoints[0].sha256")).await;
    let mut bad = shard(&job, 40, 0, 0, 5);
    bad["ranges"] = json!([]);
    assert_problem(report(vec![bad]).await, 422, Some("checkpoints[0].ranges")).await;

    // No final weights yet: a 404 problem; no such job: the same.
    assert_problem(app.get(&format!("/v1/jobs/{job}/model")).await, 404, None).await;
    assert_problem(
        app.get("/v1/jobs/0190b2c4-0000-7000-8000-000000000000/checkpoints")
            .await,
        404,
        None,
    )
    .await;
    let _ = std::fs::remove_dir_all(&store);
}
