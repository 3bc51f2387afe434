//! The typed client against the real API server (`trainyard-api`'s
//! `Application` on a free port, over a fresh database on the test
//! Postgres server: `TRAINYARD_TEST_DATABASE_URL`, else `DATABASE_URL`,
//! else the test suite's private cluster): every answer decodes into its type, error answers
//! become problems, an executor's calls work with its credential, and
//! nothing answering is a transient failure.

use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use trainyard_api::{Application, Config};
use trainyard_client::{Client, ClientError, JobQuery, Reported, RetryPolicy};
use trainyard_common::api::{NewToken, Role};
use trainyard_common::cluster::{
    DeviceInfo, ExecutorResources, ExecutorState, HeartbeatRequest, RegisterRequest, RoleKey,
    RoleKind, RoleOutcome, RoleReport,
};
use trainyard_common::spec::Device;
use trainyard_common::{EventKind, JobState};
use trainyard_testdb::{drop_database, TestDatabase};
use uuid::Uuid;

const JOIN: &str = "test-join-token";

/// A server over its own database, and a client of it; the database's name.
async fn server() -> (Client, String) {
    let TestDatabase { name: db, url } = TestDatabase::fresh("ty_test_client").await;
    let mut config = Config::for_tests("127.0.0.1:0".parse().unwrap());
    config.join_token = Some(JOIN.into());
    let app = Application::build(config, &url).await.expect("build app");
    let base = format!("http://{}", app.local_addr());
    tokio::spawn(app.run_until(std::future::pending()));
    (Client::new(base).unwrap(), db)
}

fn spec(name: &str) -> serde_json::Value {
    json!({
        "name": name,
        "model": {"kind": "mlp", "inputs": 8, "hidden": [16], "outputs": 2},
        "dataset": {"kind": "classification", "samples": 512, "features": 8, "classes": 2},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "lr": 0.01},
        "batch_size": 32,
        "steps": 100,
        "strategy": "allreduce",
        "workers": {"min": 2, "max": 2}
    })
}

#[tokio::test]
async fn every_user_answer_decodes_and_errors_are_problems() {
    let (client, db) = server().await;
    client.readyz().await.unwrap();
    let me = client.whoami().await.unwrap();
    assert_eq!(
        (me.user.as_str(), me.role, me.open),
        ("admin", Role::Admin, true)
    );

    let job = client
        .submit_job(&spec("typed"), Some("key-1"))
        .await
        .unwrap();
    assert_eq!((job.name.as_str(), job.state), ("typed", JobState::Queued));
    let again = client
        .submit_job(&spec("typed"), Some("key-1"))
        .await
        .unwrap();
    assert_eq!(again.id, job.id, "an idempotent submit");
    assert_eq!(client.job(job.id).await.unwrap().id, job.id);
    let page = client
        .jobs(&JobQuery {
            state: Some("queued".into()),
            limit: Some(10),
            ..JobQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(page.jobs.len(), 1);
    assert!(page.next_cursor.is_none());
    let events = client.job_events(job.id, None, Some(10)).await.unwrap();
    assert_eq!(events.events[0].kind, EventKind::Submitted);
    assert!(client
        .job_assignments(job.id)
        .await
        .unwrap()
        .workers
        .is_empty());
    assert_eq!(
        client
            .job_metrics(job.id, Some(10))
            .await
            .unwrap()
            .steps_recorded,
        0
    );
    assert!(client
        .job_logs(job.id, Some(0), None)
        .await
        .unwrap()
        .lines
        .is_empty());
    assert!(client
        .job_checkpoints(job.id)
        .await
        .unwrap()
        .checkpoints
        .is_empty());
    let cancelled = client.cancel_job(job.id).await.unwrap();
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert!(client
        .provisioner(Some(5))
        .await
        .unwrap()
        .executors
        .is_empty());

    // Error answers: the status, the problem's title and its fields.
    let missing = client.job(Uuid::new_v4()).await.unwrap_err();
    assert_eq!(missing.status(), Some(404), "{missing}");
    assert!(!missing.is_transient());
    assert!(
        missing
            .to_string()
            .starts_with("404 Not found: no job with id"),
        "{missing}"
    );
    let mut bad = spec("bad");
    bad["batch_size"] = json!(0);
    let invalid = client.submit_job(&bad, None).await.unwrap_err();
    let problem = invalid.problem().expect("a problem");
    assert_eq!(problem.status, 422);
    assert_eq!(problem.errors[0].field, "batch_size");
    let model = client.job_model(job.id).await.unwrap_err();
    assert_eq!(model.status(), Some(404), "{model}");

    let made = client
        .create_token(&NewToken {
            owner: "erin".into(),
            role: Role::User,
            label: "client test".into(),
            expires_in_secs: None,
        })
        .await
        .unwrap();
    assert!(made.token.starts_with("ty_"));
    let erin = Client::builder(client.base_url())
        .token(Some(made.token.clone()))
        .build()
        .unwrap();
    assert!(!format!("{erin:?}").contains(&made.token), "{erin:?}");
    assert_eq!(erin.whoami().await.unwrap().user, "erin");
    assert_eq!(client.tokens().await.unwrap().tokens.len(), 1);
    let revoked = client.revoke_token(made.info.id).await.unwrap();
    assert!(revoked.revoked_at.is_some());
    drop_database(&db).await;
}

#[tokio::test]
async fn an_executor_registers_beats_reports_drains_and_leaves() {
    let (api, db) = server().await;
    let exec = Client::builder(api.base_url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let registration = RegisterRequest {
        name: "typed-ex".into(),
        address: "127.0.0.1:7070".into(),
        resources: ExecutorResources {
            devices: vec![DeviceInfo {
                kind: Device::Cpu,
                index: 0,
                name: "cpu".into(),
                memory_bytes: 4 << 30,
            }],
            cpu_cores: 2,
            ram_bytes: 4 << 30,
        },
        labels: BTreeMap::new(),
        sandbox: None,
    };
    let refused = exec.register("wrong", &registration).await.unwrap_err();
    assert_eq!(refused.status(), Some(401), "{refused}");
    let reg = exec.register(JOIN, &registration).await.unwrap();
    exec.set_token(Some(reg.token.clone()));
    let beat = exec
        .heartbeat(reg.id, &HeartbeatRequest::default())
        .await
        .unwrap();
    assert_eq!(beat.state, ExecutorState::Live);
    assert_eq!(api.executor(reg.id).await.unwrap().name, "typed-ex");
    assert_eq!(
        api.executors(Some("live")).await.unwrap().executors.len(),
        1
    );

    // A one-rank job, placed on the only executor at generation 1.
    let mut one = spec("reported");
    one["workers"] = json!({"min": 1, "max": 1});
    let job = api.submit_job(&one, None).await.unwrap();
    let mut generation = 0;
    for _ in 0..200 {
        generation = api.job(job.id).await.unwrap().generation;
        if generation == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(generation, 1, "the job was not placed");
    let key = RoleKey {
        job_id: job.id,
        generation: 1,
        role: RoleKind::Worker,
        index: 0,
    };
    let empty = RoleReport::empty(key);
    match exec.report(reg.id, &empty).await.unwrap() {
        Reported::Stored(ack) => assert_eq!(ack.metrics_stored, 0),
        other => panic!("stored, not {other:?}"),
    }
    let stale = RoleReport {
        key: RoleKey {
            generation: 7,
            ..key
        },
        outcome: Some(RoleOutcome::Failed {
            reason: "from another generation".into(),
        }),
        ..empty.clone()
    };
    assert!(matches!(
        exec.report(reg.id, &stale).await.unwrap(),
        Reported::Stale
    ));
    // An executor that holds no role in the job: refused for good.
    let stranger = Client::builder(api.base_url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let other = stranger
        .register(
            JOIN,
            &RegisterRequest {
                name: "typed-stranger".into(),
                ..registration.clone()
            },
        )
        .await
        .unwrap();
    stranger.set_token(Some(other.token.clone()));
    match stranger.report(other.id, &empty).await.unwrap() {
        Reported::Refused(why) => assert!(why.contains("holds no role"), "{why}"),
        other => panic!("refused, not {other:?}"),
    }

    assert_eq!(
        exec.drain(reg.id).await.unwrap().state,
        ExecutorState::Draining
    );
    // Once the drain has moved its role away, it may leave.
    let mut left = None;
    for _ in 0..200 {
        match exec.leave(reg.id).await {
            Ok(info) => {
                left = Some(info.state);
                break;
            }
            Err(e) if e.status() == Some(409) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(left, Some(ExecutorState::Left));
    let gone = exec
        .heartbeat(reg.id, &HeartbeatRequest::default())
        .await
        .unwrap_err();
    assert_eq!(gone.status(), Some(410), "{gone}");
    drop_database(&db).await;
}

#[tokio::test]
async fn nothing_listening_is_transient_and_retried_as_the_policy_says() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::new(format!("http://127.0.0.1:{port}/")).unwrap();
    assert_eq!(client.base_url(), format!("http://127.0.0.1:{port}"));
    let e = client.whoami().await.unwrap_err();
    assert!(matches!(e, ClientError::Unreachable { .. }), "{e}");
    assert!(e.is_transient());

    let patient = client.with_retry(RetryPolicy::patient(
        Duration::from_millis(600),
        Duration::from_millis(200),
    ));
    let started = Instant::now();
    assert!(patient.whoami().await.is_err());
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(5),
        "two retries 200 ms apart, the third would start after 600 ms: {took:?}"
    );
    // A submit without an idempotency key is never repeated.
    let started = Instant::now();
    assert!(patient.submit_job(&spec("once"), None).await.is_err());
    assert!(started.elapsed() < Duration::from_millis(200));
}
