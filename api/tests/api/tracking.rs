//! Experiment tracking at the API: where a job may be logged
//! (`tracking.mlflow`), with the attacks a user-named tracking URL invites
//! refused as 422s naming the field, and `GET /v1/jobs/{id}/tensorboard`:
//! every stored step of rank 0 as a TensorBoard event file, read back here
//! record by record (the framing's CRCs checked), across the pages the
//! route streams, for the caller who may see the job only.
//!
//! The export itself, against a real MLflow server, and the event file
//! read by TensorBoard's own reader, are end-to-end tests
//! (tests/e2e/tracking.rs).

use crate::executors::{holder_of_rank, place_ring_job, register};
use crate::helpers::{assert_problem, digits_spec, spawn_app, spawn_app_with, TestApp};
use reqwest::Method;
use serde_json::{json, Value};
use trainyard_api::tfevents::masked_crc;

const ADMIN: &str = "tracking-admin-token";
const DEFAULT: &str = "http://127.0.0.1:9";
const ALLOWED: &str = "http://mlflow.invalid:5000/team/";

async fn guarded_app() -> TestApp {
    spawn_app_with(|c| {
        c.admin_token = Some(ADMIN.into());
        c.mlflow_uri = Some(DEFAULT.into());
        c.mlflow_experiment = "the-default".into();
        c.tracking_allowed_uris = vec![ALLOWED.into()];
        // Every attack below is a submit of its own.
        c.submit_burst_per_user = 1000;
    })
    .await
}

fn tracked(name: &str, mlflow: Value) -> Value {
    let mut spec = digits_spec(name);
    spec["tracking"] = json!({ "mlflow": mlflow });
    spec
}

async fn submit_as(app: &TestApp, token: &str, spec: &Value) -> reqwest::Response {
    app.send_as(Method::POST, "/v1/jobs", Some(token), Some(spec))
        .await
}

/// The job's export row: its URL and experiment.
async fn export_row(app: &TestApp, id: &str) -> Option<(String, String)> {
    sqlx::query_as("SELECT uri, experiment FROM tracking_exports WHERE job_id = $1::uuid")
        .bind(id)
        .fetch_optional(&app.db)
        .await
        .unwrap()
}

async fn created_id(r: reqwest::Response) -> String {
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let v: Value = r.json().await.unwrap();
    v["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_user_may_log_only_to_the_default_or_an_allowed_tracking_server() {
    let app = guarded_app().await;
    let user = app.user_token(ADMIN, "mallory").await;
    for (uri, why) in [
        // The cloud metadata service and other inside addresses.
        ("http://169.254.169.254/latest/meta-data/", "admits"),
        ("http://127.0.0.1:5432/", "admits"),
        ("http://[::1]:9/", "admits"),
        // The allowed prefix's look-alikes.
        ("http://mlflow.invalid:5000/teamwork", "admits"),
        ("http://mlflow.invalid:5000/team/../admin", "admits"),
        ("http://mlflow.invalid:5001/team/", "admits"),
        ("https://mlflow.invalid:5000/team/", "admits"),
        ("http://mlflow.invalid.evil.example:5000/team/", "admits"),
        // Credentials that would make the default's host a user name.
        ("http://127.0.0.1:9@evil.example/", "credentials"),
        // Other schemes, and what is not a URL.
        ("file:///etc/passwd", "http"),
        ("gopher://127.0.0.1:9/", "http"),
        ("ftp://127.0.0.1:9/", "http"),
        ("127.0.0.1:9", "http"),
        ("http://127.0.0.1:9/?next=http://evil.example", "query"),
        ("http://127.0.0.1:9/\nHost: evil", "whitespace"),
    ] {
        let r = submit_as(&app, &user, &tracked("ssrf", json!({ "uri": uri }))).await;
        let body = assert_problem(r, 422, Some("tracking.mlflow.uri")).await;
        let text = body.to_string();
        assert!(text.contains(why), "{uri}: {text}");
    }
    for (experiment, why) in [
        (json!(""), "empty"),
        (json!("a\u{0}b"), "control"),
        (json!("x".repeat(251)), "at most 250"),
        (json!(7), "string"),
    ] {
        let r = submit_as(
            &app,
            &user,
            &tracked("bad-experiment", json!({ "experiment": experiment })),
        )
        .await;
        let body = assert_problem(r, 422, Some("tracking.mlflow.experiment")).await;
        assert!(body.to_string().contains(why), "{experiment}: {body}");
    }
    let r = submit_as(&app, &user, &tracked("unknown", json!({ "url": DEFAULT }))).await;
    assert_problem(r, 422, None).await;

    // Admitted: the default (named, or left out), a URL under the allowed
    // prefix, and the default's address written another way.
    let id = created_id(submit_as(&app, &user, &digits_spec("plain")).await).await;
    assert_eq!(
        export_row(&app, &id).await,
        Some((DEFAULT.to_owned(), "the-default".to_owned()))
    );
    let named = tracked(
        "named",
        json!({"uri": "http://mlflow.invalid:5000/team/a/", "experiment": "sweep 1"}),
    );
    let id = created_id(submit_as(&app, &user, &named).await).await;
    assert_eq!(
        export_row(&app, &id).await,
        Some((
            "http://mlflow.invalid:5000/team/a".to_owned(),
            "sweep 1".to_owned()
        ))
    );
    let spelled = tracked("spelled", json!({"uri": "http://2130706433:9/"}));
    let id = created_id(submit_as(&app, &user, &spelled).await).await;
    assert_eq!(export_row(&app, &id).await.unwrap().0, DEFAULT);
    // A job may stay out.
    let out = tracked("out", json!({"enabled": false}));
    let id = created_id(submit_as(&app, &user, &out).await).await;
    assert_eq!(export_row(&app, &id).await, None);
    // An admin's job names any http(s) server.
    let admin = tracked("admin", json!({"uri": "http://10.1.2.3:5000"}));
    let id = created_id(submit_as(&app, ADMIN, &admin).await).await;
    assert_eq!(
        export_row(&app, &id).await.unwrap().0,
        "http://10.1.2.3:5000"
    );
}

#[tokio::test]
async fn without_a_default_jobs_are_not_logged_unless_they_name_a_server() {
    let app = spawn_app().await;
    let job = app.submit(&digits_spec("untracked")).await;
    assert_eq!(export_row(&app, job["id"].as_str().unwrap()).await, None);
    let r = app
        .post_json("/v1/jobs", &tracked("nowhere", json!({"experiment": "e"})))
        .await;
    let body = assert_problem(r, 422, Some("tracking.mlflow.uri")).await;
    assert!(body.to_string().contains("no default"), "{body}");
}

/// One decoded event of a tfevents file: wall time, step, file version,
/// and the summary's (tag, value).
#[derive(Debug, Default)]
struct Event {
    wall_time: f64,
    step: i64,
    file_version: Option<String>,
    value: Option<(String, f32)>,
}

fn varint(b: &[u8], i: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let byte = b[*i];
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// The (field, wire type, payload) of a protobuf message, in order.
fn fields(b: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let key = varint(b, &mut i);
        let (field, wire) = (key >> 3, key & 7);
        let payload = match wire {
            0 => {
                let v = varint(b, &mut i);
                v.to_le_bytes().to_vec()
            }
            1 => {
                i += 8;
                b[i - 8..i].to_vec()
            }
            2 => {
                let n = varint(b, &mut i) as usize;
                i += n;
                b[i - n..i].to_vec()
            }
            5 => {
                i += 4;
                b[i - 4..i].to_vec()
            }
            w => panic!("wire type {w}"),
        };
        out.push((field, wire, payload));
    }
    out
}

/// Every record of a tfevents file, checked, decoded as an Event.
fn read_events(file: &[u8]) -> Vec<Event> {
    let mut events = Vec::new();
    let mut i = 0;
    while i < file.len() {
        let len_bytes = &file[i..i + 8];
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(file[i + 8..i + 12].try_into().unwrap());
        assert_eq!(crc, masked_crc(len_bytes), "length CRC at {i}");
        let data = &file[i + 12..i + 12 + len];
        let crc = u32::from_le_bytes(file[i + 12 + len..i + 16 + len].try_into().unwrap());
        assert_eq!(crc, masked_crc(data), "data CRC at {i}");
        i += 16 + len;
        let mut e = Event::default();
        for (field, _, p) in fields(data) {
            match field {
                1 => e.wall_time = f64::from_le_bytes(p.try_into().unwrap()),
                2 => e.step = u64::from_le_bytes(p.try_into().unwrap()) as i64,
                3 => e.file_version = Some(String::from_utf8(p).unwrap()),
                5 => {
                    let values = fields(&p);
                    assert_eq!(values.len(), 1, "one value per event");
                    let mut tag = String::new();
                    let mut value = f32::NAN;
                    for (f, _, q) in fields(&values[0].2) {
                        match f {
                            1 => tag = String::from_utf8(q).unwrap(),
                            2 => value = f32::from_le_bytes(q.try_into().unwrap()),
                            other => panic!("Summary.Value field {other}"),
                        }
                    }
                    e.value = Some((tag, value));
                }
                other => panic!("Event field {other}"),
            }
        }
        events.push(e);
    }
    events
}

#[tokio::test]
async fn the_tensorboard_file_holds_every_stored_step_of_rank_0() {
    let app = spawn_app().await;
    let holder = register(&app, "tb-holder").await;
    let id = place_ring_job(&app, digits_spec("tb"), 1).await;
    assert_eq!(holder_of_rank(&app, &id, 0).await, holder.0);
    let key = json!({"job_id": id, "generation": 1, "role": "worker", "index": 0});
    // More steps than one page of the route (1000), in reports of 500;
    // an evaluation every 100th.
    let steps = 2345u64;
    let point = |s: u64| {
        let mut p = json!({"step": s, "loss": 3.0 / s as f64, "lr": 0.001 * s as f64,
            "samples_per_sec": 100.0 + s as f64, "data_seconds": 0.001,
            "compute_seconds": 0.002, "comm_seconds": 0.003});
        if s % 100 == 0 {
            p["eval_loss"] = json!(1.0 / s as f64);
            p["eval_accuracy"] = json!(s as f64 / steps as f64);
        }
        p
    };
    for from in (1..=steps).step_by(500) {
        let metrics: Vec<Value> = (from..(from + 500).min(steps + 1)).map(point).collect();
        let r = app
            .post_as(
                &format!("/v1/executors/{}/reports", holder.0),
                &holder.1,
                &json!({"key": key, "metrics": metrics}),
            )
            .await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }

    let r = app.get(&format!("/v1/jobs/{id}/tensorboard")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/octet-stream");
    let disposition = r.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        disposition.starts_with("attachment; filename=\"events.out.tfevents.")
            && disposition.ends_with(".trainyard\""),
        "{disposition}"
    );
    let events = read_events(&r.bytes().await.unwrap());
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    assert!(events[0].wall_time > 1.0e9);
    let scalars: Vec<&Event> = events[1..].iter().collect();
    assert!(scalars.iter().all(|e| e.file_version.is_none()));
    let series = |tag: &str| -> Vec<(i64, f32)> {
        scalars
            .iter()
            .filter_map(|e| {
                let (t, v) = e.value.as_ref().unwrap();
                (t == tag).then_some((e.step, *v))
            })
            .collect()
    };
    let all: Vec<i64> = (1..=steps as i64).collect();
    let loss = series("train/loss");
    assert_eq!(loss.iter().map(|p| p.0).collect::<Vec<_>>(), all);
    for (s, v) in &loss {
        assert_eq!(*v, (3.0 / *s as f64) as f32, "loss at {s}");
    }
    for tag in [
        "train/lr",
        "train/samples_per_sec",
        "train/data_seconds",
        "train/compute_seconds",
        "train/comm_seconds",
    ] {
        assert_eq!(series(tag).len(), steps as usize, "{tag}");
    }
    let lr = series("train/lr");
    assert_eq!(lr[99], (100, (0.001 * 100.0) as f32));
    let accuracy = series("eval/accuracy");
    assert_eq!(
        accuracy.iter().map(|p| p.0).collect::<Vec<_>>(),
        (1..=23).map(|k| k * 100).collect::<Vec<i64>>()
    );
    assert_eq!(accuracy[22].1, (2300.0 / steps as f64) as f32);
    assert_eq!(series("eval/loss").len(), 23);
    assert_eq!(scalars.len(), steps as usize * 6 + 23 * 2);
    // Wall times are when the steps were stored: recent, and in order.
    assert!(scalars.windows(2).all(|w| w[0].wall_time <= w[1].wall_time));

    // A job without metrics is the version event alone; no job is a 404.
    let quiet = app.submit(&digits_spec("quiet")).await;
    let r = app
        .get(&format!(
            "/v1/jobs/{}/tensorboard",
            quiet["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(read_events(&r.bytes().await.unwrap()).len(), 1);
    let r = app
        .get("/v1/jobs/00000000-0000-0000-0000-000000000000/tensorboard")
        .await;
    assert_problem(r, 404, None).await;
    let r = app.get("/v1/jobs/nope/tensorboard").await;
    assert_problem(r, 400, None).await;
}

#[tokio::test]
async fn another_users_tensorboard_file_is_a_404() {
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into())).await;
    let ada = app.user_token(ADMIN, "ada").await;
    let bob = app.user_token(ADMIN, "bob").await;
    let id = created_id(submit_as(&app, &ada, &digits_spec("ada-job")).await).await;
    let path = format!("/v1/jobs/{id}/tensorboard");
    let r = app.send_as(Method::GET, &path, Some(&bob), None).await;
    assert_problem(r, 404, None).await;
    let r = app.send_as(Method::GET, &path, None, None).await;
    assert_problem(r, 401, None).await;
    let r = app.send_as(Method::GET, &path, Some(&ada), None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(read_events(&r.bytes().await.unwrap()).len(), 1);
}
