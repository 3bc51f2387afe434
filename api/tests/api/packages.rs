//! A script job's packages as the API records them: each rank's install
//! phases are `packages` events (one per rank, generation and stage, so a
//! retried report adds none, and bad figures are a 422 naming the field),
//! and an executor's environment cache, from its heartbeat, is listed with
//! it.

use crate::executors::{place_ring_job, register};
use crate::helpers::{assert_problem, digits_spec, executor_post, spawn_app_with};
use serde_json::{json, Value};
use trainyard_common::cluster::PackagesStage;
use trainyard_common::event::{EventData, EventKind};

#[tokio::test]
async fn install_phases_are_events_once_each_and_bad_ones_are_refused() {
    let app = spawn_app_with(|_| {}).await;
    let holder = register(&app, "installer").await;
    let me = (holder.0.as_str(), holder.1.as_str());
    let id = place_ring_job(&app, digits_spec("with-packages"), 1).await;
    let key = json!({"job_id": id, "generation": 1, "role": "worker", "index": 0});
    let phases = json!([
        {"stage": "resolving", "detail": "resolving 1 requirement(s) from https://pypi.org/simple (uv, confined)"},
        {"stage": "installing", "detail": "installing 1 over the runtime: tqdm==4.66.5", "packages": 1, "seconds": 0.8, "environment": "0123456789ab"},
        {"stage": "ready", "detail": "environment 0123456789ab ready in 1.9 s", "packages": 1, "seconds": 1.9, "environment": "0123456789ab"},
    ]);
    // Sent twice, as after a lost answer: stored once.
    for _ in 0..2 {
        let r = executor_post(
            &app,
            me,
            "reports",
            &json!({"key": key, "packages": phases}),
        )
        .await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    let page: Value = app
        .get_json(&format!("/v1/jobs/{id}/events?limit=1000"))
        .await;
    let got: Vec<(PackagesStage, String)> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "packages")
        .map(|e| {
            let Ok(EventData::Packages(p)) = EventData::from_json(EventKind::Packages, &e["data"])
            else {
                panic!("{e}")
            };
            assert_eq!((p.rank, p.generation), (0, 1), "{e}");
            assert_eq!(p.executor.to_string(), holder.0);
            (p.phase.stage, e["reason"].as_str().unwrap().to_owned())
        })
        .collect();
    let stages: Vec<PackagesStage> = got.iter().map(|g| g.0).collect();
    assert_eq!(
        stages,
        [
            PackagesStage::Resolving,
            PackagesStage::Installing,
            PackagesStage::Ready
        ]
    );
    assert!(
        got[2].1.contains("rank 0 packages ready") && got[2].1.contains("(1.9 s)"),
        "{got:?}"
    );

    for (phase, field) in [
        (
            json!({"stage": "ready", "detail": "x".repeat(3000)}),
            "packages[0].detail",
        ),
        (
            json!({"stage": "ready", "detail": "d", "seconds": -1.0}),
            "packages[0].seconds",
        ),
        (
            json!({"stage": "ready", "detail": "d", "environment": "../../etc"}),
            "packages[0].environment",
        ),
    ] {
        let r = executor_post(
            &app,
            me,
            "reports",
            &json!({"key": key, "packages": [phase]}),
        )
        .await;
        assert_problem(r, 422, Some(field)).await;
    }
    let many: Vec<Value> = (0..17)
        .map(|_| json!({"stage": "resolving", "detail": "d"}))
        .collect();
    let r = executor_post(&app, me, "reports", &json!({"key": key, "packages": many})).await;
    assert_problem(r, 422, Some("packages")).await;
    let r = executor_post(
        &app,
        me,
        "reports",
        &json!({"key": key, "packages": [{"stage": "exploded", "detail": "d"}]}),
    )
    .await;
    assert_eq!(r.status(), 422, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn an_executors_environment_cache_is_listed_from_its_heartbeat() {
    let app = spawn_app_with(|_| {}).await;
    let (id, token) = register(&app, "cache-keeper").await;
    let me = (id.as_str(), token.as_str());
    assert_eq!(
        app.get_json(&format!("/v1/executors/{id}")).await["environments"],
        Value::Null
    );
    let cache = json!({"environments": 3, "in_use": 1, "bytes": 123_456_789u64, "budget_bytes": 21_474_836_480u64});
    let r = executor_post(
        &app,
        me,
        "heartbeat",
        &json!({"roles": [], "environments": cache}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(
        app.get_json(&format!("/v1/executors/{id}")).await["environments"],
        cache
    );
    // A beat that does not say keeps what the last one said.
    let r = executor_post(&app, me, "heartbeat", &json!({"roles": []})).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(
        app.get_json(&format!("/v1/executors/{id}")).await["environments"],
        cache
    );
    let list: Value = app.get_json("/v1/executors").await;
    assert_eq!(list["executors"][0]["environments"], cache);
    let r = executor_post(
        &app,
        me,
        "heartbeat",
        &json!({"roles": [], "environments": {"environments": -1}}),
    )
    .await;
    assert!(r.status() == 422 || r.status() == 400, "{}", r.status());
}
