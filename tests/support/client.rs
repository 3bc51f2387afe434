//! The one blocking client of the API the end-to-end tests (and the
//! end-to-end benchmarks) use, with the reads and waits they share: a
//! job, its state, its events and log lines over all pages, its result,
//! its checkpoints, the live executors, and waiting for a job to end or to
//! have trained a number of steps. Also the readers of what a job leaves:
//! server-sent events and safetensors files.
//!
//! [`ApiClient`] is a blocking facade over the typed async client
//! ([`trainyard_client::Client`]), driven by a tokio runtime of its own
//! with one worker thread (as reqwest's blocking client has: the pool's
//! connections are watched between requests, so one that a killed server
//! closed is dropped before it is handed out): every endpoint the typed client covers is read
//! through it, into the response types of `trainyard_common::api`. The
//! HTTP behaviour tests must also speak raw HTTP (status codes, problem
//! documents, arbitrary paths, the SSE stream, the web UI's files): that
//! goes through [`ApiClient::request`], the one place a raw request is
//! made, and the helpers on it ([`ApiClient::get`], [`ApiClient::post`],
//! [`ApiClient::get_response`], [`ApiClient::get_text`],
//! [`ApiClient::event_stream`]).

use crate::process::eventually;
use reqwest::blocking::{RequestBuilder, Response};
use reqwest::Method;
use serde_json::Value;
use std::collections::BTreeMap;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use trainyard_client::{Client, ClientError};
use trainyard_common::api::{
    CheckpointList, EventPage, ExecutorList, Job, JobAssignments, JobEvent, JobLogLine, LogPage,
    MetricSeries, ProvisionerStatus,
};
use trainyard_common::EventKind;
use uuid::Uuid;

/// The states a job does not leave.
pub const TERMINAL: [&str; 3] = ["succeeded", "failed", "cancelled"];

/// Page size of the event and log reads (the API's most).
const PAGE: u32 = 1000;

/// A blocking client of the API, for tests. A failed request of a typed
/// read panics, naming the request and the error; the polling reads
/// ([`ApiClient::poll_job`], [`ApiClient::state`], [`ApiClient::wait_end`],
/// [`ApiClient::steps_recorded`], [`ApiClient::live_executors`]) take an
/// error answer (a 503 while Postgres is away) as "not yet" and panic only
/// when no answer comes.
#[derive(Clone)]
pub struct ApiClient {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    timeout: Duration,
    token: Option<String>,
    typed: Client,
    raw: reqwest::blocking::Client,
    rt: Arc<tokio::runtime::Runtime>,
}

impl ApiClient {
    /// A client of the API on `port` (requests time out after 10 s).
    pub fn new(port: u16) -> ApiClient {
        ApiClient::at(&format!("http://127.0.0.1:{port}"), Duration::from_secs(10))
    }

    /// A client of the API at `base` whose requests time out after `timeout`.
    pub fn at(base: &str, timeout: Duration) -> ApiClient {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        ApiClient::with(base, timeout, None, Arc::new(rt))
    }

    fn with(
        base: &str,
        timeout: Duration,
        token: Option<String>,
        rt: Arc<tokio::runtime::Runtime>,
    ) -> ApiClient {
        ApiClient {
            base: base.to_owned(),
            timeout,
            typed: Client::builder(base)
                .timeout(timeout)
                .token(token.clone())
                .build()
                .expect("a typed API client"),
            raw: reqwest::blocking::Client::builder()
                .timeout(timeout)
                .build()
                .expect("a reqwest client"),
            token,
            rt,
        }
    }

    /// A client of a new plain user `name`, whose token this client (an
    /// admin's) makes.
    pub fn new_user(&self, name: &str) -> ApiClient {
        let (status, token) = self.post(
            "/v1/tokens",
            &serde_json::json!({"owner": name, "role": "user"}),
        );
        assert_eq!(status, 201, "{token}");
        self.with_token(token["token"].as_str().expect("a token"))
    }

    /// Uploads `file` as this user's artifact `name`; its `artifact:` URL.
    pub fn upload(&self, name: &str, file: &std::path::Path) -> String {
        let r = self
            .request(Method::PUT, &format!("/v1/artifacts/{name}"))
            .body(std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display())))
            .send()
            .unwrap();
        assert!(r.status().is_success(), "uploading {name}: {}", r.status());
        format!("artifact:{name}")
    }

    /// The same client sending `token` as its bearer token.
    pub fn with_token(&self, token: &str) -> ApiClient {
        ApiClient::with(
            &self.base,
            self.timeout,
            Some(token.to_owned()),
            self.rt.clone(),
        )
    }

    /// Waits for a read of the typed client.
    fn read<T, F>(&self, call: impl Fn() -> F) -> Result<T, ClientError>
    where
        F: Future<Output = Result<T, ClientError>>,
    {
        self.rt.block_on(call())
    }

    /// The answer of a read (panics, naming `what`, if it failed).
    fn call<T, F>(&self, what: &str, call: impl Fn() -> F) -> T
    where
        F: Future<Output = Result<T, ClientError>>,
    {
        self.read(call).unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    /// The answer of a polling read: `None` for an error answer, a panic
    /// when none came.
    fn poll<T, F>(&self, what: &str, call: impl Fn() -> F) -> Option<T>
    where
        F: Future<Output = Result<T, ClientError>>,
    {
        match self.read(call) {
            Ok(v) => Some(v),
            Err(ClientError::Status(_)) => None,
            Err(e) => panic!("{what}: {e}"),
        }
    }

    // ---- Raw HTTP, for the tests of the API's HTTP behaviour ----

    /// The one place a raw request is made: `method` to `path`, with the
    /// client's bearer token.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let req = self.raw.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// GET `path`: the response as it came (for its status and headers).
    pub fn get_response(&self, path: &str) -> Response {
        self.request(Method::GET, path)
            .send()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// GET `path` as JSON (panics on a transport error or a non-JSON body).
    pub fn get(&self, path: &str) -> Value {
        self.get_response(path)
            .json()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// GET `path` as text (the Prometheus `/metrics`, for one).
    pub fn get_text(&self, path: &str) -> String {
        self.get_response(path)
            .text()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// POST `body` to `path`: the status and the JSON answer.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .request(Method::POST, path)
            .json(body)
            .send()
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = r.status().as_u16();
        (status, r.json().unwrap_or(Value::Null))
    }

    /// Opens `/v1/events/stream` (no timeout: it stays open).
    pub fn event_stream(&self) -> reqwest::Result<Response> {
        let client = reqwest::blocking::Client::builder().timeout(None).build()?;
        let req = client.get(format!("{}/v1/events/stream", self.base));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
        .send()
    }

    // ---- Typed reads and waits ----

    /// Submits a job spec; its id (panics unless the API made the job).
    pub fn submit(&self, spec: &Value) -> String {
        // Once: a submit without an idempotency key is never sent twice.
        self.rt
            .block_on(self.typed.submit_job(spec, None))
            .unwrap_or_else(|e| panic!("submit: {e}"))
            .id
            .to_string()
    }

    /// The names of the live executors (none while the API answers with an
    /// error).
    pub fn live_executors(&self) -> Vec<String> {
        self.poll("live executors", || self.typed.executors(Some("live")))
            .map(|l| l.executors.into_iter().map(|e| e.name).collect())
            .unwrap_or_default()
    }

    /// The executors (`state`: only those in it), newest first.
    pub fn executors(&self, state: Option<&str>) -> ExecutorList {
        self.call("executors", || self.typed.executors(state))
    }

    /// The provisioner's settings, executors and decisions (its `limit`
    /// most recent; the API's default 100).
    pub fn provisioner(&self, limit: Option<u32>) -> ProvisionerStatus {
        self.call("provisioner", || self.typed.provisioner(limit))
    }

    /// Job `id` as the API shows it.
    pub fn job(&self, id: &str) -> Job {
        self.call(&format!("job {id}"), || self.typed.job(uuid(id)))
    }

    /// Job `id`, or `None` while the API answers with an error (panics
    /// when no answer comes).
    pub fn poll_job(&self, id: &str) -> Option<Job> {
        self.poll(&format!("job {id}"), || self.typed.job(uuid(id)))
    }

    /// The state of job `id` (`?` while the API answers with an error).
    pub fn state(&self, id: &str) -> String {
        self.poll_job(id)
            .map(|j| j.state.to_string())
            .unwrap_or_else(|| "?".to_owned())
    }

    /// Waits up to `limit` for job `id` to end; the job (panics, with its
    /// log lines, if it does not end).
    pub fn wait_end(&self, id: &str, limit: Duration) -> Job {
        eventually(limit, || {
            self.poll_job(id).filter(|j| j.state.is_terminal())
        })
        .unwrap_or_else(|| {
            panic!(
                "job {id} did not end: {:?} {:?}",
                self.poll_job(id),
                self.log_messages(id)
            )
        })
    }

    /// Waits up to `limit` for job `id` to fail; the job, whose reason must
    /// hold each of `words` (`what` names the case in a panic).
    pub fn wait_failed_with(&self, what: &str, id: &str, limit: Duration, words: &[&str]) -> Job {
        let job = self.wait_end(id, limit);
        assert_eq!(
            job.state,
            trainyard_common::JobState::Failed,
            "{what}: {job:?}"
        );
        for w in words {
            assert!(
                job.state_reason.contains(w),
                "{what}: {:?} lacks {w:?}",
                job.state_reason
            );
        }
        job
    }

    /// Who holds which role of job `id` now.
    pub fn assignments(&self, id: &str) -> JobAssignments {
        self.call(&format!("assignments of {id}"), || {
            self.typed.job_assignments(uuid(id))
        })
    }

    /// Rank 0's training curve of job `id` in at most `max_points` points.
    pub fn metrics(&self, id: &str, max_points: Option<u32>) -> MetricSeries {
        self.call(&format!("metrics of {id}"), || {
            self.typed.job_metrics(uuid(id), max_points)
        })
    }

    /// One page of job `id`'s events: those after `after`, at most `limit`
    /// (the API's defaults when `None`).
    pub fn event_page(&self, id: &str, after: Option<i64>, limit: Option<u32>) -> EventPage {
        self.call(&format!("events of {id}"), || {
            self.typed.job_events(uuid(id), after, limit)
        })
    }

    /// One page of job `id`'s log lines: those after `after`, at most
    /// `limit` (the API's defaults when `None`).
    pub fn log_page(&self, id: &str, after: Option<i64>, limit: Option<u32>) -> LogPage {
        self.call(&format!("logs of {id}"), || {
            self.typed.job_logs(uuid(id), after, limit)
        })
    }

    /// Every event of job `id`, oldest first.
    pub fn events(&self, id: &str) -> Vec<JobEvent> {
        all_pages(|after| {
            let page = self.event_page(id, Some(after), Some(PAGE));
            (page.events, page.next_after)
        })
    }

    /// The states job `id` went through, by its events.
    pub fn states(&self, id: &str) -> Vec<String> {
        self.events(id)
            .iter()
            .filter_map(|e| e.to_state.map(|s| s.to_string()))
            .collect()
    }

    /// The data of job `id`'s result event (panics if it has none).
    pub fn result(&self, id: &str) -> Value {
        let events = self.events(id);
        events
            .iter()
            .find(|e| e.kind == EventKind::Result)
            .map(|e| e.data.clone())
            .unwrap_or_else(|| panic!("a result event of {id}: {events:?}"))
    }

    /// The held-out accuracy of job `id`'s result.
    pub fn result_accuracy(&self, id: &str) -> f64 {
        let r = self.result(id);
        r["eval_accuracy"]
            .as_f64()
            .unwrap_or_else(|| panic!("no eval_accuracy in {r}"))
    }

    /// Job `id`'s held-out accuracy as plain PyTorch measures it: see
    /// [`ApiClient::pytorch_evaluation`]. Not the number the platform
    /// reports about itself.
    pub fn pytorch_accuracy(
        &self,
        id: &str,
        spec: &Value,
        data: &std::path::Path,
        dir: &std::path::Path,
    ) -> f64 {
        self.pytorch_evaluation(id, spec, data, dir).accuracy
    }

    /// Job `id` evaluated by plain PyTorch: its final weights downloaded
    /// (`GET /v1/jobs/{id}/model`, safetensors) into `dir`, the MLP of
    /// `spec` rebuilt by `tests/python/evaluate_mlp.py` and evaluated on
    /// the job's held-out split of `data` (the executor's seeded split,
    /// rows it never trained on), with the result of every row.
    pub fn pytorch_evaluation(
        &self,
        id: &str,
        spec: &Value,
        data: &std::path::Path,
        dir: &std::path::Path,
    ) -> PytorchEvaluation {
        std::fs::create_dir_all(dir).unwrap();
        let r = self.get_response(&format!("/v1/jobs/{id}/model?format=safetensors"));
        let status = r.status();
        let bytes = r.bytes().expect("reading the model");
        assert_eq!(
            status,
            200,
            "GET model of {id}: {}",
            String::from_utf8_lossy(&bytes)
        );
        let (model, spec_file) = (
            dir.join(format!("{id}.safetensors")),
            dir.join(format!("{id}.spec.json")),
        );
        std::fs::write(&model, &bytes).unwrap();
        std::fs::write(&spec_file, spec.to_string()).unwrap();
        let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
        let out = std::process::Command::new(&python)
            .arg(crate::repo_root().join("tests/python/evaluate_mlp.py"))
            .arg(&model)
            .arg(&spec_file)
            .arg(data)
            .output()
            .expect("python3 with torch and safetensors (run through ./scripts/test)");
        assert!(
            out.status.success(),
            "evaluate_mlp.py: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
        let accuracy = got["accuracy"]
            .as_f64()
            .unwrap_or_else(|| panic!("no accuracy in {got}"));
        let correct = got["correct"]
            .as_str()
            .unwrap_or_else(|| panic!("no per-row results in {got}"))
            .bytes()
            .map(|b| b == b'1')
            .collect();
        PytorchEvaluation { accuracy, correct }
    }

    /// Where job `id`'s final weights are.
    pub fn weights_url(&self, id: &str) -> String {
        let r = self.result(id);
        r["weights_url"]
            .as_str()
            .unwrap_or_else(|| panic!("no weights_url in {r}"))
            .to_owned()
    }

    /// Every log line of job `id`, oldest first.
    pub fn logs(&self, id: &str) -> Vec<JobLogLine> {
        all_pages(|after| {
            let page = self.log_page(id, Some(after), Some(PAGE));
            (page.lines, page.next_after)
        })
    }

    /// The messages of every log line of job `id`, oldest first.
    pub fn log_messages(&self, id: &str) -> Vec<String> {
        self.logs(id).into_iter().map(|l| l.message).collect()
    }

    /// The steps job `id` has recorded (0 before the first, and while the
    /// API answers with an error).
    pub fn steps_recorded(&self, id: &str) -> i64 {
        self.poll(&format!("metrics of {id}"), || {
            self.typed.job_metrics(uuid(id), Some(1))
        })
        .map_or(0, |m| m.steps_recorded)
    }

    /// Waits up to `limit` until job `id` has recorded `n` steps; panics,
    /// with its log lines, if it does not.
    pub fn wait_steps(&self, id: &str, n: i64, limit: Duration) {
        eventually(limit, || (self.steps_recorded(id) >= n).then_some(())).unwrap_or_else(|| {
            panic!(
                "job {id} did not train {n} steps: {:?} {:?}",
                self.poll_job(id),
                self.log_messages(id)
            )
        })
    }

    /// The tensors of job `id`'s model (`GET /v1/jobs/{id}/tensors`).
    pub fn tensors(&self, id: &str) -> trainyard_common::api::ModelTensors {
        self.call(&format!("tensors of {id}"), || {
            self.typed.job_tensors(uuid(id))
        })
    }

    /// The committed checkpoints of job `id`, newest first.
    pub fn checkpoints(&self, id: &str) -> CheckpointList {
        self.call(&format!("checkpoints of {id}"), || {
            self.typed.job_checkpoints(uuid(id))
        })
    }

    /// Committed checkpoint steps of job `id`, newest first.
    pub fn checkpoint_steps(&self, id: &str) -> Vec<u64> {
        self.checkpoints(id)
            .checkpoints
            .iter()
            .map(|c| c.step)
            .collect()
    }
}

/// Every item of a paged read, oldest first: `page(after)` reads the items
/// after `after` and says where the next page starts (nowhere after the
/// last).
fn all_pages<T>(mut page: impl FnMut(i64) -> (Vec<T>, Option<i64>)) -> Vec<T> {
    let mut out = Vec::new();
    let mut after = Some(0);
    while let Some(a) = after {
        let (items, next) = page(a);
        out.extend(items);
        after = next;
    }
    out
}

/// The job id `id` (panics unless it is a UUID: the tests' ids come from
/// the API).
fn uuid(id: &str) -> Uuid {
    id.parse()
        .unwrap_or_else(|e| panic!("job id {id:?} is not a UUID: {e}"))
}

/// The server-sent events of `resp` as `(event, data)`, read by a thread
/// until the stream ends or the receiver is dropped.
pub fn sse_events(resp: Response) -> mpsc::Receiver<(String, Value)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut kind = String::new();
        for line in BufReader::new(resp).lines().map_while(Result::ok) {
            if let Some(k) = line.strip_prefix("event:") {
                kind = k.trim().to_owned();
            } else if let Some(d) = line.strip_prefix("data:") {
                let data = serde_json::from_str(d.trim()).unwrap_or(Value::Null);
                if tx.send((std::mem::take(&mut kind), data)).is_err() {
                    return;
                }
            }
        }
    });
    rx
}
/// The header of safetensors `bytes`: tensor name → dtype, shape, offsets.
pub fn safetensors_header(bytes: &[u8]) -> Value {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    serde_json::from_slice(&bytes[8..8 + n]).expect("a JSON header")
}

/// The float32 tensors of a safetensors file at a `file://` URL (a job's
/// final weights), by name.
pub fn safetensors_f32(url: &str) -> BTreeMap<String, Vec<f32>> {
    let path = url.strip_prefix("file://").unwrap_or(url);
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let header = safetensors_header(&bytes);
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let data = &bytes[8 + n..];
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let off = v["data_offsets"].as_array().unwrap();
            let (a, b) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            let vals = data[a..b]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (k.clone(), vals)
        })
        .collect()
}

/// A job's final model as plain PyTorch evaluates it on held-out rows.
#[derive(Debug, Clone)]
pub struct PytorchEvaluation {
    /// The share of rows it classifies right.
    pub accuracy: f64,
    /// For each held-out row, in the evaluator's order, whether it is
    /// classified right (for [`crate::compare::Paired`]).
    pub correct: Vec<bool>,
}
