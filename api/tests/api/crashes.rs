//! A role whose model process dies reports a crash, not a failure: the
//! job tries again in a new generation with the same placement (its roles
//! restart, the crashed replica takes its peers' state or the latest
//! checkpoint), with a `crash` event per try, until the job's model has
//! crashed `MODEL_CRASH_TRIES` times; that crash fails the job, naming
//! the cause and the tries.

use crate::executors::{holder_of_rank, place_ring_job, register};
use crate::helpers::{assert_problem, digits_spec, executor_post, spawn_app_with, TestApp};
use serde_json::{json, Value};
use trainyard_common::cluster::MODEL_CRASH_TRIES;
use trainyard_common::event::{Crash, EventData, EventKind};

async fn job(app: &TestApp, id: &str) -> Value {
    app.get_json(&format!("/v1/jobs/{id}")).await
}

/// The job's `crash` events, decoded, with their reasons.
async fn crashes(app: &TestApp, id: &str) -> Vec<(Crash, String)> {
    let page: Value = app
        .get_json(&format!("/v1/jobs/{id}/events?limit=1000"))
        .await;
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "crash")
        .map(|e| {
            let data = EventData::from_json(EventKind::Crash, &e["data"]).unwrap();
            let EventData::Crash(c) = data else {
                panic!("{e}")
            };
            (c, e["reason"].as_str().unwrap().to_owned())
        })
        .collect()
}

async fn wait_state(app: &TestApp, id: &str, state: &str) {
    for _ in 0..200 {
        if job(app, id).await["state"] == state {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("job {id} never became {state}: {}", job(app, id).await);
}

#[tokio::test]
async fn a_crashing_model_is_tried_again_then_fails_its_job() {
    let app = spawn_app_with(|_| {}).await;
    let holder = register(&app, "holder").await;
    let me = (holder.0.as_str(), holder.1.as_str());
    let id = place_ring_job(&app, digits_spec("crashy"), 1).await;
    assert_eq!(holder_of_rank(&app, &id, 0).await, holder.0);
    let signal = "the model process was killed by SIGSEGV: Segmentation fault";

    for attempt in 1..MODEL_CRASH_TRIES {
        let generation = i64::from(attempt);
        let key = json!({"job_id": id, "generation": generation, "role": "worker", "index": 0});
        // The role runs (its executor says so), then its model crashes.
        let r = executor_post(&app, me, "heartbeat", &json!({"roles": [key]})).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        wait_state(&app, &id, "running").await;
        let crash = json!({"key": key, "outcome": {"crashed": {"reason": signal}}});
        let r = executor_post(&app, me, "reports", &crash).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let ack: Value = r.json().await.unwrap();
        assert_eq!(ack["outcome_applied"], true, "{ack}");

        let j = job(&app, &id).await;
        assert_eq!(j["state"], "recovering", "{j}");
        assert_eq!(j["generation"], generation + 1, "{j}");
        let reason = j["state_reason"].as_str().unwrap();
        assert!(reason.contains("SIGSEGV"), "{reason}");
        assert!(
            reason.contains(&format!("try {} of {MODEL_CRASH_TRIES}", attempt + 1)),
            "{reason}"
        );
        // The same placement, in the new generation.
        assert_eq!(holder_of_rank(&app, &id, 0).await, holder.0);
        let seen = crashes(&app, &id).await;
        assert_eq!(seen.len(), attempt as usize, "{seen:?}");
        let (c, why) = seen.last().unwrap();
        assert_eq!(
            (
                c.index,
                c.generation,
                c.retry_generation,
                c.attempt,
                c.tries
            ),
            (0, generation, generation + 1, attempt, MODEL_CRASH_TRIES),
            "{c:?}"
        );
        assert_eq!(c.executor.to_string(), holder.0);
        assert!(
            why.contains("worker 0 on holder") && why.contains("SIGSEGV"),
            "{why}"
        );

        // A second delivery of the same crash (its answer was lost) is the
        // old generation's: refused, and no second try is spent.
        let again = executor_post(&app, me, "reports", &crash).await;
        assert_problem(again, 409, None).await;
        assert_eq!(crashes(&app, &id).await.len(), attempt as usize);

        // The new generation's reports are its holder's.
        let next =
            json!({"job_id": id, "generation": generation + 1, "role": "worker", "index": 0});
        let r = executor_post(
            &app,
            me,
            "reports",
            &json!({"key": next, "metrics": [{"step": 1, "loss": 2.0, "lr": 0.1, "samples_per_sec": 10.0,
                "data_seconds": 0.0, "compute_seconds": 0.01, "comm_seconds": 0.0}]}),
        )
        .await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }

    // The crash that uses up the tries fails the job with its cause.
    let last = i64::from(MODEL_CRASH_TRIES);
    let key = json!({"job_id": id, "generation": last, "role": "worker", "index": 0});
    let r = executor_post(
        &app,
        me,
        "reports",
        &json!({"key": key, "outcome": {"crashed": {"reason": "the model process exceeded its 512 MiB memory"}}}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let j = job(&app, &id).await;
    assert_eq!(j["state"], "failed", "{j}");
    assert_eq!(j["generation"], last, "no try after the last: {j}");
    let reason = j["state_reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("crashed on each of its {MODEL_CRASH_TRIES} tries"))
            && reason.contains("512 MiB memory"),
        "{reason}"
    );
    assert_eq!(
        crashes(&app, &id).await.len(),
        (MODEL_CRASH_TRIES - 1) as usize
    );
}
