//! `POST /v1/executors/{id}/suspects`: a peer's report never evicts an
//! executor whose data plane answers the scheduler's probe; one whose
//! data-plane address refuses connections is declared lost at once, its
//! roles re-placed, and the job's `suspect` events carry the evidence.
//! Also: long-polling heartbeats are woken by job changes.

use crate::executors::{register_at, ring_spec};
use crate::helpers::{assert_problem, digits_spec, spawn_app, spawn_app_with, TestApp};
use serde_json::{json, Value};
use std::time::Duration;

/// Waits until job `job` is at `generation` or beyond; its generation.
async fn wait_generation(app: &TestApp, job: &str, generation: i64) -> i64 {
    for _ in 0..200 {
        let g = app.get_json(&format!("/v1/jobs/{job}")).await["generation"]
            .as_i64()
            .unwrap();
        if g >= generation {
            return g;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {job} did not reach generation {generation}");
}

async fn suspect_events(app: &TestApp, job: &str) -> Vec<Value> {
    let page = app.get_json(&format!("/v1/jobs/{job}/events")).await;
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "suspect")
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_peer_report_evicts_only_an_executor_whose_data_plane_is_gone() {
    // Nobody heartbeats here: the timeout must not decide first.
    let app = spawn_app_with(|c| c.heartbeat_misses = 120).await;
    // Two executors whose data planes are real listeners of this test.
    let alive = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dying = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (member, member_token) =
        register_at(&app, "peer-a", &alive.local_addr().unwrap().to_string()).await;
    let (other, other_token) =
        register_at(&app, "peer-b", &dying.local_addr().unwrap().to_string()).await;
    let spec = ring_spec(digits_spec("suspected"), 2);
    let job = app.submit(&spec).await["id"].as_str().unwrap().to_owned();
    let generation = wait_generation(&app, &job, 1).await;
    // Joins after the ring of two was placed on peer-a and peer-b.
    let spare = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (outsider, outsider_token) =
        register_at(&app, "outsider", &spare.local_addr().unwrap().to_string()).await;
    let path = |id: &str| format!("/v1/executors/{id}/suspects");
    let report = |suspect: &str, generation: i64, reason: &str| json!({"job_id": job, "generation": generation, "suspect": suspect, "reason": reason});

    // B's data plane answers: one peer's word is not enough, however often
    // it is repeated; the evidence is in one event.
    for _ in 0..2 {
        let r = app
            .post_as(
                &path(&member),
                &member_token,
                &report(&other, generation, "ring broken: connection reset"),
            )
            .await;
        assert_eq!(r.status(), 200);
        let answer: Value = r.json().await.unwrap();
        assert_eq!(answer["verdict"], "rejected", "{answer}");
        assert!(
            answer["evidence"].as_str().unwrap().contains("answered"),
            "{answer}"
        );
    }
    let info = app.get_json(&format!("/v1/executors/{other}")).await;
    assert_eq!(info["state"], "live");
    let events = suspect_events(&app, &job).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["data"]["verdict"], "rejected");
    assert_eq!(events[0]["data"]["probe"]["outcome"], "answered");
    assert_eq!(events[0]["data"]["reporter"], member.as_str());
    assert_eq!(wait_generation(&app, &job, generation).await, generation);

    // Bad reports: no credential, someone else's, the reporter itself, a
    // non-member, a reason too long, an unknown job, an old generation.
    let r = app
        .post_as(&path(&member), "wrong", &report(&other, generation, "x"))
        .await;
    assert_problem(r, 401, None).await;
    let r = app
        .post_as(
            &path(&member),
            &member_token,
            &report(&member, generation, "x"),
        )
        .await;
    assert_problem(r, 422, Some("suspect")).await;
    let r = app
        .post_as(
            &path(&outsider),
            &outsider_token,
            &report(&other, generation, "x"),
        )
        .await;
    assert_problem(r, 409, None).await;
    let r = app
        .post_as(
            &path(&member),
            &member_token,
            &report(&other, generation, &"x".repeat(1001)),
        )
        .await;
    assert_problem(r, 422, Some("reason")).await;
    let mut unknown = report(&other, generation, "x");
    unknown["job_id"] = json!(uuid::Uuid::new_v4());
    let r = app.post_as(&path(&member), &member_token, &unknown).await;
    assert_problem(r, 404, None).await;
    let r = app
        .post_as(
            &path(&member),
            &member_token,
            &report(&other, generation - 1, "x"),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["verdict"], "stale");

    // B's process dies: nothing listens at its address any more. The same
    // report is now confirmed: B is lost at once and its rank re-placed.
    drop(dying);
    let r = app
        .post_as(
            &path(&member),
            &member_token,
            &report(&other, generation, "ring broken: end of stream"),
        )
        .await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["verdict"], "confirmed", "{answer}");
    let info = app.get_json(&format!("/v1/executors/{other}")).await;
    assert_eq!(info["state"], "lost");
    let r = app
        .post_as(
            &format!("/v1/executors/{other}/heartbeat"),
            &other_token,
            &json!({"roles": []}),
        )
        .await;
    assert_problem(r, 410, None).await;
    let events = suspect_events(&app, &job).await;
    let confirmed: Vec<&Value> = events
        .iter()
        .filter(|e| e["data"]["verdict"] == "confirmed")
        .collect();
    assert_eq!(confirmed.len(), 1, "{events:?}");
    assert_eq!(confirmed[0]["data"]["probe"]["outcome"], "refused");
    assert!(confirmed[0]["reason"]
        .as_str()
        .unwrap()
        .contains("end of stream"));
    // The scheduler re-plans without B, onto the outsider (its placement
    // names B lost).
    wait_generation(&app, &job, generation + 1).await;
    let placed = app.get_json(&format!("/v1/jobs/{job}/assignments")).await;
    let hosts: Vec<&str> = placed["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["executor"]["id"].as_str().unwrap())
        .collect();
    assert!(
        hosts.contains(&outsider.as_str()) && !hosts.contains(&other.as_str()),
        "{placed}"
    );
    let page = app.get_json(&format!("/v1/jobs/{job}/events")).await;
    let placement = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| e["kind"] == "placement")
        .unwrap()
        .clone();
    assert!(
        placement["reason"].as_str().unwrap().contains("(lost)"),
        "{placement}"
    );
    // A second report of the lost one is moot.
    let r = app
        .post_as(
            &path(&member),
            &member_token,
            &report(&other, generation + 1, "x"),
        )
        .await;
    assert_eq!(r.status(), 200);
    drop((alive, spare));
}

#[tokio::test]
async fn a_held_heartbeat_answers_with_the_roles_a_new_job_gives_it() {
    let app = spawn_app().await;
    let (id, token) = register_at(&app, "poller", "127.0.0.1:7070").await;
    // Nothing assigned: the beat is held (up to its wait) until a job
    // changes; the submit below places a one-rank ring on it.
    let held = {
        let app_url = app.url(&format!("/v1/executors/{id}/heartbeat"));
        let client = app.client.clone();
        let token = token.clone();
        tokio::spawn(async move {
            client
                .post(app_url)
                .bearer_auth(token)
                .json(&json!({"roles": [], "wait_ms": 1000}))
                .send()
                .await
                .unwrap()
        })
    };
    let spec = ring_spec(digits_spec("polled"), 1);
    let job = app.submit(&spec).await["id"].as_str().unwrap().to_owned();
    let r = held.await.unwrap();
    assert_eq!(r.status(), 200);
    let first: Value = r.json().await.unwrap();
    // Either the placement landed during the hold (and woke it) or the
    // hold ran out first; the next held beat gets it in any case.
    let assignments = if first["assignments"].as_array().unwrap().is_empty() {
        wait_generation(&app, &job, 1).await;
        let r = app
            .post_as(
                &format!("/v1/executors/{id}/heartbeat"),
                &token,
                &json!({"roles": [], "wait_ms": 1000}),
            )
            .await;
        r.json::<Value>().await.unwrap()["assignments"].clone()
    } else {
        first["assignments"].clone()
    };
    let key = assignments[0]["key"].clone();
    assert_eq!(key["job_id"], job.as_str());
    // Running what it is assigned, a held beat still refreshes liveness
    // and answers with the same roles when nothing changes.
    let before = app.get_json(&format!("/v1/executors/{id}")).await["last_heartbeat_at"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .post_as(
            &format!("/v1/executors/{id}/heartbeat"),
            &token,
            &json!({"roles": [key], "wait_ms": 200}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let again: Value = r.json().await.unwrap();
    assert_eq!(again["assignments"][0]["key"], key);
    let info = app.get_json(&format!("/v1/executors/{id}")).await;
    let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap();
    assert!(
        at(info["last_heartbeat_at"].as_str().unwrap()) > at(&before),
        "{info}"
    );
    // A wait that is not a number is a 400/422 naming nothing worse.
    let r = app
        .post_as(
            &format!("/v1/executors/{id}/heartbeat"),
            &token,
            &json!({"roles": [], "wait_ms": "soon"}),
        )
        .await;
    assert!(r.status() == 400 || r.status() == 422, "{}", r.status());
}

#[tokio::test]
async fn the_heartbeat_wakeup_moves_on_a_job_notification() {
    let app = spawn_app().await;
    let wake = trainyard_api::wakeup::Wakeup::new(app.db.clone());
    let mut rx = wake.subscribe();
    rx.borrow_and_update();
    // Until the listener is up, notifications are missed: send until one
    // arrives (bounded).
    let mut woke = false;
    for _ in 0..100 {
        sqlx::query("SELECT pg_notify('trainyard_jobs', 'x')")
            .execute(&app.db)
            .await
            .unwrap();
        if tokio::time::timeout(Duration::from_millis(100), rx.changed())
            .await
            .is_ok()
        {
            woke = true;
            break;
        }
    }
    assert!(woke, "no wakeup after 100 notifications");
}

/// Sets executor `id`'s last heartbeat `secs` seconds in the past.
async fn silent_for(app: &TestApp, id: &str, secs: f64) {
    sqlx::query(
        "UPDATE executors SET last_heartbeat_at = clock_timestamp() - make_interval(secs => $2) WHERE id = $1::uuid",
    )
    .bind(id)
    .bind(secs)
    .execute(&app.db)
    .await
    .unwrap();
}

async fn state_of(app: &TestApp, id: &str) -> String {
    app.get_json(&format!("/v1/executors/{id}")).await["state"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_cut_around_the_api_evicts_nobody_though_the_last_beats_differ() {
    // A 4 s timeout. When the API is cut off, its executors' last beats
    // lie up to a beat apart: the first to pass the timeout must not be
    // declared lost because the other's (older than half the timeout, but
    // not yet the whole) still counts as heard.
    let app = spawn_app_with(|c| {
        c.heartbeat_interval_ms = 1000;
        c.heartbeat_misses = 4;
    })
    .await;
    // Their data planes listen: the probe of a silent one does not answer
    // "refused" (the lab's cut makes it time out; here it connects).
    let la = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let lb = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (a, _) = register_at(&app, "cut-a", &la.local_addr().unwrap().to_string()).await;
    let (b, _) = register_at(&app, "cut-b", &lb.local_addr().unwrap().to_string()).await;
    // A new leader judges nobody for its first timeout: both beat until
    // it does.
    for _ in 0..25 {
        silent_for(&app, &a, 0.0).await;
        silent_for(&app, &b, 0.0).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    silent_for(&app, &a, 4.5).await;
    silent_for(&app, &b, 3.0).await;
    // Several rounds (one each half interval) see this.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(state_of(&app, &a).await, "live", "a was declared lost");
    assert_eq!(state_of(&app, &b).await, "live", "b was declared lost");

    // Heard again: the one still silent is judged by the timeout once the
    // others' beats had a timeout to arrive.
    let started = std::time::Instant::now();
    loop {
        silent_for(&app, &b, 0.0).await;
        if state_of(&app, &a).await == "lost" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "a silent executor beside one that beats was never declared lost"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(state_of(&app, &b).await, "live");
}

#[tokio::test]
async fn a_fleet_that_died_is_lost_at_the_timeout_though_nobody_is_heard() {
    // Both silent past the 4 s timeout, and nothing listens where their
    // data planes were: the hosts answer, the processes are gone. Not a
    // cut around the API, so no 60 s grace.
    let app = spawn_app_with(|c| {
        c.heartbeat_interval_ms = 1000;
        c.heartbeat_misses = 4;
    })
    .await;
    let gone = |l: std::net::TcpListener| l.local_addr().unwrap().to_string();
    let a_addr = gone(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let b_addr = gone(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let (a, _) = register_at(&app, "dead-a", &a_addr).await;
    let (b, _) = register_at(&app, "dead-b", &b_addr).await;
    for _ in 0..25 {
        silent_for(&app, &a, 0.0).await;
        silent_for(&app, &b, 0.0).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    silent_for(&app, &a, 4.5).await;
    silent_for(&app, &b, 4.4).await;
    let started = std::time::Instant::now();
    while state_of(&app, &a).await != "lost" || state_of(&app, &b).await != "lost" {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "a dead fleet waited for the partition grace: {} {}",
            state_of(&app, &a).await,
            state_of(&app, &b).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
