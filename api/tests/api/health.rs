//! Health, readiness, metrics, fallbacks, authentication and the web page.

use crate::helpers::{admin_url, assert_problem, digits_spec, spawn_app, spawn_app_with};
use sqlx::{Connection, PgConnection};

#[tokio::test]
async fn healthz_and_readyz_answer() {
    let app = spawn_app().await;
    let r = app.get("/healthz").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["status"], "ok");
    let r = app.get("/readyz").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["status"],
        "ready"
    );
}

#[tokio::test]
async fn readyz_is_503_when_the_database_is_gone() {
    let app = spawn_app().await;
    let mut admin = PgConnection::connect(&admin_url()).await.unwrap();
    sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", app.db_name))
        .execute(&mut admin)
        .await
        .unwrap();
    let r = app.get("/readyz").await;
    assert_problem(r, 503, None).await;
    // Liveness does not depend on the database.
    assert_eq!(app.get("/healthz").await.status(), 200);
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_jobs_by_state() {
    let app = spawn_app().await;
    let job = app.submit(&digits_spec("m")).await;
    app.get(&format!("/v1/jobs/{}", job["id"].as_str().unwrap()))
        .await;
    app.get("/v1/jobs/not-a-uuid").await;
    let text = app.get("/metrics").await.text().await.unwrap();
    assert!(
        text.contains(
            r#"trainyard_http_requests_total{method="POST",route="/v1/jobs",status="201"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"trainyard_http_requests_total{method="GET",route="/v1/jobs/{id}",status="200"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"trainyard_http_requests_total{method="GET",route="/v1/jobs/{id}",status="400"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"trainyard_jobs{state="queued"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"trainyard_jobs{state="running"} 0"#),
        "{text}"
    );
    assert!(
        text.contains("trainyard_http_request_duration_seconds_bucket"),
        "{text}"
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_are_problems() {
    let app = spawn_app().await;
    assert_problem(app.get("/v2/nothing").await, 404, None).await;
    let r = app.client.delete(app.url("/v1/jobs")).send().await.unwrap();
    assert_problem(r, 405, None).await;
    let r = app
        .client
        .put(app.url("/v1/jobs/00000000-0000-0000-0000-000000000000/cancel"))
        .send()
        .await
        .unwrap();
    assert_problem(r, 405, None).await;
}

#[tokio::test]
async fn bearer_token_guards_v1_only() {
    let app = spawn_app_with(|c| c.admin_token = Some("s3cret-token".into())).await;
    let r = app.get("/v1/jobs").await;
    let body = assert_problem(r, 401, Some("Authorization")).await;
    assert!(body["detail"].as_str().unwrap().contains("bearer"));
    let r = app
        .client
        .get(app.url("/v1/jobs"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = app
        .client
        .get(app.url("/v1/jobs"))
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = app
        .client
        .post(app.url("/v1/jobs"))
        .json(&digits_spec("t"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "submits need the token too");
    for open in ["/healthz", "/readyz", "/metrics", "/openapi.json", "/"] {
        assert_eq!(app.get(open).await.status(), 200, "{open}");
    }
}

#[tokio::test]
async fn web_page_and_docs_are_served() {
    let app = spawn_app().await;
    let r = app.get("/").await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(r.text().await.unwrap().contains("/v1/jobs"));
    let r = app.get("/docs/").await;
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    assert!(html.contains("swagger"), "{html}");
    // The Swagger UI's assets come from the binary, not a CDN.
    assert!(
        !html.contains("unpkg.com") && !html.contains("cdn."),
        "{html}"
    );
    let r = app.get("/docs/swagger-ui-bundle.js").await;
    assert_eq!(r.status(), 200);
}

/// A client that never finishes its headers is cut off after the header
/// timeout, and the connection cap makes others wait for a free slot
/// instead of piling up: with one slot held by a silent client, a request
/// is served once that client has been closed.
#[tokio::test]
async fn silent_clients_are_closed_and_connections_are_capped() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app_with(|c| {
        c.header_read_timeout_secs = 3;
        c.max_connections = 1;
    })
    .await;
    let mut silent = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    silent
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // The only slot is taken: this request is served after the silent one
    // is closed.
    let served = tokio::spawn({
        let url = app.url("/healthz");
        async move { reqwest::get(url).await.unwrap().status().as_u16() }
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !served.is_finished(),
        "a second connection was served while the only slot was held"
    );
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(std::time::Duration::from_secs(30), silent.read(&mut buf))
        .await
        .expect("the silent connection is closed by the server");
    // Closed: EOF, a reset, or hyper's 408 before closing.
    if let Ok(n) = n {
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(n == 0 || text.starts_with("HTTP/1.1 408"), "{text}");
    }
    let status = tokio::time::timeout(std::time::Duration::from_secs(30), served)
        .await
        .expect("the waiting request is served")
        .unwrap();
    assert_eq!(status, 200);
}

/// Every statement of the server is bounded: one that runs past the
/// statement timeout is cancelled by Postgres, and handlers turn that into
/// a 503 rather than a 500.
#[tokio::test]
async fn statements_past_the_timeout_are_cancelled_and_unavailable() {
    let app = spawn_app_with(|c| c.db_statement_timeout_secs = 1).await;
    let err = sqlx::query("SELECT pg_sleep(3)")
        .execute(&app.db)
        .await
        .expect_err("a 3 s statement outlives a 1 s timeout");
    let code = err
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("57014"), "{err}");
    let api_err = trainyard_api::error::ApiError::from(err);
    assert!(
        matches!(api_err, trainyard_api::error::ApiError::Unavailable(_)),
        "{api_err:?}"
    );
}
