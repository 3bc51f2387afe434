//! The few calls of MLflow's REST API the exporter makes, over reqwest:
//! find or make an experiment, make a run, log a batch, end the run, and
//! upload an artifact through the server's artifact proxy
//! (`/api/2.0/mlflow-artifacts/artifacts/…`, as `mlflow server` serves it
//! by default).
//!
//! The server is named by users, so the client is defensive: no redirects
//! are followed (a redirect to another host would slip past the URL the
//! API admitted), every request has a connect and a total timeout, and an
//! answer's body is read up to a bound.

use bytes::Bytes;
use serde_json::{json, Value};
use std::time::Duration;

/// Longest wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest JSON call.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// Most bytes of an answer read.
const MAX_ANSWER_BYTES: usize = 1 << 20;
/// An upload gets this long, plus a second per MiB.
const UPLOAD_BASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum MlflowError {
    /// No answer: refused, timed out, cut, or not HTTP.
    #[error("no answer from {0}")]
    Unreachable(String),
    /// An answer that says no (its status, MLflow's error code and message).
    #[error("{status} {code}: {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// MLflow's `error_code`, when the body had one.
        code: String,
        /// Its `message` (or the start of the body).
        message: String,
    },
}

impl MlflowError {
    /// Whether the request itself was refused (a 4xx other than 404, 408
    /// and 429): sending it again would be refused again.
    pub fn is_permanent(&self) -> bool {
        matches!(self, MlflowError::Refused { status, .. }
            if (400..500).contains(status) && ![404, 408, 429].contains(status))
    }
}

/// A run as made: its id and where its artifacts go.
#[derive(Debug, Clone)]
pub struct Run {
    /// `run_id`.
    pub run_id: String,
    /// `artifact_uri` (`mlflow-artifacts:/<experiment>/<run>/artifacts` on
    /// a server that proxies artifacts).
    pub artifact_uri: String,
}

/// One metric point of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// Its key.
    pub key: &'static str,
    /// Its value.
    pub value: f64,
    /// Milliseconds since the epoch.
    pub timestamp_ms: i64,
    /// The step.
    pub step: i64,
}

/// A client of one tracking server.
#[derive(Clone)]
pub struct Mlflow {
    http: reqwest::Client,
    base: String,
}

/// The HTTP client every [`Mlflow`] shares.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .user_agent(concat!("trainyard/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("a client with these settings builds")
}

impl Mlflow {
    /// A client of the server at `base` (no trailing `/`).
    pub fn new(http: reqwest::Client, base: &str) -> Mlflow {
        Mlflow {
            http,
            base: base.trim_end_matches('/').to_owned(),
        }
    }

    async fn answer(&self, r: reqwest::RequestBuilder) -> Result<Value, MlflowError> {
        let resp = r
            .send()
            .await
            .map_err(|e| MlflowError::Unreachable(format!("{}: {}", self.base, chain(&e))))?;
        let status = resp.status().as_u16();
        let body = read_capped(resp)
            .await
            .map_err(|e| MlflowError::Unreachable(format!("{}: {}", self.base, chain(&e))))?;
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok(v);
        }
        let text = String::from_utf8_lossy(&body);
        Err(MlflowError::Refused {
            status,
            code: v["error_code"].as_str().unwrap_or("").to_owned(),
            message: v["message"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| text.chars().take(300).collect()),
        })
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, MlflowError> {
        self.answer(
            self.http
                .post(format!("{}/api/2.0/mlflow/{path}", self.base))
                .json(body),
        )
        .await
    }

    /// The id of experiment `name`, made when missing.
    pub async fn experiment_id(&self, name: &str) -> Result<String, MlflowError> {
        let found = self
            .answer(
                self.http
                    .get(format!(
                        "{}/api/2.0/mlflow/experiments/get-by-name",
                        self.base
                    ))
                    .query(&[("experiment_name", name)]),
            )
            .await;
        match found {
            Ok(v) => return id_of(&v["experiment"]["experiment_id"]),
            Err(MlflowError::Refused { code, .. }) if code == "RESOURCE_DOES_NOT_EXIST" => {}
            Err(e) => return Err(e),
        }
        match self
            .post("experiments/create", &json!({ "name": name }))
            .await
        {
            Ok(v) => id_of(&v["experiment_id"]),
            // Another exporter made it between the two calls.
            Err(MlflowError::Refused { code, .. }) if code == "RESOURCE_ALREADY_EXISTS" => {
                let v = self
                    .answer(
                        self.http
                            .get(format!(
                                "{}/api/2.0/mlflow/experiments/get-by-name",
                                self.base
                            ))
                            .query(&[("experiment_name", name)]),
                    )
                    .await?;
                id_of(&v["experiment"]["experiment_id"])
            }
            Err(e) => Err(e),
        }
    }

    /// Makes a run in `experiment_id`.
    pub async fn create_run(
        &self,
        experiment_id: &str,
        run_name: &str,
        start_ms: i64,
        tags: &[(String, String)],
    ) -> Result<Run, MlflowError> {
        let v = self
            .post(
                "runs/create",
                &json!({
                    "experiment_id": experiment_id,
                    "run_name": run_name,
                    "start_time": start_ms,
                    "tags": key_values(tags),
                }),
            )
            .await?;
        let info = &v["run"]["info"];
        Ok(Run {
            run_id: id_of(&info["run_id"])?,
            artifact_uri: info["artifact_uri"].as_str().unwrap_or("").to_owned(),
        })
    }

    /// Logs a batch (within MLflow's limits: 1000 metrics, 100 params, 100
    /// tags; the caller keeps to them).
    pub async fn log_batch(
        &self,
        run_id: &str,
        metrics: &[Metric],
        params: &[(String, String)],
        tags: &[(String, String)],
    ) -> Result<(), MlflowError> {
        let metrics: Vec<Value> = metrics
            .iter()
            .map(|m| {
                json!({"key": m.key, "value": m.value, "timestamp": m.timestamp_ms, "step": m.step})
            })
            .collect();
        self.post(
            "runs/log-batch",
            &json!({
                "run_id": run_id,
                "metrics": metrics,
                "params": key_values(params),
                "tags": key_values(tags),
            }),
        )
        .await
        .map(|_| ())
    }

    /// Ends the run with `status` (`FINISHED`, `FAILED`, `KILLED`).
    pub async fn end_run(
        &self,
        run_id: &str,
        status: &str,
        end_ms: i64,
    ) -> Result<(), MlflowError> {
        self.post(
            "runs/update",
            &json!({"run_id": run_id, "status": status, "end_time": end_ms}),
        )
        .await
        .map(|_| ())
    }

    /// Uploads `size` bytes from `body` as the run's artifact `name`.
    pub async fn upload<S>(
        &self,
        run: &ArtifactPlace<'_>,
        name: &str,
        size: u64,
        body: S,
    ) -> Result<(), MlflowError>
    where
        S: futures::TryStream + Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        Bytes: From<S::Ok>,
    {
        let url = format!(
            "{}/api/2.0/mlflow-artifacts/artifacts/{}/{name}",
            self.base,
            run.path()
        );
        self.answer(
            self.http
                .put(url)
                .timeout(UPLOAD_BASE_TIMEOUT + Duration::from_secs(size >> 20))
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .header(reqwest::header::CONTENT_LENGTH, size)
                .body(reqwest::Body::wrap_stream(body)),
        )
        .await
        .map(|_| ())
    }
}

/// Where a run's artifacts are, as the artifact proxy's path.
pub struct ArtifactPlace<'a> {
    /// The run's `artifact_uri`.
    pub artifact_uri: &'a str,
    /// Its experiment.
    pub experiment_id: &'a str,
    /// The run.
    pub run_id: &'a str,
}

impl ArtifactPlace<'_> {
    /// The path under `/api/2.0/mlflow-artifacts/artifacts/`: the
    /// `mlflow-artifacts:` URI's path when the run has one (with or
    /// without a host part), else the proxy's layout
    /// `<experiment>/<run>/artifacts`.
    pub fn path(&self) -> String {
        let from_uri = self
            .artifact_uri
            .strip_prefix("mlflow-artifacts:")
            .map(|rest| match rest.strip_prefix("//") {
                // mlflow-artifacts://host:port/path
                Some(hosted) => hosted.split_once('/').map_or("", |(_, p)| p),
                None => rest,
            })
            .map(|p| p.trim_matches('/'))
            .filter(|p| {
                !p.is_empty()
                    && p.split('/')
                        .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
            });
        match from_uri {
            Some(p) => p.to_owned(),
            None => format!("{}/{}/artifacts", self.experiment_id, self.run_id),
        }
    }
}

fn key_values(kv: &[(String, String)]) -> Vec<Value> {
    kv.iter()
        .map(|(k, v)| json!({"key": k, "value": v}))
        .collect()
}

/// An id MLflow gave: a non-empty string of safe characters (it goes into
/// URLs and paths).
fn id_of(v: &Value) -> Result<String, MlflowError> {
    match v.as_str() {
        Some(s)
            if !s.is_empty()
                && s.len() <= 64
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
        {
            Ok(s.to_owned())
        }
        _ => Err(MlflowError::Refused {
            status: 200,
            code: "BAD_ANSWER".into(),
            message: format!("expected an id, got {}", truncate_json(v)),
        }),
    }
}

fn truncate_json(v: &Value) -> String {
    v.to_string().chars().take(100).collect()
}

async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = MAX_ANSWER_BYTES.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= MAX_ANSWER_BYTES {
            break;
        }
    }
    Ok(out)
}

/// An error with its causes (reqwest's own message hides them).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_artifact_path_comes_from_the_runs_uri() {
        let at = |uri| {
            ArtifactPlace {
                artifact_uri: uri,
                experiment_id: "3",
                run_id: "abc",
            }
            .path()
        };
        assert_eq!(at("mlflow-artifacts:/3/abc/artifacts"), "3/abc/artifacts");
        assert_eq!(
            at("mlflow-artifacts://mlflow:5000/3/abc/artifacts"),
            "3/abc/artifacts"
        );
        // Anything else (or a hostile path) falls back to the layout.
        assert_eq!(at("s3://bucket/3/abc"), "3/abc/artifacts");
        assert_eq!(at("mlflow-artifacts:/../../etc"), "3/abc/artifacts");
        assert_eq!(at(""), "3/abc/artifacts");
    }

    #[test]
    fn ids_are_checked() {
        assert_eq!(id_of(&json!("0a1b-2")).unwrap(), "0a1b-2");
        assert!(id_of(&json!("../x")).is_err());
        assert!(id_of(&json!(7)).is_err());
        assert!(id_of(&json!("")).is_err());
    }

    #[test]
    fn only_refusals_of_the_request_are_permanent() {
        let refused = |status| MlflowError::Refused {
            status,
            code: String::new(),
            message: String::new(),
        };
        assert!(refused(400).is_permanent());
        assert!(!refused(404).is_permanent());
        assert!(!refused(429).is_permanent());
        assert!(!refused(503).is_permanent());
        assert!(!MlflowError::Unreachable("x".into()).is_permanent());
    }
}
