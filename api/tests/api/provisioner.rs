//! `GET /v1/provisioner`, and the local provisioner's failure path with
//! real processes: an executor binary that exits at once is recorded as a
//! failed start, starts back off, and the waiting job says so.

use crate::helpers::{assert_problem, digits_spec, spawn_app, spawn_app_with};
use serde_json::Value;
use std::time::{Duration, Instant};
use trainyard_api::config::ProvisionerKind;

#[tokio::test]
async fn without_a_provisioner_the_status_says_none() {
    let app = spawn_app().await;
    let r = app.get("/v1/provisioner").await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["settings"]["kind"], "none");
    assert_eq!(body["settings"]["max_executors"], 0);
    assert_eq!(body["executors"], serde_json::json!([]));
    assert_eq!(body["events"], serde_json::json!([]));

    for bad in ["limit=0", "limit=1001", "limit=x"] {
        let r = app.get(&format!("/v1/provisioner?{bad}")).await;
        assert_problem(r, 400, Some("limit")).await;
    }
    let r = app.get("/v1/provisioner?colour=red").await;
    assert_problem(r, 400, Some("query")).await;
}

#[tokio::test]
async fn a_start_that_dies_before_registering_backs_off_and_the_job_says_so() {
    let app = spawn_app_with(|c| {
        c.provisioner = ProvisionerKind::Local;
        c.provision_executor_bin = Some("/bin/false".into());
        c.provision_cpus = Some(2.0);
        c.provision_memory_mb = Some(4096);
        c.provision_executor_memory_mb = 1024;
        c.provision_max_executors = 2;
        c.heartbeat_interval_ms = 100;
        c.data_dir = std::env::temp_dir().join(format!("ty-api-prov-{}", uuid::Uuid::new_v4()));
    })
    .await;
    let status: Value = app.get_json("/v1/provisioner").await;
    assert_eq!(status["settings"]["kind"], "local");
    assert_eq!(status["settings"]["max_executors"], 2);

    let mut spec = digits_spec("no-capacity");
    spec["resources"]["memory_mb"] = serde_json::json!(256);
    let job = app.submit(&spec).await["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (events, reason) = loop {
        let s: Value = app.get_json("/v1/provisioner").await;
        let j: Value = app.get_json(&format!("/v1/jobs/{job}")).await;
        let reason = j["state_reason"].as_str().unwrap_or_default().to_owned();
        let events = s["events"].as_array().cloned().unwrap_or_default();
        if events.iter().any(|e| e["kind"] == "failed") && reason.contains("retries starting") {
            break (events, reason);
        }
        assert!(Instant::now() < deadline, "no failed start: {s} / {j}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let failed = events.iter().find(|e| e["kind"] == "failed").unwrap();
    assert!(
        failed["reason"]
            .as_str()
            .unwrap()
            .contains("exited before it registered (exit status 1)"),
        "{failed}"
    );
    assert!(reason.starts_with("waiting"), "{reason}");
    // One start, then the back-off holds: no start storm.
    let starts = events.iter().filter(|e| e["kind"] == "start").count();
    assert_eq!(starts, 1, "{events:?}");
    let s: Value = app.get_json("/v1/provisioner").await;
    let ex = s["executors"].as_array().unwrap();
    assert!(ex.iter().all(|e| e["state"] == "failed"), "{s}");
}
