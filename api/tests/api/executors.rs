//! `/v1/executors`: registration credentials, bad resources, heartbeats
//! from unknown, lost and departed executors, drain and leave, and the
//! scheduler placing a job on registered executors.

use crate::helpers::{assert_problem, digits_spec, spawn_app, spawn_app_with, TestApp};
use serde_json::{json, Value};
use std::time::Duration;

pub fn registration(name: &str) -> Value {
    json!({
        "name": name,
        "address": "127.0.0.1:7070",
        "resources": {
            "devices": [{"kind": "cpu", "index": 0, "name": "cpu", "memory_bytes": 4u64 << 30}],
            "cpu_cores": 2,
            "ram_bytes": 4u64 << 30
        },
        "labels": {"host": "test-host"}
    })
}

pub async fn register(app: &TestApp, name: &str) -> (String, String) {
    register_at(app, name, "127.0.0.1:7070").await
}

/// Registers executor `name` whose data plane is at `address`: its id and
/// token.
pub async fn register_at(app: &TestApp, name: &str, address: &str) -> (String, String) {
    let mut body = registration(name);
    body["address"] = json!(address);
    register_body(app, &body).await
}

/// Posts `body` as a registration with the join token: the answer.
pub async fn post_registration(app: &TestApp, body: &Value) -> reqwest::Response {
    app.client
        .post(app.url("/v1/executors"))
        .bearer_auth("test-join-token")
        .json(body)
        .send()
        .await
        .unwrap()
}

/// Registers the executor `body` describes: its id and token.
pub async fn register_body(app: &TestApp, body: &Value) -> (String, String) {
    let r = post_registration(app, body).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let body: Value = r.json().await.unwrap();
    (
        body["id"].as_str().unwrap().to_owned(),
        body["token"].as_str().unwrap().to_owned(),
    )
}

/// `spec` as a ring of exactly `ranks` workers.
pub fn ring_spec(mut spec: Value, ranks: u32) -> Value {
    spec["strategy"] = json!("allreduce");
    spec["workers"] = json!({"min": ranks, "max": ranks});
    let o = spec.as_object_mut().unwrap();
    o.remove("parameter_servers");
    o.remove("consistency");
    spec
}

async fn heartbeat(app: &TestApp, id: &str, token: &str, roles: Value) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/v1/executors/{id}/heartbeat")))
        .bearer_auth(token)
        .json(&json!({"roles": roles}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn registration_needs_the_join_token() {
    let app = spawn_app().await;
    let r = app
        .client
        .post(app.url("/v1/executors"))
        .json(&registration("x"))
        .send()
        .await
        .unwrap();
    assert_problem(r, 401, Some("Authorization")).await;
    let r = app
        .client
        .post(app.url("/v1/executors"))
        .bearer_auth("wrong")
        .json(&registration("x"))
        .send()
        .await
        .unwrap();
    assert_problem(r, 401, None).await;
    let (id, token) = register(&app, "ok").await;
    assert_eq!(token.len(), 64);
    let info: Value = app
        .get(&format!("/v1/executors/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(info["state"], "live");
    assert_eq!(info["labels"]["host"], "test-host");
    assert!(
        info.get("token_hash").is_none() && !info.to_string().contains(&token),
        "credentials never leave"
    );
}

#[tokio::test]
async fn absurd_resources_are_422_naming_each_field() {
    let app = spawn_app().await;
    let mut bad = registration("x");
    bad["resources"]["ram_bytes"] = json!(1u64 << 60);
    bad["resources"]["cpu_cores"] = json!(0);
    bad["resources"]["devices"][0]["memory_bytes"] = json!(0);
    bad["address"] = json!("no-port");
    let r = app
        .client
        .post(app.url("/v1/executors"))
        .bearer_auth("test-join-token")
        .json(&bad)
        .send()
        .await
        .unwrap();
    let p = assert_problem(r, 422, Some("resources.ram_bytes")).await;
    let fields: Vec<&str> = p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    for f in [
        "resources.cpu_cores",
        "resources.devices[0].memory_bytes",
        "address",
    ] {
        assert!(fields.contains(&f), "{f} not in {fields:?}");
    }
    let mut none = registration("x");
    none["resources"]["devices"] = json!([]);
    let r = app
        .client
        .post(app.url("/v1/executors"))
        .bearer_auth("test-join-token")
        .json(&none)
        .send()
        .await
        .unwrap();
    assert_problem(r, 422, Some("resources.devices")).await;
    let mut neg = registration("x");
    neg["resources"]["ram_bytes"] = json!(-5);
    let r = app
        .client
        .post(app.url("/v1/executors"))
        .bearer_auth("test-join-token")
        .json(&neg)
        .send()
        .await
        .unwrap();
    assert_problem(r, 422, Some("resources.ram_bytes")).await;
}

#[tokio::test]
async fn heartbeats_from_unknown_lost_or_departed_executors_are_refused() {
    let app = spawn_app().await;
    let r = heartbeat(&app, "0190b2c4-0000-7000-8000-000000000000", "x", json!([])).await;
    assert_problem(r, 404, None).await;
    let (id, token) = register(&app, "hb").await;
    assert_problem(
        heartbeat(&app, &id, "wrong-token", json!([])).await,
        401,
        None,
    )
    .await;
    let r = heartbeat(&app, &id, &token, json!([])).await;
    assert_eq!(r.status(), 200);
    let hb: Value = r.json().await.unwrap();
    assert_eq!(hb["state"], "live");
    assert_eq!(hb["assignments"], json!([]));
    let r = heartbeat(&app, &id, &token, json!([{"job_id": "x"}])).await;
    assert_problem(r, 422, None).await;

    sqlx::query("UPDATE executors SET state = 'lost' WHERE id = $1::uuid")
        .bind(&id)
        .execute(&app.db)
        .await
        .unwrap();
    let p = assert_problem(heartbeat(&app, &id, &token, json!([])).await, 410, None).await;
    assert!(p["detail"].as_str().unwrap().contains("register again"));

    let (id2, token2) = register(&app, "leaver").await;
    let r = app
        .client
        .delete(app.url(&format!("/v1/executors/{id2}")))
        .bearer_auth(&token2)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_problem(heartbeat(&app, &id2, &token2, json!([])).await, 410, None).await;
}

#[tokio::test]
async fn a_job_is_placed_on_registered_executors_and_drain_moves_it() {
    let app = spawn_app().await;
    let (a, ta) = register(&app, "a").await;
    let (b, tb) = register(&app, "b").await;
    let spec = ring_spec(digits_spec("placed"), 1);
    let job = app.submit(&spec).await;
    let id = job["id"].as_str().unwrap().to_owned();

    // The scheduler assigns one worker; heartbeats deliver it.
    let mut holder = None;
    for _ in 0..50 {
        for (e, t) in [(&a, &ta), (&b, &tb)] {
            let hb: Value = heartbeat(&app, e, t, json!([])).await.json().await.unwrap();
            if let Some(asg) = hb["assignments"].as_array().unwrap().first() {
                assert_eq!(asg["key"]["job_id"], id.as_str());
                assert_eq!(asg["strategy"], "allreduce");
                assert_eq!(asg["secret"].as_str().unwrap().len(), 64);
                assert_eq!(asg["workers"].as_array().unwrap().len(), 1);
                holder = Some((e.clone(), t.clone(), asg["key"].clone()));
            }
        }
        if holder.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (e, t, key) = holder.expect("assigned within 5 s");
    let j: Value = app
        .get(&format!("/v1/jobs/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(j["state"], "scheduling");
    assert_eq!(j["generation"], 1);

    // Reporting the role running moves the job to running.
    heartbeat(&app, &e, &t, json!([key])).await;
    let mut state = String::new();
    for _ in 0..50 {
        let j: Value = app
            .get(&format!("/v1/jobs/{id}"))
            .await
            .json()
            .await
            .unwrap();
        state = j["state"].as_str().unwrap().to_owned();
        if state == "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, "running");

    // Leaving while holding a role is refused; a drain moves the role.
    let r = app
        .client
        .delete(app.url(&format!("/v1/executors/{e}")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_problem(r, 409, None).await;
    let r = app
        .client
        .post(app.url(&format!("/v1/executors/{e}/drain")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut moved = false;
    for _ in 0..50 {
        let info: Value = app
            .get(&format!("/v1/executors/{e}"))
            .await
            .json()
            .await
            .unwrap();
        if info["roles"].as_array().unwrap().is_empty() {
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(moved, "the drained executor still holds its role");
    let j: Value = app
        .get(&format!("/v1/jobs/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(j["generation"], 2);
    assert_eq!(j["state"], "recovering");
    let r = app
        .client
        .delete(app.url(&format!("/v1/executors/{e}")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let list: Value = app
        .get("/v1/executors?state=left")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(list["executors"].as_array().unwrap().len(), 1);
    assert_problem(
        app.get("/v1/executors?state=gone").await,
        400,
        Some("state"),
    )
    .await;
}

#[tokio::test]
async fn a_job_that_cannot_be_placed_stays_queued_with_its_reason() {
    let app = spawn_app().await;
    register(&app, "small").await;
    let mut spec = digits_spec("too-big");
    spec["workers"] = json!({"min": 3, "max": 3});
    let job = app.submit(&spec).await;
    let id = job["id"].as_str().unwrap().to_owned();
    let mut reason = String::new();
    for _ in 0..50 {
        let j: Value = app
            .get(&format!("/v1/jobs/{id}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(j["state"], "queued");
        reason = j["state_reason"].as_str().unwrap().to_owned();
        if reason.starts_with("waiting:") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reason.contains("needs 3 cpu worker device(s)"), "{reason}");
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("trainyard_scheduler_queue_length 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("trainyard_scheduler_live_executors 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("trainyard_scheduler_leader 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn higher_priority_is_placed_first() {
    let app = spawn_app().await;
    let mut spec = ring_spec(digits_spec("low"), 1);
    spec["resources"] = json!({"memory_mb": 3000});
    let low = app.submit(&spec).await["id"].as_str().unwrap().to_owned();
    spec["name"] = json!("high");
    spec["priority"] = json!(10);
    let high = app.submit(&spec).await["id"].as_str().unwrap().to_owned();
    // One executor with room for one of them.
    register(&app, "only").await;
    let mut placed = None;
    for _ in 0..50 {
        let h: Value = app
            .get(&format!("/v1/jobs/{high}"))
            .await
            .json()
            .await
            .unwrap();
        if h["generation"] == 1 {
            placed = Some(h);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(placed.expect("high placed")["state"], "scheduling");
    let l: Value = app
        .get(&format!("/v1/jobs/{low}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(l["state"], "queued");
    assert_eq!(l["generation"], 0);
    assert!(
        l["state_reason"].as_str().unwrap().starts_with("waiting:"),
        "{l}"
    );
}

#[tokio::test]
async fn reports_are_idempotent_sanitized_and_outcomes_need_the_current_generation() {
    let (app, id, token, job) = one_rank_job_placed("reported").await;
    let report = json!({
        "key": {"job_id": job, "generation": 1, "role": "worker", "index": 0},
        "metrics": [{"step": 1, "loss": 2.5, "lr": 0.1, "samples_per_sec": 100.0, "data_seconds": 0.01, "compute_seconds": 0.02, "comm_seconds": 0.0}],
        "logs": [{"seq": 1, "at_ms": 0, "level": "info", "message": "a\u{0}b"}]
    });
    let url = app.url(&format!("/v1/executors/{id}/reports"));
    for expected in [1, 0] {
        let r = app
            .client
            .post(&url)
            .bearer_auth(&token)
            .json(&report)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let ack: Value = r.json().await.unwrap();
        assert_eq!(
            ack["metrics_stored"], expected,
            "a retry stores nothing twice"
        );
        assert_eq!(ack["logs_stored"], expected);
    }
    let logs: Value = app
        .get(&format!("/v1/jobs/{job}/logs"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(logs["lines"][0]["message"], "ab");
    let m: Value = app
        .get(&format!("/v1/jobs/{job}/metrics"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(m["steps_recorded"], 1);
    let r = app
        .get(&format!("/v1/jobs/{job}/metrics?max_points=0"))
        .await;
    assert_problem(r, 400, Some("max_points")).await;
    let r = app
        .get("/v1/jobs/0190b2c4-0000-7000-8000-000000000000/logs")
        .await;
    assert_problem(r, 404, None).await;

    // The role moves to another executor (generation 2): the first one's
    // outcome is a stale generation's.
    let (other, _) = register(&app, "reported-other").await;
    let r = app
        .client
        .post(app.url(&format!("/v1/executors/{id}/drain")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_for_generation(&app, &job, 2).await;
    assert_eq!(holder_of_rank(&app, &job, 0).await, other);
    let mut stale = report.clone();
    stale["outcome"] = json!({"failed": {"reason": "x"}});
    let r = app
        .client
        .post(&url)
        .bearer_auth(&token)
        .json(&stale)
        .send()
        .await
        .unwrap();
    assert_problem(r, 409, None).await;
    let j: Value = app
        .get(&format!("/v1/jobs/{job}"))
        .await
        .json()
        .await
        .unwrap();
    assert_ne!(j["state"], "failed");
    let r = app
        .client
        .post(&url)
        .bearer_auth("wrong")
        .json(&report)
        .send()
        .await
        .unwrap();
    assert_problem(r, 401, None).await;
    let mut bad = report.clone();
    bad["metrics"][0]["step"] = json!(0);
    let r = app
        .client
        .post(&url)
        .bearer_auth(&token)
        .json(&bad)
        .send()
        .await
        .unwrap();
    assert_problem(r, 422, Some("metrics[0].step")).await;
}

#[tokio::test]
async fn metrics_report_bus_bandwidth_and_the_ps_staleness_of_every_worker() {
    let app = spawn_app().await;
    let mut tokens = std::collections::HashMap::new();
    for name in ["ps-reporter-0", "ps-reporter-1"] {
        let (id, token) = register(&app, name).await;
        tokens.insert(id, token);
    }
    // Two ranks, each reporting as the executor that holds it.
    let job = place_ring_job(&app, digits_spec("ps-metrics"), 2).await;
    // Rank 0 and rank 1 each report two steps with their staleness and
    // rejections; 2 MB in 0.01 s per step is 0.2 GB/s.
    for (index, staleness, rejected) in [(0, [0, 1], [0, 2]), (1, [2, 12], [1, 0])] {
        let id = holder_of_rank(&app, &job, index).await;
        let token = &tokens[&id];
        let url = app.url(&format!("/v1/executors/{id}/reports"));
        let metrics: Vec<Value> = (0..2)
            .map(|i| {
                json!({"step": i + 1, "loss": 1.0, "lr": 0.1, "samples_per_sec": 10.0, "data_seconds": 0.0,
                       "compute_seconds": 0.01, "comm_seconds": 0.01, "comm_bytes": 2_000_000,
                       "staleness": staleness[i], "rejected": rejected[i]})
            })
            .collect();
        let r = app
            .client
            .post(&url)
            .bearer_auth(token)
            .json(&json!({"key": {"job_id": job, "generation": 1, "role": "worker", "index": index}, "metrics": metrics}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    let m: Value = app
        .get(&format!("/v1/jobs/{job}/metrics"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(m["steps_recorded"], 2, "the curve is rank 0's: {m}");
    let bus = m["points"][0]["bus_gbps"].as_f64().unwrap();
    assert!((bus - 0.2).abs() < 1e-9, "{m}");
    assert_eq!(m["points"][0]["comm_bytes"], 2_000_000.0);
    // Staleness 12 lands in the last bucket ("8 or more").
    assert_eq!(
        m["staleness_histogram"],
        json!([1, 1, 1, 0, 0, 0, 0, 0, 1]),
        "{m}"
    );
    assert_eq!(m["rejected_pushes"], 3);
}

/// A fresh app with one executor and a one-rank ring job placed on it at
/// generation 1: the app, the executor's id and credential, the job's id.
async fn one_rank_job_placed(name: &str) -> (TestApp, String, String, String) {
    // Its executor never heartbeats: with the tests' 3 missed beats it is
    // declared lost after 3 s, which a loaded machine can take between
    // two calls. These tests are about reports, not about loss.
    let app = spawn_app_with(|c| c.heartbeat_misses = 120).await;
    let (id, token) = register(&app, &format!("{name}-executor")).await;
    let job = place_ring_job(&app, digits_spec(name), 1).await;
    (app, id, token, job)
}

/// Submits `spec` as a ring job of exactly `ranks` workers and waits until
/// the scheduler has placed it (generation 1) on the registered executors.
pub async fn place_ring_job(app: &TestApp, spec: Value, ranks: u32) -> String {
    let spec = ring_spec(spec, ranks);
    let job = app.submit(&spec).await["id"].as_str().unwrap().to_owned();
    wait_for_generation(app, &job, 1).await;
    job
}

/// Waits until job `job` is at generation `generation`.
pub async fn wait_for_generation(app: &TestApp, job: &str, generation: i64) {
    for _ in 0..200 {
        let j: Value = app.get_json(&format!("/v1/jobs/{job}")).await;
        if j["generation"] == generation {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("job {job} never reached generation {generation}");
}

/// The executor id holding rank `rank` of job `job` now.
pub async fn holder_of_rank(app: &TestApp, job: &str, rank: u64) -> String {
    let a: Value = app.get_json(&format!("/v1/jobs/{job}/assignments")).await;
    a["workers"]
        .as_array()
        .unwrap_or_else(|| panic!("{a}"))
        .iter()
        .find(|w| w["rank"] == rank)
        .unwrap_or_else(|| panic!("no rank {rank} in {a}"))["executor"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn an_outcome_without_a_known_loss_says_so_instead_of_a_sentinel() {
    let (app, id, token, job) = one_rank_job_placed("late").await;
    // A rank that joined after the last step reports f64::MAX: no loss of
    // its own (JSON has no NaN).
    let report = json!({
        "key": {"job_id": job, "generation": 1, "role": "worker", "index": 0},
        "outcome": {"succeeded": {"steps": 920, "final_loss": null, "eval_loss": 0.1,
                    "eval_accuracy": 0.975, "weights_url": "file:///tmp/w.safetensors"}}
    });
    let r = app
        .post_as(&format!("/v1/executors/{id}/reports"), &token, &report)
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let j: Value = app.get_json(&format!("/v1/jobs/{job}")).await;
    assert_eq!(j["state"], "succeeded");
    assert_eq!(
        j["state_reason"],
        "trained 920 steps: final loss not known to the reporting rank, held-out accuracy 97.5%"
    );
    let ev: Value = app.get_json(&format!("/v1/jobs/{job}/events")).await;
    let result = ev["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "result")
        .unwrap()
        .clone();
    assert_eq!(result["data"]["final_loss"], Value::Null, "{result}");
}

#[tokio::test]
async fn a_retried_outcome_ends_the_job_once() {
    let (app, id, token, job) = one_rank_job_placed("retried").await;
    // The executor sends its outcome again when the answer is lost (the
    // API or its database connection died after the commit).
    let report = json!({
        "key": {"job_id": job, "generation": 1, "role": "worker", "index": 0},
        "outcome": {"succeeded": {"steps": 920, "final_loss": 0.01, "eval_loss": 0.1,
                    "eval_accuracy": 0.975, "weights_url": "file:///tmp/w.safetensors"}}
    });
    let url = format!("/v1/executors/{id}/reports");
    let r = app.post_as(&url, &token, &report).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let first: Value = r.json().await.unwrap();
    assert_eq!(first["outcome_applied"], true);
    let r = app.post_as(&url, &token, &report).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let again: Value = r.json().await.unwrap();
    assert_eq!(again["outcome_applied"], false, "{again}");
    let ev: Value = app.get_json(&format!("/v1/jobs/{job}/events")).await;
    let events = ev["events"].as_array().unwrap();
    assert_eq!(
        events.iter().filter(|e| e["kind"] == "result").count(),
        1,
        "{ev}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| e["to_state"] == "succeeded")
            .count(),
        1,
        "{ev}"
    );
}

#[tokio::test]
async fn a_device_held_by_a_stopped_roles_process_is_not_given_to_another_job() {
    let app = spawn_app_with(|_| {}).await;
    let (id, token) = register(&app, "holding").await;
    let beat = |held: Value| {
        let (app, id, token) = (&app, id.clone(), token.clone());
        async move {
            app.client
                .post(app.url(&format!("/v1/executors/{id}/heartbeat")))
                .bearer_auth(token)
                .json(&json!({"roles": [], "held": held}))
                .send()
                .await
                .unwrap()
        }
    };
    // Its only device is held by a cancelled job's model process.
    let gone = uuid::Uuid::new_v4();
    let r = beat(json!([{"job_id": gone, "kind": "cpu", "index": 0}])).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let job = app.submit(&ring_spec(digits_spec("waits"), 1)).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let j: Value = app.get_json(&format!("/v1/jobs/{job}")).await;
    assert_eq!(j["state"], "queued", "{j}");
    assert_eq!(j["generation"], 0, "{j}");
    // The process exited: the next heartbeat says so and the job starts.
    let r = beat(json!([])).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    wait_for_generation(&app, &job, 1).await;
    assert_eq!(holder_of_rank(&app, &job, 0).await, id);

    // Bounded like the roles it reports.
    let many: Vec<Value> = (0..=trainyard_common::cluster::MAX_REPORTED_ROLES)
        .map(|i| json!({"job_id": gone, "kind": "cpu", "index": i}))
        .collect();
    let r = beat(json!(many)).await;
    assert_problem(r, 422, Some("held")).await;
    let r = beat(json!([{"job_id": gone, "kind": "tpu", "index": 0}])).await;
    assert_eq!(r.status(), 422);
}
