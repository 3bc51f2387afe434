//! Prometheus metrics: HTTP requests by route and status, request latency,
//! jobs by state, and each user's usage from the assignment history (both
//! read from Postgres at scrape time, so several API replicas all report
//! the truth).
//!
//! Each [`Metrics`] has its own registry, so several servers in one process
//! (the integration tests) do not share counters.

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{
    CounterVec, Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::sync::Arc;
use std::time::Instant;

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    /// Jobs by state, set at each scrape.
    pub jobs: IntGaugeVec,
    /// Jobs created by this server (replayed submits not counted).
    pub jobs_submitted: IntCounter,
    /// Worker-seconds by owner and device kind (`cuda`, `cpu`), brought up
    /// to the history's total at each scrape.
    pub usage_worker_seconds: CounterVec,
    /// PS RAM GiB-hours by owner, likewise.
    pub usage_ps_ram_gib_hours: CounterVec,
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "trainyard_http_requests_total",
                "HTTP requests by method, route and status",
            ),
            &["method", "route", "status"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "trainyard_http_request_duration_seconds",
                "HTTP request latency by route",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
            ]),
            &["method", "route"],
        )?;
        let jobs = IntGaugeVec::new(Opts::new("trainyard_jobs", "Jobs by state"), &["state"])?;
        let jobs_submitted = IntCounter::new(
            "trainyard_jobs_submitted_total",
            "Jobs created by this server",
        )?;
        let usage_worker_seconds = CounterVec::new(
            Opts::new(
                "trainyard_usage_worker_seconds_total",
                "Seconds × workers held by each user's jobs, by device kind",
            ),
            &["owner", "device"],
        )?;
        let usage_ps_ram_gib_hours = CounterVec::new(
            Opts::new(
                "trainyard_usage_ps_ram_gib_hours_total",
                "GiB × hours of PS shard RAM held by each user's jobs",
            ),
            &["owner"],
        )?;
        registry.register(Box::new(usage_worker_seconds.clone()))?;
        registry.register(Box::new(usage_ps_ram_gib_hours.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(jobs.clone()))?;
        registry.register(Box::new(jobs_submitted.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            latency,
            jobs,
            jobs_submitted,
            usage_worker_seconds,
            usage_ps_ram_gib_hours,
        })
    }

    /// The registry, for other components' metrics (the scheduler's).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "encoding metrics");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// Middleware counting every request by its route template (`/v1/jobs/{id}`,
/// not the concrete path, so that label cardinality stays bounded).
pub async fn track(State(m): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = req.method().as_str().to_owned();
    let start = Instant::now();
    let resp = next.run(req).await;
    m.latency
        .with_label_values(&[&method, &route])
        .observe(start.elapsed().as_secs_f64());
    m.requests
        .with_label_values(&[&method, &route, resp.status().as_str()])
        .inc();
    resp
}
