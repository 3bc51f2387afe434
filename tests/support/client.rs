//! The one blocking JSON client of the API the end-to-end tests (and the
//! end-to-end benchmarks) use, with the reads and waits they share: a
//! job's state, its events and log lines over all pages, its result, its
//! checkpoints, and waiting for it to end or to have trained a number of
//! steps. Also the readers of what a job leaves: server-sent events and
//! safetensors files.

use crate::process::eventually;
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::Duration;

/// The states a job does not leave.
pub const TERMINAL: [&str; 3] = ["succeeded", "failed", "cancelled"];

/// A small blocking JSON client of the API, for tests. Transport errors and
/// bodies that are not JSON panic, naming the request.
#[derive(Clone)]
pub struct ApiClient {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    client: Client,
    token: Option<String>,
}

impl ApiClient {
    /// A client of the API on `port` (requests time out after 10 s).
    pub fn new(port: u16) -> ApiClient {
        ApiClient::at(&format!("http://127.0.0.1:{port}"), Duration::from_secs(10))
    }

    /// A client of the API at `base` whose requests time out after `timeout`.
    pub fn at(base: &str, timeout: Duration) -> ApiClient {
        ApiClient {
            base: base.to_owned(),
            client: Client::builder()
                .timeout(timeout)
                .build()
                .expect("a reqwest client"),
            token: None,
        }
    }

    /// The same client sending `token` as its bearer token.
    pub fn with_token(&self, token: &str) -> ApiClient {
        ApiClient {
            token: Some(token.to_owned()),
            ..self.clone()
        }
    }

    fn authorized(&self, req: RequestBuilder) -> RequestBuilder {
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// GET `path`: the response as it came (for its status and headers).
    pub fn get_response(&self, path: &str) -> Response {
        self.authorized(self.client.get(format!("{}{path}", self.base)))
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
            .authorized(self.client.post(format!("{}{path}", self.base)))
            .json(body)
            .send()
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = r.status().as_u16();
        (status, r.json().unwrap_or(Value::Null))
    }

    /// Submits a job spec; its id (panics unless 201).
    pub fn submit(&self, spec: &Value) -> String {
        let (status, body) = self.post("/v1/jobs", spec);
        assert_eq!(status, 201, "submit: {body}");
        body["id"].as_str().expect("an id").to_owned()
    }

    /// Opens `/v1/events/stream` (no timeout: it stays open).
    pub fn event_stream(&self) -> reqwest::Result<Response> {
        let client = Client::builder().timeout(None).build()?;
        self.authorized(client.get(format!("{}/v1/events/stream", self.base)))
            .send()
    }

    /// The names of the live executors.
    pub fn live_executors(&self) -> Vec<String> {
        self.get("/v1/executors?state=live")["executors"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Job `id` as the API shows it.
    pub fn job(&self, id: &str) -> Value {
        self.get(&format!("/v1/jobs/{id}"))
    }

    /// The state of job `id` (`?` when it has none).
    pub fn state(&self, id: &str) -> String {
        self.job(id)["state"].as_str().unwrap_or("?").to_owned()
    }

    /// Waits up to `limit` for job `id` to end; the job (panics, with its
    /// log lines, if it does not end).
    pub fn wait_end(&self, id: &str, limit: Duration) -> Value {
        eventually(limit, || {
            let j = self.job(id);
            TERMINAL
                .contains(&j["state"].as_str().unwrap_or(""))
                .then_some(j)
        })
        .unwrap_or_else(|| {
            panic!(
                "job {id} did not end: {} {:?}",
                self.job(id),
                self.log_messages(id)
            )
        })
    }

    /// The items under `key` of every page of `path` (`/v1/jobs/ID/logs`,
    /// `/v1/jobs/ID/events`), oldest first.
    fn all_pages(&self, path: &str, key: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = 0i64;
        loop {
            let page = self.get(&format!("{path}?after={after}&limit=1000"));
            out.extend(
                page[key]
                    .as_array()
                    .unwrap_or_else(|| panic!("{path}: no {key}: {page}"))
                    .iter()
                    .cloned(),
            );
            match page["next_after"].as_i64() {
                Some(a) => after = a,
                None => return out,
            }
        }
    }

    /// Every event of job `id`, oldest first.
    pub fn events(&self, id: &str) -> Vec<Value> {
        self.all_pages(&format!("/v1/jobs/{id}/events"), "events")
    }

    /// The states job `id` went through, by its events.
    pub fn states(&self, id: &str) -> Vec<String> {
        self.events(id)
            .iter()
            .filter_map(|e| e["to_state"].as_str().map(str::to_owned))
            .collect()
    }

    /// The data of job `id`'s result event (panics if it has none).
    pub fn result(&self, id: &str) -> Value {
        let events = self.events(id);
        events
            .iter()
            .find(|e| e["kind"] == "result")
            .map(|e| e["data"].clone())
            .unwrap_or_else(|| panic!("a result event of {id}: {events:?}"))
    }

    /// The held-out accuracy of job `id`'s result.
    pub fn result_accuracy(&self, id: &str) -> f64 {
        let r = self.result(id);
        r["eval_accuracy"]
            .as_f64()
            .unwrap_or_else(|| panic!("no eval_accuracy in {r}"))
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
    pub fn logs(&self, id: &str) -> Vec<Value> {
        self.all_pages(&format!("/v1/jobs/{id}/logs"), "lines")
    }

    /// The messages of every log line of job `id`, oldest first.
    pub fn log_messages(&self, id: &str) -> Vec<String> {
        self.logs(id)
            .iter()
            .filter_map(|l| l["message"].as_str().map(str::to_owned))
            .collect()
    }

    /// The steps job `id` has recorded (0 before the first).
    pub fn steps_recorded(&self, id: &str) -> i64 {
        self.get(&format!("/v1/jobs/{id}/metrics?max_points=1"))["steps_recorded"]
            .as_i64()
            .unwrap_or(0)
    }

    /// Waits up to `limit` until job `id` has recorded `n` steps; panics,
    /// with its log lines, if it does not.
    pub fn wait_steps(&self, id: &str, n: i64, limit: Duration) {
        eventually(limit, || (self.steps_recorded(id) >= n).then_some(())).unwrap_or_else(|| {
            panic!(
                "job {id} did not train {n} steps: {} {:?}",
                self.job(id),
                self.log_messages(id)
            )
        })
    }

    /// Committed checkpoint steps of job `id`, newest first.
    pub fn checkpoint_steps(&self, id: &str) -> Vec<u64> {
        self.get(&format!("/v1/jobs/{id}/checkpoints"))["checkpoints"]
            .as_array()
            .expect("a checkpoint list")
            .iter()
            .map(|c| c["step"].as_u64().expect("a step"))
            .collect()
    }
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
