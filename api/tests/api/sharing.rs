//! Quotas and usage accounting over HTTP: admins set quotas (validated,
//! problem details naming the field), a job beyond its owner's quota waits
//! with the reason, and usage figures are the assignment history's,
//! clipped to the window, each user seeing only its own.

use crate::executors::{place_ring_job, register, ring_spec};
use crate::helpers::{assert_problem, digits_spec, spawn_app_with, TestApp};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

const ADMIN: &str = "sharing-admin-token";

async fn user(app: &TestApp, owner: &str) -> String {
    app.user_token(ADMIN, owner).await
}

async fn put_quota(app: &TestApp, owner: &str, body: Value) -> reqwest::Response {
    app.send_as(
        Method::PUT,
        &format!("/v1/quotas/{owner}"),
        Some(ADMIN),
        Some(&body),
    )
    .await
}

/// Polls the job until its `state_reason` satisfies `want` (the scheduler
/// runs in-process; a round follows each tick).
async fn reason_until(app: &TestApp, id: &str, want: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    for _ in 0..200 {
        let job = app.get_json_as(&format!("/v1/jobs/{id}"), ADMIN).await;
        last = job["state_reason"].as_str().unwrap_or("").to_owned();
        if want(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("state_reason never matched; last: {last}");
}

#[tokio::test]
async fn quotas_are_validated_and_a_job_beyond_its_owners_quota_waits_with_the_reason() {
    let app = spawn_app_with(|c| {
        c.admin_token = Some(ADMIN.into());
        c.heartbeat_interval_ms = 100;
    })
    .await;
    let alice = user(&app, "alice").await;

    // Never set: unlimited.
    let q = app.get_json_as("/v1/quotas/alice", ADMIN).await;
    assert_eq!(q["cpu_workers"], Value::Null, "{q}");
    assert_eq!(q["updated_by"], Value::Null);

    // Every bad input is a problem naming the field.
    assert_problem(
        put_quota(&app, "alice", json!({"cpu_workers": -1})).await,
        422,
        Some("cpu_workers"),
    )
    .await;
    assert_problem(
        put_quota(&app, "alice", json!({"cpu_workers": 2_000_000})).await,
        422,
        Some("cpu_workers"),
    )
    .await;
    assert_problem(
        put_quota(&app, "alice", json!({"ps_ram_bytes": 1u64 << 60})).await,
        422,
        Some("ps_ram_bytes"),
    )
    .await;
    assert_problem(
        put_quota(&app, "alice", json!({"cuda_devices": "four"})).await,
        422,
        Some("cuda_devices"),
    )
    .await;
    let unknown = assert_problem(
        put_quota(&app, "alice", json!({"gpus": 4})).await,
        422,
        None,
    )
    .await;
    assert!(unknown.to_string().contains("gpus"), "{unknown}");
    assert_problem(
        put_quota(&app, "Not%20A%20User", json!({})).await,
        400,
        Some("owner"),
    )
    .await;
    assert_problem(
        app.send_as(Method::GET, "/v1/quotas/Bad!", Some(ADMIN), None)
            .await,
        400,
        Some("owner"),
    )
    .await;
    let r = app
        .send_as(
            Method::PUT,
            "/v1/quotas/alice",
            Some(&alice),
            Some(&json!({})),
        )
        .await;
    assert_problem(r, 403, None).await;

    // One CPU worker at once; the digits spec needs two.
    let r = put_quota(
        &app,
        "alice",
        json!({"cpu_workers": 1, "ps_ram_bytes": 1u64 << 30}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let q: Value = r.json().await.unwrap();
    assert_eq!(q["cpu_workers"], 1);
    assert_eq!(q["cuda_devices"], Value::Null);
    assert_eq!(q["ps_ram_bytes"], 1u64 << 30);
    assert_eq!(q["updated_by"], "admin");
    assert_eq!(q["in_use"]["cpu_workers"], 0);
    let list = app.get_json_as("/v1/quotas", ADMIN).await;
    assert_eq!(list["quotas"][0]["owner"], "alice", "{list}");

    let r = app
        .send_as(
            Method::POST,
            "/v1/jobs",
            Some(&alice),
            Some(&digits_spec("over-quota")),
        )
        .await;
    assert_eq!(r.status(), 201);
    let job: Value = r.json().await.unwrap();
    let id = job["id"].as_str().unwrap();
    let why = reason_until(&app, id, |r| r.contains("quota")).await;
    assert!(
        why.starts_with("waiting: over its owner's quota: alice may hold 1 cpu worker(s) at once"),
        "{why}"
    );
    let job = app.get_json_as(&format!("/v1/jobs/{id}"), ADMIN).await;
    assert_eq!(job["state"], "queued");

    // Lifted: it waits for capacity instead (no executor here).
    let r = put_quota(&app, "alice", json!({})).await;
    assert_eq!(r.status(), 200);
    let why = reason_until(&app, id, |r| {
        r.starts_with("waiting:") && !r.contains("quota")
    })
    .await;
    assert!(why.contains("needs 2 cpu worker"), "{why}");
}

#[tokio::test]
async fn usage_is_the_assignment_history_clipped_to_the_window_and_scoped_to_the_user() {
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into())).await;
    let alice = user(&app, "alice").await;
    let bob = user(&app, "bob").await;
    let submit = |token: String, name: &'static str| {
        let app = &app;
        async move {
            let r = app
                .send_as(
                    Method::POST,
                    "/v1/jobs",
                    Some(&token),
                    Some(&digits_spec(name)),
                )
                .await;
            assert_eq!(r.status(), 201);
            let v: Value = r.json().await.unwrap();
            uuid::Uuid::parse_str(v["id"].as_str().unwrap()).unwrap()
        }
    };
    let a = submit(alice.clone(), "alice-job").await;
    let b = submit(bob.clone(), "bob-job").await;
    // A history as the scheduler writes it: alice's job held 2 CPU workers
    // and 1 GiB of PS RAM for 100 s, then 3 workers for 20 s; bob's 1 CUDA
    // device for 50 s.
    let t0 = chrono::DateTime::parse_from_rfc3339("2026-11-01T10:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    let s = chrono::Duration::seconds;
    for (job, owner, g, cuda, cpu, ram, from, to) in [
        (a, "alice", 1, 0, 2, 1i64 << 30, t0, t0 + s(100)),
        (a, "alice", 2, 0, 3, 0, t0 + s(100), t0 + s(120)),
        (b, "bob", 1, 1, 0, 0, t0 + s(10), t0 + s(60)),
    ] {
        sqlx::query(
            "INSERT INTO usage_intervals (job_id, owner, generation, cuda_devices, cpu_workers, ps_ram_bytes, started_at, ended_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(job)
        .bind(owner)
        .bind(g as i64)
        .bind(cuda)
        .bind(cpu)
        .bind(ram)
        .bind(from)
        .bind(to)
        .execute(&app.db)
        .await
        .unwrap();
    }
    let window = "from=2026-11-01T10:00:00Z&to=2026-11-01T11:00:00Z";
    let all = app.get_json_as(&format!("/v1/usage?{window}"), ADMIN).await;
    let owners = all["owners"].as_array().unwrap();
    assert_eq!(owners.len(), 2, "{all}");
    let alice_row = owners.iter().find(|o| o["owner"] == "alice").unwrap();
    assert_eq!(alice_row["cpu_worker_seconds"], 2.0 * 100.0 + 3.0 * 20.0);
    assert_eq!(alice_row["device_seconds"], 0.0);
    let gib_hours = alice_row["ps_ram_gib_hours"].as_f64().unwrap();
    assert!((gib_hours - 100.0 / 3600.0).abs() < 1e-9, "{gib_hours}");
    assert_eq!(alice_row["jobs"], 1);
    let bob_row = owners.iter().find(|o| o["owner"] == "bob").unwrap();
    assert_eq!(bob_row["device_seconds"], 50.0);
    assert_eq!(all["jobs"].as_array().unwrap().len(), 2);
    assert_eq!(all["jobs"][0]["job_id"], a.to_string(), "most usage first");
    assert_eq!(all["jobs"][0]["name"], "alice-job");

    // Clipped: from 10:01:30, the last 10 s of alice's first interval (2
    // workers) and all 20 s of her second (3 workers) fall in the window;
    // bob's ended before it.
    let clipped = app
        .get_json_as(
            "/v1/usage?from=2026-11-01T10:01:30Z&to=2026-11-01T11:00:00Z",
            ADMIN,
        )
        .await;
    assert_eq!(clipped["owners"].as_array().unwrap().len(), 1, "{clipped}");
    assert_eq!(
        clipped["owners"][0]["cpu_worker_seconds"],
        2.0 * 10.0 + 3.0 * 20.0
    );

    // Users see their own only, whatever they ask.
    let mine = app
        .get_json_as(&format!("/v1/usage?{window}"), &alice)
        .await;
    assert_eq!(mine["owners"].as_array().unwrap().len(), 1);
    assert_eq!(mine["owners"][0]["owner"], "alice");
    assert_eq!(mine["jobs"].as_array().unwrap().len(), 1);
    let snoop = app
        .get_json_as(&format!("/v1/usage?{window}&owner=alice"), &bob)
        .await;
    assert!(snoop["owners"].as_array().unwrap().is_empty(), "{snoop}");
    assert!(snoop["jobs"].as_array().unwrap().is_empty());
    let only_bob = app
        .get_json_as(&format!("/v1/usage?{window}&owner=bob"), ADMIN)
        .await;
    assert_eq!(only_bob["owners"].as_array().unwrap().len(), 1);

    // Prometheus counters carry the same totals.
    let text = app.get("/metrics").await.text().await.unwrap();
    assert!(
        text.lines().any(
            |l| l == "trainyard_usage_worker_seconds_total{device=\"cpu\",owner=\"alice\"} 260"
        ),
        "{}",
        text.lines()
            .filter(|l| l.contains("usage"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(text.contains("trainyard_usage_worker_seconds_total{device=\"cuda\",owner=\"bob\"} 50"));

    // Bad windows name the parameter.
    let bad = |q: &'static str| {
        let app = &app;
        async move {
            app.send_as(Method::GET, &format!("/v1/usage?{q}"), Some(ADMIN), None)
                .await
        }
    };
    assert_problem(bad("from=yesterday").await, 400, Some("from")).await;
    assert_problem(bad("to=2026-13-01T00:00:00Z").await, 400, Some("to")).await;
    assert_problem(
        bad("from=2026-11-01T11:00:00Z&to=2026-11-01T10:00:00Z").await,
        400,
        Some("from"),
    )
    .await;
    assert_problem(bad("owner=No!").await, 400, Some("owner")).await;
    assert_problem(bad("colour=blue").await, 400, Some("query")).await;
}

/// The assignments in executor `id`'s heartbeat answer.
async fn beat(app: &TestApp, id: &str, token: &str) -> Vec<Value> {
    let r = app
        .post_as(
            &format!("/v1/executors/{id}/heartbeat"),
            token,
            &json!({"roles": []}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    v["assignments"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_job_to_be_preempted_is_asked_for_a_checkpoint_until_it_is_called_off() {
    // Nobody beats but this test, and the grace outlasts it: the request
    // stays open until the preemption is called off.
    let app = spawn_app_with(|c| {
        c.heartbeat_misses = 1000;
        c.preemption_grace_secs = 3600;
    })
    .await;
    let (e1, t1) = register(&app, "share-e1").await;
    let (_e2, _t2) = register(&app, "share-e2").await;
    let mut low = digits_spec("low");
    low["priority"] = json!(0);
    let low = place_ring_job(&app, low, 2).await;
    let wanted = |a: &[Value]| -> Vec<bool> {
        a.iter()
            .map(|a| a["checkpoint_wanted"].as_bool().unwrap_or(false))
            .collect()
    };
    assert_eq!(wanted(&beat(&app, &e1, &t1).await), [false]);

    let mut high = ring_spec(digits_spec("high"), 2);
    high["priority"] = json!(5);
    let high = app.submit(&high).await["id"].as_str().unwrap().to_owned();
    // (An open server: every caller is the admin.)
    let mut why = String::new();
    for _ in 0..200 {
        let job = app.get_json(&format!("/v1/jobs/{high}")).await;
        why = job["state_reason"].as_str().unwrap_or("").to_owned();
        if why.contains(&format!("preempting job {low}")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(why.contains("may checkpoint first"), "{why}");
    let a = beat(&app, &e1, &t1).await;
    assert_eq!(wanted(&a), [true], "{a:?}");
    assert_eq!(a[0]["key"]["job_id"], low.as_str());
    let events = app.get_json(&format!("/v1/jobs/{low}/events")).await;
    assert!(
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "preemption"
                && e["reason"]
                    .as_str()
                    .unwrap()
                    .contains("asked for a checkpoint")),
        "{events}"
    );

    // The preemptor no longer needs the room: the request is withdrawn.
    let r = app
        .post_json(&format!("/v1/jobs/{high}/cancel"), &json!({}))
        .await;
    assert_eq!(r.status(), 200);
    for _ in 0..100 {
        if wanted(&beat(&app, &e1, &t1).await) == [false] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(wanted(&beat(&app, &e1, &t1).await), [false]);
    // Still placed: a called-off preemption releases nothing.
    let job = app.get_json(&format!("/v1/jobs/{low}")).await;
    assert_eq!(job["generation"], 1, "{job}");
    assert_ne!(job["state"], "queued", "{job}");
}
