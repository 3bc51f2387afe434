//! `trainyard-client`: the typed async client of Trainyard's REST API.
//!
//! Everyone who talks to the API goes through this crate: the `trainyard`
//! command line (`trainyard-cli`), the executor's control loop, the
//! end-to-end tests and the benchmarks. Requests and answers are the
//! types of [`trainyard_common::api`] and [`trainyard_common::cluster`],
//! the very definitions the server serializes, so a renamed field is a
//! build error rather than a silent `?`.
//!
//! * [`Client`] (this file): base URL, bearer token, request timeout,
//!   connection pool; [`ClientBuilder`] sets them up. Clones share the pool
//!   and the token ([`Client::set_token`] changes it for all of them).
//! * [`error`]: [`ClientError`] — no answer ([`ClientError::Unreachable`],
//!   [`ClientError::Timeout`]), an error status with the problem document
//!   parsed ([`ClientError::Status`] of a [`Problem`]), an answer that does
//!   not decode ([`ClientError::Decode`]).
//! * [`retry`]: the one [`RetryPolicy`] — what is retried (no answer, 5xx,
//!   408, 429; with [`Retry::Any`] every failure), the doubling backoff and
//!   its ceiling, the limits on attempts and time. A client tries each
//!   request once unless given a policy ([`ClientBuilder::retry`],
//!   [`Client::with_retry`]). Requests that make something and may not be
//!   repeated — a submit without an idempotency key, making a token — are
//!   never retried, whatever the policy.
//! * [`sharing`]: users' quotas (admins) and usage accounting;
//! * [`sweeps`]: hyperparameter sweeps (make, list, read, cancel);
//! * [`users`]: the user-facing endpoints — jobs, their events,
//!   assignments, metrics, logs, checkpoints and weights; executors and the
//!   provisioner as admins see them; tokens and `whoami`; health.
//! * [`executors`]: the endpoints an executor calls with its credentials.
//!
//! # The executor's calls, and the retry rule each one needs
//!
//! | call | method | rule |
//! |---|---|---|
//! | register with the join token | [`Client::register`] | until it succeeds: `RetryPolicy::forever(200 ms, 5 s).retrying(Retry::Any)` (a refusal is logged and tried again; a duplicate registration is harmless, the extra executor is never heard of and declared lost) |
//! | heartbeat | [`Client::heartbeat`] | once; the agent's loop tries again at the heartbeat interval (a growing backoff would outlast the scheduler's lost timeout); 404/410 ([`ClientError::status`]) mean register again |
//! | role report | [`Client::report`] | once per call; the delivery loop keeps the slice and asks `RetryPolicy::forever(500 ms, 5 s).retrying(Retry::Any)` for [`RetryPolicy::next_delay`] while it batches, with the credential its role started under ([`Client::with_own_token`]); a 409 of the fence is [`Reported::Stale`] and a 403 [`Reported::Refused`], delivered |
//! | inspection report | [`Client::report_inspection`] | `RetryPolicy::forever(200 ms, 3.2 s)`: until the API takes it or refuses it (a 4xx), never giving up, or the job stays `inspecting` |
//! | drain, leave | [`Client::drain`], [`Client::leave`] | once: on the way out nothing waits for them |
//!
//! The executor's token is the client's ([`Client::set_token`] after each
//! registration); the join token is passed to [`Client::register`] alone.

pub mod artifacts;
pub mod error;
pub mod executors;
pub mod retry;
pub mod sharing;
pub mod sweeps;
pub mod users;

pub use error::{ClientError, Problem};
pub use executors::Reported;
pub use retry::{Retry, RetryPolicy};
pub use sharing::UsageQuery;
pub use users::{JobQuery, ModelFormat};

use reqwest::header::{HeaderValue, CONTENT_TYPE};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Timeout of one request unless the builder says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The header that makes a retried submit return the job the first one
/// made.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// A client of one Trainyard API.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
    retry: RetryPolicy,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token: clients end up in logs and panic messages.
        f.debug_struct("Client")
            .field("base", &self.shared.base)
            .field("timeout", &self.shared.timeout)
            .field("token", &self.token().map(|_| "…"))
            .field("retry", &self.retry)
            .finish()
    }
}

/// What the clones of a client share.
struct Shared {
    http: reqwest::Client,
    base: String,
    timeout: Duration,
    token: RwLock<Option<String>>,
}

/// Sets up a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base: String,
    timeout: Duration,
    token: Option<String>,
    retry: RetryPolicy,
}

impl ClientBuilder {
    /// Longest wait for one answer (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.timeout = timeout;
        self
    }

    /// The bearer token of every request (a user's, an admin's or an
    /// executor's credential); none by default.
    pub fn token(mut self, token: Option<String>) -> ClientBuilder {
        self.token = token;
        self
    }

    /// How requests are retried (default: once, no retry).
    pub fn retry(mut self, policy: RetryPolicy) -> ClientBuilder {
        self.retry = policy;
        self
    }

    /// The client.
    pub fn build(self) -> Result<Client, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(self.timeout)
            .build()
            .map_err(|e| ClientError::Setup(e.to_string()))?;
        Ok(Client {
            shared: Arc::new(Shared {
                http,
                base: self.base.trim_end_matches('/').to_owned(),
                timeout: self.timeout,
                token: RwLock::new(self.token),
            }),
            retry: self.retry,
        })
    }
}

/// Whose credentials a request carries.
#[derive(Clone, Copy)]
enum Auth<'a> {
    /// The client's token, read at each attempt.
    Client,
    /// This bearer token (the cluster join token).
    Bearer(&'a str),
}

/// One request, as often as its retry policy says.
struct Call<'a> {
    method: Method,
    path: String,
    query: Vec<(&'static str, String)>,
    body: Option<Vec<u8>>,
    auth: Auth<'a>,
    idempotency_key: Option<&'a str>,
    /// Whether sending it twice does no harm (else it is never retried).
    repeatable: bool,
}

impl<'a> Call<'a> {
    fn new(method: Method, path: String) -> Call<'a> {
        Call {
            method,
            path,
            query: Vec::new(),
            body: None,
            auth: Auth::Client,
            idempotency_key: None,
            repeatable: true,
        }
    }

    fn get(path: String) -> Call<'a> {
        Call::new(Method::GET, path)
    }

    fn post(path: String) -> Call<'a> {
        Call::new(Method::POST, path)
    }

    fn query(mut self, key: &'static str, value: Option<impl ToString>) -> Call<'a> {
        if let Some(v) = value {
            self.query.push((key, v.to_string()));
        }
        self
    }

    fn json(self, body: &impl Serialize) -> Result<Call<'a>, ClientError> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| ClientError::Setup(format!("cannot encode the request: {e}")))?;
        Ok(self.raw_json(bytes))
    }

    fn raw_json(mut self, bytes: Vec<u8>) -> Call<'a> {
        self.body = Some(bytes);
        self
    }
}

/// A successful answer.
struct Answer {
    url: String,
    status: u16,
    body: Vec<u8>,
}

impl Answer {
    /// The body as a `T`.
    fn decode<T: DeserializeOwned>(&self) -> Result<T, ClientError> {
        serde_json::from_slice(&self.body).map_err(|e| ClientError::Decode {
            url: self.url.clone(),
            status: self.status,
            reason: if serde_json::from_slice::<serde::de::IgnoredAny>(&self.body).is_err() {
                "is not JSON".to_owned()
            } else {
                format!("does not decode: {e}")
            },
        })
    }
}

impl Client {
    /// A client of the API at `base` (e.g. `http://127.0.0.1:8080`) with the
    /// defaults: no token, [`DEFAULT_TIMEOUT`], no retry.
    pub fn new(base: impl Into<String>) -> Result<Client, ClientError> {
        Client::builder(base).build()
    }

    /// A builder for a client of the API at `base`.
    pub fn builder(base: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base: base.into(),
            timeout: DEFAULT_TIMEOUT,
            token: None,
            retry: RetryPolicy::once(),
        }
    }

    /// This client with another retry policy (same pool, same token).
    pub fn with_retry(&self, policy: RetryPolicy) -> Client {
        Client {
            shared: self.shared.clone(),
            retry: policy,
        }
    }

    /// The retry policy of this client.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    /// The API's base URL, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.shared.base
    }

    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Replaces the bearer token, for this client and all its clones (an
    /// executor's new credential after it registered again).
    pub fn set_token(&self, token: Option<String>) {
        if let Ok(mut t) = self.shared.token.write() {
            *t = token;
        }
    }

    /// The bearer token requests carry now.
    pub fn token(&self) -> Option<String> {
        self.shared.token.read().ok().and_then(|t| t.clone())
    }

    /// A client of the same server, settings and connection pool whose
    /// token is its own: [`Client::set_token`] on either leaves the other's.
    /// An executor's role keeps the credential it was started under, so
    /// that its reports still speak for the executor that held the role
    /// after the executor registered again.
    pub fn with_own_token(&self, token: Option<String>) -> Client {
        Client {
            shared: Arc::new(Shared {
                http: self.shared.http.clone(),
                base: self.shared.base.clone(),
                timeout: self.shared.timeout,
                token: RwLock::new(token),
            }),
            retry: self.retry,
        }
    }

    /// Sends `call`, retrying as the policy says; a success's body.
    async fn send(&self, call: Call<'_>) -> Result<Answer, ClientError> {
        let policy = if call.repeatable {
            self.retry
        } else {
            RetryPolicy::once()
        };
        let started = Instant::now();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let error = match self.attempt(&call).await {
                Ok(answer) => return Ok(answer),
                Err(e) => e,
            };
            match policy.next_delay(&error, attempts, started.elapsed()) {
                Some(wait) => {
                    tracing::debug!(error = %error, attempts, retry_in = ?wait, "API request failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                None => return Err(error),
            }
        }
    }

    async fn attempt(&self, call: &Call<'_>) -> Result<Answer, ClientError> {
        let url = format!("{}{}", self.shared.base, call.path);
        let mut req = self.shared.http.request(call.method.clone(), &url);
        if !call.query.is_empty() {
            req = req.query(&call.query);
        }
        match call.auth {
            Auth::Client => {
                if let Some(t) = self.token() {
                    req = req.bearer_auth(t);
                }
            }
            Auth::Bearer(t) => req = req.bearer_auth(t),
        }
        if let Some(body) = &call.body {
            req = req
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                .body(body.clone());
        }
        if let Some(key) = call.idempotency_key {
            req = req.header(IDEMPOTENCY_KEY, key);
        }
        let timeout = self.shared.timeout;
        let resp = req
            .send()
            .await
            .map_err(|e| ClientError::transport(&url, &e, timeout))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| ClientError::transport(&url, &e, timeout))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            return Err(ClientError::Status(Box::new(Problem::from_body(
                status.as_u16(),
                &text,
            ))));
        }
        Ok(Answer {
            url,
            status: status.as_u16(),
            body: body.into(),
        })
    }

    /// Sends `call` and decodes its answer.
    async fn call<T: DeserializeOwned>(&self, call: Call<'_>) -> Result<T, ClientError> {
        self.send(call).await?.decode()
    }
}
