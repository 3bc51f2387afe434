//! Authentication and authorization of every endpoint, for every kind of
//! caller: no token, a wrong one, a revoked or expired one, the bootstrap
//! admin, a user (the owner of the job at hand, or another user), an
//! executor's own credential, another executor's, and the join token. The
//! table of operations is checked against `/openapi.json`, so an endpoint
//! added later without a row here fails this test.
//!
//! What an outsider sees is compared with what a caller sees for a job that
//! does not exist: the same status and the same words, so ids leak nothing.
//! Also here: the per-user submit rate (429 + `Retry-After`), the cap on
//! waiting jobs, per-user idempotency keys, token validation, and the
//! refusal to listen on the network without an admin token.

use crate::executors::{register, registration};
use crate::helpers::{assert_problem, digits_spec, spawn_app_with, TestApp};
use reqwest::{Method, Response};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use trainyard_api::{Application, Config};

const ADMIN: &str = "bootstrap-admin-token";

/// Who calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Nobody,
    Wrong,
    Revoked,
    Expired,
    Admin,
    /// The user who owns the job at hand.
    Owner,
    /// Another user.
    Other,
    /// The executor at hand, with its own credential.
    Executor,
    /// Another executor's credential.
    OtherExecutor,
    Join,
}

const CALLERS: [Caller; 10] = [
    Caller::Nobody,
    Caller::Wrong,
    Caller::Revoked,
    Caller::Expired,
    Caller::Admin,
    Caller::Owner,
    Caller::Other,
    Caller::Executor,
    Caller::OtherExecutor,
    Caller::Join,
];

/// What a caller gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Past authentication and authorization (any status but 401/403, and
    /// not the answer a missing job gets).
    Allowed,
    Unauthorized,
    Forbidden,
    /// Exactly what a job that does not exist gets.
    NotFound,
}

/// Who may call an operation.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// Health, metrics, the document: anyone.
    Public,
    /// Any user or admin.
    AnyUser,
    /// The job's (or sweep's) owner and admins; another user gets the
    /// missing-job 404.
    JobOwner,
    /// Admins only; users get a 403.
    AdminOnly,
    /// The executor's own credential.
    OwnExecutor,
    /// The executor's own credential or an admin; users get a 403.
    OwnExecutorOrAdmin,
    /// The join token.
    JoinToken,
}

fn expected(rule: Rule, c: Caller) -> Outcome {
    use Caller::*;
    use Outcome::*;
    match rule {
        Rule::Public => Allowed,
        Rule::AnyUser => match c {
            Admin | Owner | Other => Allowed,
            _ => Unauthorized,
        },
        Rule::JobOwner => match c {
            Admin | Owner => Allowed,
            Other => NotFound,
            _ => Unauthorized,
        },
        Rule::AdminOnly => match c {
            Admin => Allowed,
            Owner | Other => Forbidden,
            _ => Unauthorized,
        },
        Rule::OwnExecutor => match c {
            Executor => Allowed,
            _ => Unauthorized,
        },
        Rule::OwnExecutorOrAdmin => match c {
            Executor | Admin => Allowed,
            Owner | Other => Forbidden,
            _ => Unauthorized,
        },
        Rule::JoinToken => match c {
            Join => Allowed,
            _ => Unauthorized,
        },
    }
}

/// One operation as the document names it, how to call it, and its rule.
struct Op {
    method: Method,
    template: &'static str,
    rule: Rule,
    body: Option<Value>,
}

fn op(method: Method, template: &'static str, rule: Rule, body: Option<Value>) -> Op {
    Op {
        method,
        template,
        rule,
        body,
    }
}

struct World {
    app: TestApp,
    tokens: Vec<(Caller, String)>,
    job: String,
    sweep: String,
    executor: String,
    token_id: String,
}

impl World {
    fn token(&self, c: Caller) -> Option<&str> {
        self.tokens
            .iter()
            .find(|(k, _)| *k == c)
            .map(|(_, t)| t.as_str())
    }

    async fn call(&self, c: Caller, method: Method, path: &str, body: Option<&Value>) -> Response {
        self.app.send_as(method, path, self.token(c), body).await
    }
}

async fn make_token(app: &TestApp, owner: &str, role: &str, extra: Value) -> Value {
    let mut body = json!({"owner": owner, "role": role, "label": format!("{owner} tests")});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = app
        .send_as(Method::POST, "/v1/tokens", Some(ADMIN), Some(&body))
        .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    r.json().await.unwrap()
}

fn sweep_body(name: &str) -> Value {
    json!({"name": name, "base": digits_spec(name), "search": "grid",
           "parameters": {"optimizer.lr": {"values": [0.001]}},
           "metric": "eval_accuracy", "goal": "maximize"})
}

async fn submit_as(app: &TestApp, token: &str, spec: &Value) -> Response {
    app.send_as(Method::POST, "/v1/jobs", Some(token), Some(spec))
        .await
}

async fn world() -> World {
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into())).await;
    let alice = make_token(&app, "alice", "user", json!({})).await;
    let bob = make_token(&app, "bob", "user", json!({})).await;
    let revoked = make_token(&app, "alice", "user", json!({})).await;
    let path = format!("/v1/tokens/{}", revoked["id"].as_str().unwrap());
    let r = app.send_as(Method::DELETE, &path, Some(ADMIN), None).await;
    assert_eq!(r.status(), 200);
    let expired = make_token(&app, "alice", "user", json!({"expires_in_secs": 1})).await;
    // The one the table's DELETE revokes.
    let spare = make_token(&app, "spare", "user", json!({})).await;
    let (executor, executor_token) = register(&app, "e1").await;
    let (_, other_executor_token) = register(&app, "e2").await;
    let r = submit_as(
        &app,
        alice["token"].as_str().unwrap(),
        &digits_spec("alice-job"),
    )
    .await;
    assert_eq!(r.status(), 201);
    let job: Value = r.json().await.unwrap();
    assert_eq!(job["owner"], "alice");
    let r = app
        .send_as(
            Method::POST,
            "/v1/sweeps",
            Some(alice["token"].as_str().unwrap()),
            Some(&sweep_body("alice-sweep")),
        )
        .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let sweep: Value = r.json().await.unwrap();
    // The expired token has had its second.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let s = |v: &Value| v["token"].as_str().unwrap().to_owned();
    World {
        tokens: vec![
            (Caller::Wrong, "ty_not-a-token".into()),
            (Caller::Revoked, s(&revoked)),
            (Caller::Expired, s(&expired)),
            (Caller::Admin, ADMIN.into()),
            (Caller::Owner, s(&alice)),
            (Caller::Other, s(&bob)),
            (Caller::Executor, executor_token),
            (Caller::OtherExecutor, other_executor_token),
            (Caller::Join, "test-join-token".into()),
        ],
        job: job["id"].as_str().unwrap().to_owned(),
        sweep: sweep["id"].as_str().unwrap().to_owned(),
        executor,
        token_id: spare["id"].as_str().unwrap().to_owned(),
        app,
    }
}

/// Every operation of the document, with its rule. Operations that change
/// state (cancel, drain, leave, revoke) come last, in an order that keeps
/// the others meaningful.
fn operations() -> Vec<Op> {
    use Method as M;
    let spec = digits_spec("submitted-by-the-table");
    vec![
        op(M::GET, "/healthz", Rule::Public, None),
        op(M::GET, "/readyz", Rule::Public, None),
        op(M::GET, "/metrics", Rule::Public, None),
        op(M::POST, "/v1/jobs", Rule::AnyUser, Some(spec)),
        op(M::GET, "/v1/jobs", Rule::AnyUser, None),
        op(M::GET, "/v1/whoami", Rule::AnyUser, None),
        op(M::GET, "/v1/provisioner", Rule::AnyUser, None),
        op(M::GET, "/v1/events/stream", Rule::AnyUser, None),
        op(M::GET, "/v1/jobs/{id}", Rule::JobOwner, None),
        op(M::GET, "/v1/jobs/{id}/events", Rule::JobOwner, None),
        op(M::GET, "/v1/jobs/{id}/assignments", Rule::JobOwner, None),
        op(M::GET, "/v1/jobs/{id}/checkpoints", Rule::JobOwner, None),
        op(M::GET, "/v1/jobs/{id}/model", Rule::JobOwner, None),
        op(M::GET, "/v1/jobs/{id}/tensors", Rule::JobOwner, None),
        op(M::GET, "/v1/jobs/{id}/outputs", Rule::JobOwner, None),
        op(M::GET, "/v1/jobs/{id}/outputs/{path}", Rule::JobOwner, None),
        op(M::GET, "/v1/jobs/{id}/metrics", Rule::JobOwner, None),
        op(M::GET, "/v1/jobs/{id}/logs", Rule::JobOwner, None),
        op(M::GET, "/v1/jobs/{id}/tensorboard", Rule::JobOwner, None),
        op(
            M::POST,
            "/v1/sweeps",
            Rule::AnyUser,
            Some(sweep_body("by-the-table")),
        ),
        op(M::GET, "/v1/sweeps", Rule::AnyUser, None),
        op(M::GET, "/v1/sweeps/{id}", Rule::JobOwner, None),
        op(
            M::PUT,
            "/v1/artifacts/{name}",
            Rule::AnyUser,
            Some(json!({"an": "artifact"})),
        ),
        op(M::GET, "/v1/artifacts", Rule::AnyUser, None),
        op(M::GET, "/v1/artifacts/{name}", Rule::AnyUser, None),
        op(M::GET, "/v1/artifacts/{name}/content", Rule::AnyUser, None),
        op(M::GET, "/v1/tokens", Rule::AdminOnly, None),
        op(
            M::POST,
            "/v1/tokens",
            Rule::AdminOnly,
            Some(json!({"owner": "carol", "role": "user"})),
        ),
        op(M::GET, "/v1/usage", Rule::AnyUser, None),
        op(M::GET, "/v1/quotas", Rule::AdminOnly, None),
        op(M::GET, "/v1/quotas/{owner}", Rule::AdminOnly, None),
        op(
            M::PUT,
            "/v1/quotas/{owner}",
            Rule::AdminOnly,
            Some(json!({"cpu_workers": 8})),
        ),
        op(M::GET, "/v1/executors", Rule::AdminOnly, None),
        op(M::GET, "/v1/executors/{id}", Rule::AdminOnly, None),
        op(
            M::POST,
            "/v1/executors",
            Rule::JoinToken,
            Some(registration("e3")),
        ),
        op(
            M::POST,
            "/v1/executors/{id}/heartbeat",
            Rule::OwnExecutor,
            Some(json!({"roles": []})),
        ),
        op(
            M::POST,
            "/v1/executors/{id}/reports",
            Rule::OwnExecutor,
            Some(json!({})),
        ),
        op(
            M::POST,
            "/v1/executors/{id}/inspections",
            Rule::OwnExecutor,
            Some(json!({})),
        ),
        op(
            M::POST,
            "/v1/executors/{id}/suspects",
            Rule::OwnExecutor,
            Some(json!({})),
        ),
        op(M::POST, "/v1/jobs/{id}/cancel", Rule::JobOwner, None),
        op(M::POST, "/v1/sweeps/{id}/cancel", Rule::JobOwner, None),
        op(
            M::POST,
            "/v1/executors/{id}/drain",
            Rule::OwnExecutorOrAdmin,
            None,
        ),
        op(M::DELETE, "/v1/artifacts/{name}", Rule::AnyUser, None),
        op(M::DELETE, "/v1/tokens/{id}", Rule::AdminOnly, None),
        op(
            M::DELETE,
            "/v1/executors/{id}",
            Rule::OwnExecutorOrAdmin,
            None,
        ),
    ]
}

fn concrete(w: &World, template: &str) -> String {
    let id = if template.starts_with("/v1/jobs/") {
        &w.job
    } else if template.starts_with("/v1/sweeps/") {
        &w.sweep
    } else if template.starts_with("/v1/tokens/") {
        &w.token_id
    } else {
        &w.executor
    };
    template
        .replace("{id}", id)
        .replace("{name}", "table.json")
        .replace("{path}", "model.pt")
        .replace("{owner}", "carol")
}

#[tokio::test]
async fn every_endpoint_allows_exactly_its_callers() {
    let w = world().await;

    // The table covers every operation of the document, and only those.
    let doc = w.app.get_json("/openapi.json").await;
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for m in ["get", "post", "put", "patch", "delete"] {
            if item.get(m).is_some() {
                documented.insert(format!("{} {path}", m.to_uppercase()));
            }
        }
    }
    let table: BTreeSet<String> = operations()
        .iter()
        .map(|o| format!("{} {}", o.method, o.template))
        .collect();
    assert_eq!(
        documented, table,
        "the table must list every documented operation"
    );

    let missing_job = uuid::Uuid::now_v7().to_string();
    let mut checked = 0;
    for o in operations() {
        let path = concrete(&w, o.template);
        // What any caller sees for a job that does not exist.
        let ghost = if matches!(o.rule, Rule::JobOwner) {
            let p = o
                .template
                .replace("{id}", &missing_job)
                .replace("{path}", "model.pt");
            let r = w
                .call(Caller::Owner, o.method.clone(), &p, o.body.as_ref())
                .await;
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap();
            let detail = body["detail"].as_str().unwrap().replace(&missing_job, "ID");
            Some((status, detail))
        } else {
            None
        };
        // Run the allowed callers last: they may change what the row acts on.
        let mut order: Vec<Caller> = CALLERS.to_vec();
        order.sort_by_key(|c| expected(o.rule, *c) == Outcome::Allowed);
        for c in order {
            let want = expected(o.rule, c);
            let r = w.call(c, o.method.clone(), &path, o.body.as_ref()).await;
            let status = r.status().as_u16();
            let what = format!("{} {} as {c:?}", o.method, o.template);
            // An endless stream (its status is enough) and Prometheus text are
            // not JSON.
            let body: Value = if (o.template == "/v1/events/stream" && status == 200)
                || o.template == "/metrics"
            {
                Value::Null
            } else {
                r.json().await.unwrap_or(Value::Null)
            };
            match want {
                Outcome::Allowed => {
                    assert!(
                        status != 401 && status != 403,
                        "{what}: got {status} {body}"
                    );
                    if let Some((_, ghost_detail)) = &ghost {
                        let detail = body["detail"]
                            .as_str()
                            .unwrap_or("")
                            .replace(&w.job, "ID")
                            .replace(&w.sweep, "ID");
                        assert_ne!(&detail, ghost_detail, "{what}: answered as a missing job");
                    }
                }
                Outcome::Unauthorized => {
                    assert_eq!(status, 401, "{what}: {body}");
                    assert_eq!(body["errors"][0]["field"], "Authorization", "{what}");
                }
                Outcome::Forbidden => {
                    assert_eq!(status, 403, "{what}: {body}");
                    assert!(
                        body["detail"].as_str().unwrap().contains("admin"),
                        "{what}: {body}"
                    );
                }
                Outcome::NotFound => {
                    let (ghost_status, ghost_detail) = ghost.as_ref().unwrap();
                    assert_eq!(status, *ghost_status, "{what}: {body}");
                    let detail = body["detail"]
                        .as_str()
                        .unwrap()
                        .replace(&w.job, "ID")
                        .replace(&w.sweep, "ID");
                    assert_eq!(&detail, ghost_detail, "{what}");
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, table.len() * CALLERS.len());

    // The other user's cancel did nothing; the owner's (run last) did.
    let job = w
        .app
        .get_json_as(&format!("/v1/jobs/{}", w.job), ADMIN)
        .await;
    assert_eq!(job["state"], "cancelled", "{job}");
    let events = w
        .app
        .get_json_as(&format!("/v1/jobs/{}/events", w.job), ADMIN)
        .await;
    let cancels = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["to_state"] == "cancelled")
        .count();
    assert_eq!(cancels, 1, "{events}");
}

#[tokio::test]
async fn users_see_only_their_own_jobs_and_admins_see_all() {
    let w = world().await;
    let alice = w.token(Caller::Owner).unwrap().to_owned();
    let bob = w.token(Caller::Other).unwrap().to_owned();
    let r = submit_as(&w.app, &bob, &digits_spec("bob-job")).await;
    let bobs: Value = r.json().await.unwrap();
    assert_eq!(bobs["owner"], "bob");

    let list = |t: String, q: &'static str| {
        let w = &w;
        async move {
            let v = w.app.get_json_as(&format!("/v1/jobs{q}"), &t).await;
            v["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["owner"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    // Alice's: her job and her sweep's one trial.
    assert_eq!(list(alice.clone(), "").await, ["alice", "alice"]);
    assert_eq!(list(bob.clone(), "").await, ["bob"]);
    // Asking for another user's jobs gives an empty page, not theirs.
    assert!(list(bob.clone(), "?owner=alice").await.is_empty());
    assert_eq!(list(ADMIN.into(), "").await.len(), 3);
    assert_eq!(list(ADMIN.into(), "?owner=alice").await, ["alice", "alice"]);

    // whoami says who each token is.
    for (t, user, role) in [(&alice, "alice", "user"), (&bob, "bob", "user")] {
        let me = w.app.get_json_as("/v1/whoami", t).await;
        assert_eq!(
            (me["user"].as_str(), me["role"].as_str()),
            (Some(user), Some(role))
        );
        assert_eq!(me["open"], false);
    }

    // Bob cannot start from Alice's checkpoints: the answer is the one a
    // job without checkpoints gets.
    let mut spec = digits_spec("resume");
    spec["resume_from"] = json!({"job_id": w.job});
    let r = submit_as(&w.app, &bob, &spec).await;
    let body = assert_problem(r, 422, Some("resume_from.job_id")).await;
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("has no committed checkpoint"),
        "{body}"
    );

    // The same idempotency key is each user's own.
    let keyed = |t: String, name: &'static str| {
        let w = &w;
        async move {
            let r = w
                .app
                .client
                .post(w.app.url("/v1/jobs"))
                .bearer_auth(t)
                .header("Idempotency-Key", "shared-key")
                .json(&digits_spec(name))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            r.json::<Value>().await.unwrap()
        }
    };
    let a = keyed(alice.clone(), "a").await;
    let b = keyed(bob.clone(), "b").await;
    assert_ne!(a["id"], b["id"]);
    assert_eq!(
        (a["owner"].as_str(), b["owner"].as_str()),
        (Some("alice"), Some("bob"))
    );
    assert_eq!(keyed(alice, "a").await["id"], a["id"], "a retry replays");

    // Listing tokens never shows a token or its hash.
    let tokens = w
        .call(Caller::Admin, Method::GET, "/v1/tokens", None)
        .await
        .text()
        .await
        .unwrap();
    for (_, t) in &w.tokens {
        assert!(
            !tokens.contains(t.as_str()),
            "a token leaked into the listing"
        );
    }
    assert!(!tokens.contains("hash"), "{tokens}");
}

#[tokio::test]
async fn submits_over_the_rate_or_the_waiting_cap_are_429_with_retry_after() {
    let app = spawn_app_with(|c| {
        c.admin_token = Some(ADMIN.into());
        c.submit_rate_per_user = 0.5;
        c.submit_burst_per_user = 3;
        c.max_waiting_jobs_per_user = 5;
        c.no_scheduler = true; // jobs stay queued
    })
    .await;
    let alice = make_token(&app, "alice", "user", json!({})).await;
    let alice = alice["token"].as_str().unwrap();
    for i in 0..3 {
        let r = submit_as(&app, alice, &digits_spec(&format!("burst-{i}"))).await;
        assert_eq!(r.status(), 201);
    }
    let r = submit_as(&app, alice, &digits_spec("one-too-many")).await;
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    let body = assert_problem(r, 429, None).await;
    assert!(body["detail"].as_str().unwrap().contains("alice"), "{body}");
    // Admins are not limited.
    for i in 0..10 {
        let r = submit_as(&app, ADMIN, &digits_spec(&format!("admin-{i}"))).await;
        assert_eq!(r.status(), 201);
    }

    // The cap on waiting jobs: with a generous rate, the sixth waiting job
    // of one user is refused, another user's is not, and cancelling one
    // makes room.
    let app = spawn_app_with(|c| {
        c.admin_token = Some(ADMIN.into());
        c.submit_rate_per_user = 1000.0;
        c.submit_burst_per_user = 1000;
        c.max_waiting_jobs_per_user = 5;
        c.no_scheduler = true;
    })
    .await;
    let alice = make_token(&app, "alice", "user", json!({})).await;
    let alice = alice["token"].as_str().unwrap();
    let bob = make_token(&app, "bob", "user", json!({})).await;
    let bob = bob["token"].as_str().unwrap();
    // Concurrent submits cannot overshoot the cap.
    let mut handles = Vec::new();
    for i in 0..12 {
        let (client, url, t) = (app.client.clone(), app.url("/v1/jobs"), alice.to_owned());
        handles.push(tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(t)
                .json(&digits_spec(&format!("w{i}")))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    let mut codes = Vec::new();
    for h in handles {
        codes.push(h.await.unwrap());
    }
    assert_eq!(codes.iter().filter(|c| **c == 201).count(), 5, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 429).count(), 7, "{codes:?}");
    let r = submit_as(&app, alice, &digits_spec("sixth")).await;
    assert_eq!(r.headers()["retry-after"], "30");
    let body = assert_problem(r, 429, None).await;
    assert!(
        body["detail"].as_str().unwrap().contains("5 jobs waiting"),
        "{body}"
    );
    assert_eq!(
        submit_as(&app, bob, &digits_spec("bobs")).await.status(),
        201
    );
    let page = app.get_json_as("/v1/jobs", alice).await;
    let first = page["jobs"][0]["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/jobs/{first}/cancel");
    let r = app.send_as(Method::POST, &path, Some(alice), None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        submit_as(&app, alice, &digits_spec("room")).await.status(),
        201
    );
}

#[tokio::test]
async fn token_requests_are_validated_field_by_field() {
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into())).await;
    let post = |body: Value| {
        let app = &app;
        async move {
            app.send_as(Method::POST, "/v1/tokens", Some(ADMIN), Some(&body))
                .await
        }
    };
    for (body, field) in [
        (json!({"owner": "Alice!", "role": "user"}), "owner"),
        (json!({"owner": "", "role": "user"}), "owner"),
        (json!({"owner": "a".repeat(65), "role": "user"}), "owner"),
        (json!({"owner": "-x", "role": "user"}), "owner"),
        (
            json!({"owner": "x", "role": "user", "label": "l".repeat(129)}),
            "label",
        ),
        (
            json!({"owner": "x", "role": "user", "expires_in_secs": 0}),
            "expires_in_secs",
        ),
        (
            json!({"owner": "x", "role": "user", "label": "a\u{0}b"}),
            "label",
        ),
        (json!({"owner": "x", "role": "root"}), "role"),
        (json!({"owner": "x", "role": "user", "extra": 1}), ""),
    ] {
        let r = post(body.clone()).await;
        let b = assert_problem(r, 422, None).await;
        let fields: Vec<&str> = b["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap())
            .collect();
        assert!(
            fields.iter().any(|f| f.starts_with(field)),
            "{body} should name {field:?}: {b}"
        );
    }
    let r = post(json!(["not", "an", "object"])).await;
    assert_eq!(r.status(), 422);
    // A made admin token can make tokens too, and its user owns its jobs.
    let ops = make_token(&app, "ops", "admin", json!({})).await;
    assert_eq!(ops["role"], "admin");
    assert!(ops["token"].as_str().unwrap().starts_with("ty_"));
    let dave = json!({"owner": "dave", "role": "user"});
    let r = app
        .send_as(
            Method::POST,
            "/v1/tokens",
            ops["token"].as_str(),
            Some(&dave),
        )
        .await;
    assert_eq!(r.status(), 201);
    let made: Value = r.json().await.unwrap();
    assert_eq!(made["created_by"], "ops");
    // Revoking is idempotent; a missing token is a 404.
    let id = made["id"].as_str().unwrap();
    for path in [
        format!("/v1/tokens/{id}"),
        format!("/v1/tokens/{id}"),
        format!("/v1/tokens/{}", uuid::Uuid::now_v7()),
    ] {
        let r = app.send_as(Method::DELETE, &path, Some(ADMIN), None).await;
        let missing = !path.contains(id);
        assert_eq!(r.status(), if missing { 404 } else { 200 }, "{path}");
    }
}

#[tokio::test]
async fn an_open_server_is_loopback_only_and_everyone_is_admin() {
    let mut config = Config::for_tests("0.0.0.0:0".parse().unwrap());
    config.admin_token = None;
    let err = Application::build(config, "postgres://unused@127.0.0.1:1/none")
        .await
        .err()
        .expect("an open server on every interface is refused");
    assert!(err.to_string().contains("--admin-token"), "{err}");
    let mut config = Config::for_tests("0.0.0.0:0".parse().unwrap());
    config.admin_token = Some("  ".into());
    assert!(
        Application::build(config, "postgres://unused@127.0.0.1:1/none")
            .await
            .is_err()
    );

    let app = spawn_app_with(|_| {}).await;
    let me = app.get_json("/v1/whoami").await;
    assert_eq!(
        me,
        json!({"user": "admin", "role": "admin", "token_id": null, "open": true})
    );
    // A token that is presented must still be valid.
    let r = app
        .send_as(Method::GET, "/v1/jobs", Some("made-up"), None)
        .await;
    assert_problem(r, 401, Some("Authorization")).await;
}

/// Reads an event stream until `until` appears in it (or 30 s pass) and
/// returns what it read.
async fn read_stream_until(r: &mut Response, until: &str) -> String {
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !text.contains(until) {
        match tokio::time::timeout_at(deadline, r.chunk()).await {
            Ok(Ok(Some(c))) => text.push_str(&String::from_utf8_lossy(&c)),
            other => panic!("the stream ended or stalled before {until:?} ({other:?}): {text}"),
        }
    }
    text
}

#[tokio::test]
async fn a_users_event_stream_carries_only_its_own_jobs() {
    let w = world().await;
    let open = |t: Caller| {
        let w = &w;
        async move {
            let r = w.call(t, Method::GET, "/v1/events/stream", None).await;
            assert_eq!(r.status(), 200);
            r
        }
    };
    let mut alice = open(Caller::Owner).await;
    let mut admin = open(Caller::Admin).await;
    read_stream_until(&mut alice, "event: ready").await;
    read_stream_until(&mut admin, "event: ready").await;
    // In this order: bob's job, an executor, alice's job.
    let r = submit_as(
        &w.app,
        w.token(Caller::Other).unwrap(),
        &digits_spec("bobs"),
    )
    .await;
    let bobs: Value = r.json().await.unwrap();
    let bobs = bobs["id"].as_str().unwrap().to_owned();
    let (executor, _) = register(&w.app, "late").await;
    let r = submit_as(
        &w.app,
        w.token(Caller::Owner).unwrap(),
        &digits_spec("alices"),
    )
    .await;
    let alices: Value = r.json().await.unwrap();
    let alices = alices["id"].as_str().unwrap().to_owned();

    let all = read_stream_until(&mut admin, &alices).await;
    assert!(all.contains(&bobs) && all.contains(&executor), "{all}");
    let mine = read_stream_until(&mut alice, &alices).await;
    assert!(!mine.contains(&bobs), "bob's job reached alice: {mine}");
    assert!(
        !mine.contains("event: executor"),
        "executors reached a user: {mine}"
    );
}
