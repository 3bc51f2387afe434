//! `spawn_app()`: a fresh database, the real application on a free port, and
//! a small typed client.
//!
//! Each test makes its own `ty_test_*` database on the test server
//! (`trainyard_testdb`, which says where that server is).

use reqwest::{Client, Response};
use serde_json::{json, Value};
use sqlx::PgPool;
use std::net::SocketAddr;
use trainyard_api::{Application, Config};

pub struct TestApp {
    pub addr: SocketAddr,
    pub db: PgPool,
    pub db_name: String,
    pub client: Client,
}

pub use trainyard_testdb::admin_url;
use trainyard_testdb::TestDatabase;

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(tweak: impl FnOnce(&mut Config)) -> TestApp {
    let TestDatabase { name: db_name, url } = TestDatabase::fresh("ty_test").await;

    let mut config = Config::for_tests("127.0.0.1:0".parse().unwrap());
    // The specs of these tests read file:///data/…: an admin allowed it,
    // so users' jobs may too (the policy's own tests say otherwise).
    config.allow_data_urls = vec!["file:///data/".into()];
    // A store of the test's own (the default is under the working folder).
    config.object_store = Some(format!(
        "file://{}",
        std::env::temp_dir()
            .join(format!("{db_name}-objects"))
            .display()
    ));
    tweak(&mut config);
    let app = Application::build(config, &url).await.expect("build app");
    let addr = app.local_addr();
    let db = app.state().db.clone();
    tokio::spawn(app.run_until(std::future::pending()));
    TestApp {
        addr,
        db,
        db_name,
        client: Client::new(),
    }
}

impl TestApp {
    /// A user token for `owner`, made with the admin token `admin`.
    pub async fn user_token(&self, admin: &str, owner: &str) -> String {
        let r = self
            .send_as(
                reqwest::Method::POST,
                "/v1/tokens",
                Some(admin),
                Some(&json!({"owner": owner, "role": "user"})),
            )
            .await;
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        let v: Value = r.json().await.unwrap();
        v["token"].as_str().unwrap().to_owned()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn get(&self, path: &str) -> Response {
        self.client.get(self.url(path)).send().await.unwrap()
    }

    /// GET `path` as JSON (whatever the status).
    pub async fn get_json(&self, path: &str) -> Value {
        self.get(path).await.json().await.unwrap()
    }

    /// POST `body` to `path` with the bearer `token` (an executor's).
    pub async fn post_as(&self, path: &str, token: &str, body: &Value) -> Response {
        self.client
            .post(self.url(path))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// Sends `method path` with the bearer `token` (none: no header) and a
    /// JSON `body`.
    pub async fn send_as(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Response {
        let mut req = self.client.request(method, self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        req.send().await.unwrap()
    }

    /// GET `path` with the bearer `token`, as JSON (whatever the status).
    pub async fn get_json_as(&self, path: &str, token: &str) -> Value {
        self.send_as(reqwest::Method::GET, path, Some(token), None)
            .await
            .json()
            .await
            .unwrap()
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn post_empty(&self, path: &str) -> Response {
        self.client.post(self.url(path)).send().await.unwrap()
    }

    /// Submits `spec` and returns the created job.
    pub async fn submit(&self, spec: &Value) -> Value {
        let r = self.post_json("/v1/jobs", spec).await;
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        r.json().await.unwrap()
    }
}

/// A valid spec: the digits MLP.
pub fn digits_spec(name: &str) -> Value {
    json!({
        "name": name,
        "model": {"kind": "mlp", "inputs": 64, "hidden": [128], "outputs": 10},
        "dataset": {"kind": "file", "url": "file:///data/digits.npz"},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "lr": 0.001},
        "batch_size": 64,
        "epochs": 5,
        "strategy": "parameter_server",
        "workers": {"min": 2, "max": 4},
        "parameter_servers": 2,
        "consistency": "sync"
    })
}

/// Asserts a problem-details response with `status`, naming `field`
/// (when given), and returns the body.
pub async fn assert_problem(r: Response, status: u16, field: Option<&str>) -> Value {
    assert_eq!(r.status().as_u16(), status);
    let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert_eq!(ct, "application/problem+json");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], status);
    assert!(body["type"].as_str().unwrap().starts_with("/problems/"));
    assert!(!body["title"].as_str().unwrap().is_empty());
    assert!(!body["detail"].as_str().unwrap().is_empty());
    if let Some(field) = field {
        let fields: Vec<&str> = body["errors"]
            .as_array()
            .unwrap_or_else(|| panic!("no errors in {body}"))
            .iter()
            .map(|e| e["field"].as_str().unwrap())
            .collect();
        assert!(fields.contains(&field), "{field} not named in {body}");
    }
    body
}

/// `POST /v1/executors/{id}/{what}` with `body`, as executor `id` with its
/// `token`.
pub async fn executor_post(
    app: &TestApp,
    (id, token): (&str, &str),
    what: &str,
    body: &Value,
) -> Response {
    app.post_as(&format!("/v1/executors/{id}/{what}"), token, body)
        .await
}
