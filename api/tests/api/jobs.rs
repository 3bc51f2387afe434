//! `/v1/jobs`: every endpoint, every error class, idempotent submit,
//! pagination and cancel races.

use crate::helpers::{assert_problem, digits_spec, spawn_app, TestApp};
use futures::future::join_all;
use serde_json::{json, Value};
use std::collections::HashSet;

async fn job_id(app: &TestApp, name: &str) -> String {
    app.submit(&digits_spec(name)).await["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn submit_returns_201_with_location_and_the_job() {
    let app = spawn_app().await;
    let r = app.post_json("/v1/jobs", &digits_spec("digits")).await;
    assert_eq!(r.status(), 201);
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    assert!(r.headers().get("idempotent-replayed").is_none());
    let job: Value = r.json().await.unwrap();
    assert_eq!(
        location,
        format!("/v1/jobs/{}", job["id"].as_str().unwrap())
    );
    assert_eq!(job["state"], "queued");
    assert_eq!(job["name"], "digits");
    assert_eq!(job["generation"], 0);
    assert_eq!(job["strategy"], "parameter_server");
    // 64·128+128 + 128·10+10 parameters.
    assert_eq!(job["estimate"]["parameters"], 9610);
    assert_eq!(
        job["spec"]["checkpoint"]["keep"], 3,
        "defaults are filled in"
    );
    let got: Value = app.get(&location).await.json().await.unwrap();
    // The scheduler may already have noted why it waits (no executors here).
    for field in [
        "id",
        "name",
        "spec",
        "estimate",
        "created_at",
        "generation",
        "strategy",
    ] {
        assert_eq!(got[field], job[field], "{field}");
    }
}

#[tokio::test]
async fn auto_strategy_stays_auto_until_the_scheduler_decides() {
    let app = spawn_app().await;
    let mut spec = digits_spec("auto");
    spec["strategy"] = json!("auto");
    let job = app.submit(&spec).await;
    assert_eq!(job["strategy"], "auto");
    assert_eq!(job["spec"]["strategy"], "auto");
}

#[tokio::test]
async fn submit_writes_a_submitted_event_in_the_same_transaction() {
    let app = spawn_app().await;
    let id = job_id(&app, "ev").await;
    let page: Value = app
        .get(&format!("/v1/jobs/{id}/events"))
        .await
        .json()
        .await
        .unwrap();
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["kind"], "submitted");
    assert_eq!(events[0]["to_state"], "queued");
    assert_eq!(events[0]["from_state"], Value::Null);
    assert_eq!(page["next_after"], Value::Null);
}

#[tokio::test]
async fn malformed_json_is_400() {
    let app = spawn_app().await;
    for body in ["{\"name\": ", "not json", "", "[1,2"] {
        let r = app
            .client
            .post(app.url("/v1/jobs"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let p = assert_problem(r, 400, None).await;
        assert_eq!(p["type"], "/problems/malformed-json", "{body:?}");
    }
}

#[tokio::test]
async fn wrong_content_type_is_415_naming_the_header() {
    let app = spawn_app().await;
    let body = serde_json::to_string(&digits_spec("x")).unwrap();
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/jsonx"),
    ] {
        let mut req = app.client.post(app.url("/v1/jobs")).body(body.clone());
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        assert_problem(req.send().await.unwrap(), 415, Some("Content-Type")).await;
    }
    // Parameters and +json types are fine.
    for ct in [
        "application/json; charset=utf-8",
        "application/vnd.trainyard+json",
    ] {
        let r = app
            .client
            .post(app.url("/v1/jobs"))
            .header("content-type", ct)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{ct}");
    }
}

#[tokio::test]
async fn oversized_body_is_413() {
    let app = spawn_app().await;
    let mut spec = digits_spec("big");
    spec["name"] = json!("x".repeat(2 << 20));
    let r = app.post_json("/v1/jobs", &spec).await;
    let p = assert_problem(r, 413, Some("body")).await;
    assert!(p["detail"].as_str().unwrap().contains("1048576"));
}

#[tokio::test]
async fn invalid_spec_is_422_listing_every_violation() {
    let app = spawn_app().await;
    let mut spec = digits_spec("");
    spec["batch_size"] = json!(0);
    spec["optimizer"]["lr"] = json!(50.0);
    spec["workers"] = json!({"min": 3, "max": 2});
    spec["parameter_servers"] = json!(0);
    let r = app.post_json("/v1/jobs", &spec).await;
    let p = assert_problem(r, 422, Some("name")).await;
    let fields: HashSet<&str> = p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    for f in [
        "name",
        "batch_size",
        "optimizer.lr",
        "workers.max",
        "parameter_servers",
    ] {
        assert!(fields.contains(f), "{f} not in {fields:?}");
    }
    // Nothing was stored.
    let page: Value = app.get("/v1/jobs").await.json().await.unwrap();
    assert_eq!(page["jobs"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn unknown_and_mistyped_fields_are_422_with_their_path() {
    let app = spawn_app().await;
    let mut spec = digits_spec("u");
    spec["optimizer"]["learning_rate"] = json!(0.1);
    let p = assert_problem(
        app.post_json("/v1/jobs", &spec).await,
        422,
        Some("optimizer.learning_rate"),
    )
    .await;
    assert!(p["errors"][0]["message"]
        .as_str()
        .unwrap()
        .contains("learning_rate"));
    let mut spec = digits_spec("t");
    spec["workers"]["min"] = json!("two");
    assert_problem(
        app.post_json("/v1/jobs", &spec).await,
        422,
        Some("workers.min"),
    )
    .await;
    let p = assert_problem(app.post_json("/v1/jobs", &json!([1, 2])).await, 422, None).await;
    assert!(p["errors"].is_array());
}

#[tokio::test]
async fn unknown_id_is_404_and_non_uuid_is_400() {
    let app = spawn_app().await;
    let missing = "0190b2c4-0000-7000-8000-000000000000";
    assert_problem(app.get(&format!("/v1/jobs/{missing}")).await, 404, None).await;
    assert_problem(
        app.post_empty(&format!("/v1/jobs/{missing}/cancel")).await,
        404,
        None,
    )
    .await;
    assert_problem(
        app.get(&format!("/v1/jobs/{missing}/events")).await,
        404,
        None,
    )
    .await;
    for bad in ["nope", "123", "0190b2c4-0000-7000-8000-00000000000g"] {
        assert_problem(app.get(&format!("/v1/jobs/{bad}")).await, 400, Some("id")).await;
        assert_problem(
            app.post_empty(&format!("/v1/jobs/{bad}/cancel")).await,
            400,
            Some("id"),
        )
        .await;
        assert_problem(
            app.get(&format!("/v1/jobs/{bad}/events")).await,
            400,
            Some("id"),
        )
        .await;
    }
}

#[tokio::test]
async fn idempotent_submit_returns_the_same_job() {
    let app = spawn_app().await;
    let spec = digits_spec("idem");
    let send = |key: &'static str, spec: Value| {
        let app = &app;
        async move {
            app.client
                .post(app.url("/v1/jobs"))
                .header("Idempotency-Key", key)
                .json(&spec)
                .send()
                .await
                .unwrap()
        }
    };
    let first = send("key-1", spec.clone()).await;
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    // Same spec with other whitespace and key order is the same request.
    let reordered: Value =
        serde_json::from_str(&serde_json::to_string_pretty(&spec).unwrap()).unwrap();
    let again = send("key-1", reordered).await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(
        again.headers()["location"].to_str().unwrap(),
        format!("/v1/jobs/{}", first["id"].as_str().unwrap())
    );
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["id"], first["id"]);
    // Another spec under the same key is refused, naming the header.
    let mut other = spec.clone();
    other["batch_size"] = json!(32);
    assert_problem(send("key-1", other).await, 422, Some("Idempotency-Key")).await;
    // Another key is another job.
    let third: Value = send("key-2", spec.clone()).await.json().await.unwrap();
    assert_ne!(third["id"], first["id"]);
    let page: Value = app.get("/v1/jobs").await.json().await.unwrap();
    assert_eq!(page["jobs"].as_array().unwrap().len(), 2);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM job_events WHERE kind = 'submitted'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(n, 2, "a replay writes no event");
}

#[tokio::test]
async fn concurrent_retries_with_one_key_make_one_job() {
    let app = spawn_app().await;
    let spec = digits_spec("race");
    let responses = join_all((0..12).map(|_| {
        let req = app
            .client
            .post(app.url("/v1/jobs"))
            .header("Idempotency-Key", "same")
            .json(&spec);
        async move { req.send().await.unwrap() }
    }))
    .await;
    let mut ids = HashSet::new();
    for r in responses {
        assert_eq!(r.status(), 201);
        ids.insert(
            r.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(ids.len(), 1);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn bad_idempotency_keys_are_400() {
    let app = spawn_app().await;
    for key in ["x".repeat(256), String::new()] {
        let r = app
            .client
            .post(app.url("/v1/jobs"))
            .header("Idempotency-Key", key)
            .json(&digits_spec("k"))
            .send()
            .await
            .unwrap();
        assert_problem(r, 400, Some("Idempotency-Key")).await;
    }
}

#[tokio::test]
async fn list_is_newest_first_with_keyset_pagination() {
    let app = spawn_app().await;
    let mut ids = Vec::new();
    for i in 0..7 {
        ids.push(job_id(&app, &format!("job-{i}")).await);
    }
    ids.reverse();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/jobs?limit=3&cursor={c}"),
            None => "/v1/jobs?limit=3".to_owned(),
        };
        let page: Value = app.get(&path).await.json().await.unwrap();
        pages += 1;
        seen.extend(
            page["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["id"].as_str().unwrap().to_owned()),
        );
        // A job submitted mid-listing does not disturb later pages.
        if pages == 1 {
            job_id(&app, "late").await;
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, ids);
}

#[tokio::test]
async fn list_filters_by_state() {
    let app = spawn_app().await;
    let a = job_id(&app, "a").await;
    let b = job_id(&app, "b").await;
    assert_eq!(
        app.post_empty(&format!("/v1/jobs/{a}/cancel"))
            .await
            .status(),
        200
    );
    let page: Value = app
        .get("/v1/jobs?state=cancelled")
        .await
        .json()
        .await
        .unwrap();
    let got: Vec<&str> = page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, [a.as_str()]);
    let page: Value = app.get("/v1/jobs?state=queued").await.json().await.unwrap();
    let got: Vec<&str> = page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, [b.as_str()]);
    let page: Value = app
        .get("/v1/jobs?state=queued,cancelled")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["jobs"].as_array().unwrap().len(), 2);
    let page: Value = app
        .get("/v1/jobs?state=running")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["jobs"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn bad_list_queries_are_400_naming_the_parameter() {
    let app = spawn_app().await;
    for (q, field) in [
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=many", "limit"),
        ("state=done", "state"),
        ("state=queued,", "state"),
        ("cursor=xyz", "cursor"),
        ("colour=red", "query"),
        ("owner=%3ElR%00+%08", "owner"),
        ("owner=Alice", "owner"),
    ] {
        let p = assert_problem(app.get(&format!("/v1/jobs?{q}")).await, 400, Some(field)).await;
        if field == "query" {
            assert!(p["detail"].as_str().unwrap().contains("colour"), "{p}");
        }
    }
    let id = job_id(&app, "e").await;
    assert_problem(
        app.get(&format!("/v1/jobs/{id}/events?after=-1")).await,
        400,
        Some("after"),
    )
    .await;
    assert_problem(
        app.get(&format!("/v1/jobs/{id}/events?limit=0")).await,
        400,
        Some("limit"),
    )
    .await;
}

#[tokio::test]
async fn cancel_is_idempotent_and_logged_once() {
    let app = spawn_app().await;
    let id = job_id(&app, "c").await;
    let r = app.post_empty(&format!("/v1/jobs/{id}/cancel")).await;
    assert_eq!(r.status(), 200);
    let job: Value = r.json().await.unwrap();
    assert_eq!(job["state"], "cancelled");
    assert_eq!(job["state_reason"], "cancelled by user");
    assert!(job["finished_at"].is_string());
    let again = app.post_empty(&format!("/v1/jobs/{id}/cancel")).await;
    assert_eq!(again.status(), 200);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["state"], "cancelled");
    assert_eq!(
        again["finished_at"], job["finished_at"],
        "the second cancel changes nothing"
    );
    let page: Value = app
        .get(&format!("/v1/jobs/{id}/events"))
        .await
        .json()
        .await
        .unwrap();
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1]["kind"], "transition");
    assert_eq!(events[1]["from_state"], "queued");
    assert_eq!(events[1]["to_state"], "cancelled");
    assert_eq!(events[1]["reason"], "cancelled by user");
}

#[tokio::test]
async fn cancel_after_success_or_failure_is_409() {
    let app = spawn_app().await;
    for end in ["succeeded", "failed"] {
        let id = job_id(&app, end).await;
        sqlx::query(
            "UPDATE jobs SET state = $2::job_state, finished_at = now() WHERE id = $1::uuid",
        )
        .bind(&id)
        .bind(end)
        .execute(&app.db)
        .await
        .unwrap();
        let p = assert_problem(
            app.post_empty(&format!("/v1/jobs/{id}/cancel")).await,
            409,
            None,
        )
        .await;
        assert!(p["detail"].as_str().unwrap().contains(end), "{p}");
        let job: Value = app
            .get(&format!("/v1/jobs/{id}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(job["state"], end);
    }
}

#[tokio::test]
async fn concurrent_cancels_leave_one_transition() {
    let app = spawn_app().await;
    for round in 0..3 {
        let id = job_id(&app, &format!("race-{round}")).await;
        let url = app.url(&format!("/v1/jobs/{id}/cancel"));
        let responses = join_all((0..8).map(|_| app.client.post(&url).send())).await;
        for r in responses {
            let r = r.unwrap();
            assert_eq!(r.status(), 200);
            assert_eq!(r.json::<Value>().await.unwrap()["state"], "cancelled");
        }
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM job_events WHERE job_id = $1::uuid AND to_state = 'cancelled'",
        )
        .bind(&id)
        .fetch_one(&app.db)
        .await
        .unwrap();
        assert_eq!(n, 1, "exactly one cancel transition");
    }
}

#[tokio::test]
async fn cancel_racing_completion_is_consistent() {
    // A cancel and the scheduler's "succeeded" race; whichever commits first
    // wins and the other sees a terminal job. The state and the log agree.
    let app = spawn_app().await;
    let id = job_id(&app, "rc").await;
    let uuid: uuid::Uuid = id.parse().unwrap();
    let mut tx = app.db.begin().await.unwrap();
    trainyard_scheduler::transition(
        &mut tx,
        uuid,
        trainyard_common::JobState::Scheduling,
        "test",
    )
    .await
    .unwrap();
    trainyard_scheduler::transition(&mut tx, uuid, trainyard_common::JobState::Running, "test")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let finish = async {
        let mut tx = app.db.begin().await.unwrap();
        let r = trainyard_scheduler::transition(
            &mut tx,
            uuid,
            trainyard_common::JobState::Succeeded,
            "trained",
        )
        .await;
        tx.commit().await.unwrap();
        r.is_ok()
    };
    let cancel_path = format!("/v1/jobs/{id}/cancel");
    let cancel = app.post_empty(&cancel_path);
    let (finished, cancel) = tokio::join!(finish, cancel);
    let status = cancel.status().as_u16();
    let job: Value = app
        .get(&format!("/v1/jobs/{id}"))
        .await
        .json()
        .await
        .unwrap();
    let page: Value = app
        .get(&format!("/v1/jobs/{id}/events"))
        .await
        .json()
        .await
        .unwrap();
    let terminal: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["to_state"].as_str())
        .filter(|s| ["succeeded", "cancelled"].contains(s))
        .collect();
    assert_eq!(terminal.len(), 1, "{page}");
    assert_eq!(job["state"], terminal[0]);
    match status {
        200 => assert!(!finished && job["state"] == "cancelled"),
        409 => assert!(finished && job["state"] == "succeeded"),
        s => panic!("unexpected status {s}"),
    }
}

#[tokio::test]
async fn events_paginate_with_after() {
    let app = spawn_app().await;
    let id = job_id(&app, "p").await;
    app.post_empty(&format!("/v1/jobs/{id}/cancel")).await;
    let first: Value = app
        .get(&format!("/v1/jobs/{id}/events?limit=1"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(first["events"].as_array().unwrap().len(), 1);
    let after = first["next_after"].as_i64().unwrap();
    let second: Value = app
        .get(&format!("/v1/jobs/{id}/events?after={after}&limit=1"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(second["events"][0]["to_state"], "cancelled");
    assert_eq!(second["next_after"], Value::Null);
}
