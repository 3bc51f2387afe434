//! Artifacts and the data policy, over real HTTP against real Postgres and
//! a local object store: upload (declared length and chunked), list, get,
//! download, replace, delete; the per-artifact and per-user limits; the
//! submit-time policy (another user's artifact, a forbidden `file://`, the
//! store's own objects, a forbidden `s3://`, an allowed prefix, an admin's
//! freedom); a job that keeps the version it was submitted with; and the
//! 409 for deleting what an unfinished job reads.

use crate::helpers::{assert_problem, spawn_app_with, TestApp};
use futures::stream;
use reqwest::{Body, Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const ADMIN: &str = "artifact-admin-token";

async fn app_with(tweak: impl FnOnce(&mut trainyard_api::Config)) -> (TestApp, String, String) {
    let app = spawn_app_with(|c| {
        c.admin_token = Some(ADMIN.into());
        c.allow_data_urls = vec!["file:///data/".into(), "s3://datasets/".into()];
        tweak(c)
    })
    .await;
    let alice = app.user_token(ADMIN, "alice").await;
    let bob = app.user_token(ADMIN, "bob").await;
    (app, alice, bob)
}

async fn put(app: &TestApp, token: &str, name: &str, body: impl Into<Body>) -> reqwest::Response {
    reqwest::Client::new()
        .put(app.url(&format!("/v1/artifacts/{name}")))
        .bearer_auth(token)
        .body(body)
        .send()
        .await
        .unwrap()
}

/// A body without a declared length (chunked), in `n` pieces of `piece`.
fn chunked(piece: Vec<u8>, n: usize) -> Body {
    let chunks = (0..n).map(move |_| Ok::<_, std::io::Error>(piece.clone()));
    Body::wrap_stream(stream::iter(chunks))
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn torchscript_spec(name: &str, model: &str, data: &str) -> Value {
    json!({
        "name": name,
        "model": {"kind": "torchscript", "url": model},
        "dataset": {"kind": "file", "url": data, "format": "npz"},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "lr": 0.001},
        "batch_size": 32, "epochs": 1, "strategy": "allreduce", "workers": {"min": 1, "max": 1}
    })
}

#[tokio::test]
async fn upload_list_get_download_replace_and_delete() {
    let (app, alice, bob) = app_with(|_| {}).await;
    // Larger than one multipart part, so the store sees several parts.
    let big: Vec<u8> = (0..(trainyard_store::MULTIPART_PART * 2 + 1234))
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let r = put(&app, &alice, "model.pt", big.clone()).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let a: Value = r.json().await.unwrap();
    assert_eq!(a["name"], "model.pt");
    assert_eq!(a["owner"], "alice");
    assert_eq!(a["size"], big.len() as u64);
    assert_eq!(a["sha256"], sha(&big));
    assert_eq!(a["url"], "artifact:model.pt");

    // Chunked: no declared length.
    let r = put(&app, &alice, "data.npz", chunked(vec![3u8; 1000], 5)).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let d: Value = r.json().await.unwrap();
    assert_eq!(d["size"], 5000);

    let list = app.get_json_as("/v1/artifacts", &alice).await;
    let names: Vec<&str> = list["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["data.npz", "model.pt"]);
    // Bob sees none of them, and cannot read them by name.
    let list = app.get_json_as("/v1/artifacts", &bob).await;
    assert_eq!(list["artifacts"], json!([]));
    let list = app.get_json_as("/v1/artifacts?owner=alice", &bob).await;
    assert_eq!(list["artifacts"], json!([]));
    for path in [
        "/v1/artifacts/model.pt",
        "/v1/artifacts/model.pt/content",
        "/v1/artifacts/model.pt?owner=alice",
        "/v1/artifacts/model.pt/content?owner=alice",
    ] {
        let r = app.send_as(Method::GET, path, Some(&bob), None).await;
        assert_problem(r, 404, None).await;
    }
    // An admin sees everybody's, or one owner's.
    let list = app.get_json_as("/v1/artifacts?owner=alice", ADMIN).await;
    assert_eq!(list["artifacts"].as_array().unwrap().len(), 2);

    let meta = app.get_json_as("/v1/artifacts/model.pt", &alice).await;
    assert_eq!(meta, a);
    for path in [
        "/v1/artifacts/model.pt/content",
        "/v1/artifacts/model.pt?download",
    ] {
        let r = app.send_as(Method::GET, path, Some(&alice), None).await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers()["etag"].to_str().unwrap(),
            format!("\"{}\"", sha(&big))
        );
        assert_eq!(r.bytes().await.unwrap().as_ref(), &big[..]);
    }

    // Replace: 200, the new bytes, one entry still.
    let r = put(&app, &alice, "model.pt", b"v2".to_vec()).await;
    assert_eq!(r.status(), StatusCode::OK);
    let v2: Value = r.json().await.unwrap();
    assert_eq!(v2["sha256"], sha(b"v2"));
    let r = app
        .send_as(
            Method::GET,
            "/v1/artifacts/model.pt/content",
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"v2");
    // The replaced version's bytes are swept (no job reads them).
    let versions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM artifact_versions WHERE owner = 'alice'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(versions, 2);

    let r = app
        .send_as(Method::DELETE, "/v1/artifacts/model.pt", Some(&alice), None)
        .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = app
        .send_as(Method::GET, "/v1/artifacts/model.pt", Some(&alice), None)
        .await;
    assert_problem(r, 404, None).await;
    let r = app
        .send_as(Method::DELETE, "/v1/artifacts/model.pt", Some(&alice), None)
        .await;
    assert_problem(r, 404, None).await;
}

#[tokio::test]
async fn bad_names_are_400s_naming_the_field() {
    let (app, alice, _) = app_with(|_| {}).await;
    for name in [
        ".hidden",
        "...",
        "a%20b",
        "x%2Fy",
        "%C3%A9",
        &"n".repeat(129),
    ] {
        let r = put(&app, &alice, name, b"x".to_vec()).await;
        assert_problem(r, 400, Some("name")).await;
    }
    let r = app
        .send_as(
            Method::GET,
            "/v1/artifacts?owner=Not%20A%20User",
            Some(&alice),
            None,
        )
        .await;
    assert_problem(r, 400, Some("owner")).await;
}

#[tokio::test]
async fn sizes_are_bounded_per_artifact_and_per_user() {
    let (app, alice, _) = app_with(|c| {
        c.max_artifact_bytes = 1000;
        c.max_artifact_bytes_per_user = 1500;
    })
    .await;
    // Declared too long: refused before a byte is stored.
    let r = put(&app, &alice, "big", vec![0u8; 1001]).await;
    let p = assert_problem(r, 413, Some("body")).await;
    assert!(p["detail"].as_str().unwrap().contains("1000"), "{p}");
    // Streamed too long: cut off at the limit.
    let r = put(&app, &alice, "big", chunked(vec![0u8; 100], 11)).await;
    assert_problem(r, 413, Some("body")).await;
    let r = put(&app, &alice, "a", vec![1u8; 1000]).await;
    assert_eq!(r.status(), 201);
    // Over the user's total, declared and streamed.
    let r = put(&app, &alice, "b", vec![1u8; 600]).await;
    let p = assert_problem(r, 413, Some("body")).await;
    assert!(p["detail"].as_str().unwrap().contains("1500"), "{p}");
    let r = put(&app, &alice, "b", chunked(vec![1u8; 100], 6)).await;
    assert_problem(r, 413, Some("body")).await;
    // Nothing of the refused uploads is kept.
    let list = app.get_json_as("/v1/artifacts", &alice).await;
    assert_eq!(list["artifacts"].as_array().unwrap().len(), 1);
    let held: i64 = sqlx::query_scalar("SELECT sum(size)::bigint FROM artifact_versions")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(held, 1000);
    // Admins are bound by the per-artifact limit only.
    let r = put(&app, ADMIN, "x", vec![1u8; 1000]).await;
    assert_eq!(r.status(), 201);
    let r = put(&app, ADMIN, "y", vec![1u8; 1000]).await;
    assert_eq!(r.status(), 201);
}

#[tokio::test]
async fn a_users_job_reads_only_its_own_artifacts_and_allowed_prefixes() {
    let (app, alice, bob) = app_with(|_| {}).await;
    assert_eq!(
        put(&app, &bob, "secret.npz", b"bob's".to_vec())
            .await
            .status(),
        201
    );
    assert_eq!(
        put(&app, &alice, "m.pt", b"alice's".to_vec())
            .await
            .status(),
        201
    );
    // The store's own URL, as helpers.rs configured it.
    let store_url = format!(
        "file://{}",
        std::env::temp_dir()
            .join(format!("{}-objects", app.db_name))
            .display()
    );
    let cases = [
        ("artifact:secret.npz", "dataset.url", "no artifact named"),
        ("artifact:nope.npz", "dataset.url", "no artifact named"),
        ("file:///etc/passwd.npz", "dataset.url", "may not be read"),
        ("file:///data/../etc/passwd.npz", "dataset.url", "'..'"),
        (
            "file:///data-private/x.npz",
            "dataset.url",
            "may not be read",
        ),
        ("s3://private/x.npz", "dataset.url", "may not be read"),
        ("s3://datasets-2/x.npz", "dataset.url", "may not be read"),
    ];
    for (url, field, why) in cases {
        let spec = torchscript_spec("refused", "artifact:m.pt", url);
        let r = app
            .send_as(Method::POST, "/v1/jobs", Some(&alice), Some(&spec))
            .await;
        let p = assert_problem(r, 422, Some(field)).await;
        assert!(p.to_string().contains(why), "{url}: {p}");
    }
    // The store's objects: another job's weights, bob's artifact by URL.
    for key in [
        "0190c0de/final/model.safetensors",
        "artifacts/bob/x/secret.npz",
    ] {
        let url = format!("{store_url}/{key}");
        let spec = torchscript_spec("refused", &url, "file:///data/digits.npz");
        let r = app
            .send_as(Method::POST, "/v1/jobs", Some(&alice), Some(&spec))
            .await;
        let p = assert_problem(r, 422, Some("model.url")).await;
        assert!(p.to_string().contains("object store"), "{url}: {p}");
    }
    // Her artifact and the allowed prefixes are fine.
    for data in ["file:///data/digits.npz", "s3://datasets/digits.npz"] {
        let spec = torchscript_spec("ok", "artifact:m.pt", data);
        let r = app
            .send_as(Method::POST, "/v1/jobs", Some(&alice), Some(&spec))
            .await;
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    }
    // An admin's job reads any URL.
    let spec = torchscript_spec("admin", "file:///opt/models/m.pt", "file:///etc/x.npz");
    let r = app
        .send_as(Method::POST, "/v1/jobs", Some(ADMIN), Some(&spec))
        .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn a_job_keeps_its_version_and_holds_it_against_delete() {
    let (app, alice, _) = app_with(|_| {}).await;
    let r = put(&app, &alice, "m.pt", b"version one".to_vec()).await;
    let v1: Value = r.json().await.unwrap();
    let spec = torchscript_spec("keeps", "artifact:m.pt", "file:///data/digits.npz");
    let r = app
        .send_as(Method::POST, "/v1/jobs", Some(&alice), Some(&spec))
        .await;
    assert_eq!(r.status(), 201);
    let job: Value = r.json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_owned();
    // The job shows the spec as written, and the version it reads.
    assert_eq!(job["spec"]["model"]["url"], "artifact:m.pt");
    assert_eq!(job["artifacts"][0]["field"], "model.url");
    assert_eq!(job["artifacts"][0]["sha256"], v1["sha256"]);
    let policy: Value = sqlx::query_scalar("SELECT data_policy FROM jobs WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(policy["unrestricted"], false);
    assert_eq!(policy["artifacts"][0]["sha256"], v1["sha256"]);
    let v1_url = policy["artifacts"][0]["url"].as_str().unwrap().to_owned();
    let v1_path = v1_url.strip_prefix("file://").unwrap().to_owned();

    // Replaced while the job waits: the job still reads version one.
    let r = put(&app, &alice, "m.pt", b"version two".to_vec()).await;
    assert_eq!(r.status(), 200);
    let again = app.get_json_as(&format!("/v1/jobs/{id}"), &alice).await;
    assert_eq!(again["artifacts"], job["artifacts"]);
    assert_eq!(std::fs::read(&v1_path).unwrap(), b"version one");
    // Deleting the name is refused while the job has not finished...
    let r = put(&app, &alice, "d.npz", b"data".to_vec()).await;
    assert_eq!(r.status(), 201);
    let spec = torchscript_spec("reads-d", "artifact:m.pt", "artifact:d.npz");
    let r = app
        .send_as(Method::POST, "/v1/jobs", Some(&alice), Some(&spec))
        .await;
    assert_eq!(r.status(), 201);
    let second: Value = r.json().await.unwrap();
    let r = app
        .send_as(Method::DELETE, "/v1/artifacts/d.npz", Some(&alice), None)
        .await;
    let p = assert_problem(r, 409, None).await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains(second["id"].as_str().unwrap()),
        "{p}"
    );
    // ...and allowed once it has ended; the old version goes with it.
    for j in [&id, second["id"].as_str().unwrap()] {
        let r = app
            .send_as(
                Method::POST,
                &format!("/v1/jobs/{j}/cancel"),
                Some(&alice),
                None,
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    let r = app
        .send_as(Method::DELETE, "/v1/artifacts/d.npz", Some(&alice), None)
        .await;
    assert_eq!(r.status(), 204);
    assert!(!std::path::Path::new(&v1_path).exists(), "swept: {v1_path}");
    let r = app
        .send_as(
            Method::GET,
            "/v1/artifacts/m.pt/content",
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"version two");
}

#[tokio::test]
async fn a_stalled_or_trickled_upload_is_a_408_and_leaves_nothing() {
    let (app, alice, _) = app_with(|c| c.artifact_idle_timeout_secs = 1).await;
    // One piece, then silence past the idle timeout.
    let stalled = stream::unfold(0u8, |n| async move {
        match n {
            0 => Some((Ok::<_, std::io::Error>(vec![1u8; 100]), 1)),
            _ => {
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                None
            }
        }
    });
    let r = put(&app, &alice, "stalled", Body::wrap_stream(stalled)).await;
    let p = assert_problem(r, 408, None).await;
    assert!(p["detail"].as_str().unwrap().contains("no byte"), "{p}");
    // A byte every 200 ms never stalls, but is far below the floor rate.
    let trickle = stream::unfold(0u32, |n| async move {
        (n < 50).then_some(())?;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        Some((Ok::<_, std::io::Error>(vec![2u8]), n + 1))
    });
    let r = put(&app, &alice, "trickled", Body::wrap_stream(trickle)).await;
    let p = assert_problem(r, 408, None).await;
    assert!(p["detail"].as_str().unwrap().contains("KiB/s"), "{p}");
    let list = app.get_json_as("/v1/artifacts", &alice).await;
    assert_eq!(list["artifacts"], json!([]));
}

#[tokio::test]
async fn a_user_streams_at_most_two_uploads_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (app, alice, bob) = app_with(|_| {}).await;
    // Two uploads over raw sockets: headers and the first 10 of 100 bytes.
    let mut open = Vec::new();
    for i in 0..2 {
        let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
        let head = format!(
            "PUT /v1/artifacts/open-{i} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {alice}\r\nContent-Length: 100\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(&[0u8; 10]).await.unwrap();
        open.push(s);
    }
    // Both have taken their slots once their headers are in (a second is
    // far more than that; a probe sent earlier could itself hold a slot
    // when one of them arrives, and turn it away).
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let third = put(&app, &alice, "third", b"x".to_vec()).await;
    assert!(third.headers().contains_key("retry-after"));
    assert_problem(third, 429, None).await;
    // Another user is not held up.
    assert_eq!(put(&app, &bob, "bobs", b"x".to_vec()).await.status(), 201);
    // The two finish, and their slots are free again.
    for mut s in open {
        s.write_all(&[0u8; 90]).await.unwrap();
        let mut answer = vec![0u8; 12];
        s.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HTTP/1.1 201");
    }
    assert_eq!(
        put(&app, &alice, "third", b"x".to_vec()).await.status(),
        201
    );
}
