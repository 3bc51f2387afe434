//! The scheduler's Prometheus metrics: placement latency, round time,
//! queue length, live executors, replans, preemptions and leadership.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// The scheduler's Prometheus metrics.
#[derive(Clone)]
pub struct SchedulerMetrics {
    /// Seconds from submission to first placement.
    pub placement_latency: Histogram,
    /// Seconds one planning round takes (load, plan, write).
    pub round_seconds: Histogram,
    /// Jobs waiting for capacity.
    pub queue_length: IntGauge,
    /// Live executors.
    pub live_executors: IntGauge,
    /// Membership changes written (generation bumps).
    pub replans: IntCounter,
    /// 1 while this process holds the leader lease.
    pub leader: IntGauge,
    /// Capacity taken for higher-priority jobs, by `kind` (`shrink`,
    /// `preempt`).
    pub preemptions: IntCounterVec,
}

impl SchedulerMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<SchedulerMetrics> {
        let buckets = vec![
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
        ];
        let m = SchedulerMetrics {
            placement_latency: Histogram::with_opts(
                HistogramOpts::new(
                    "trainyard_scheduler_placement_latency_seconds",
                    "Seconds from submission to first placement",
                )
                .buckets(buckets.clone()),
            )?,
            round_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "trainyard_scheduler_round_seconds",
                    "Seconds one scheduling round takes",
                )
                .buckets(buckets),
            )?,
            queue_length: IntGauge::new(
                "trainyard_scheduler_queue_length",
                "Jobs waiting for capacity",
            )?,
            live_executors: IntGauge::new("trainyard_scheduler_live_executors", "Live executors")?,
            replans: IntCounter::new(
                "trainyard_scheduler_replans_total",
                "Membership changes written (generation bumps)",
            )?,
            leader: IntGauge::new(
                "trainyard_scheduler_leader",
                "1 while this process leads scheduling",
            )?,
            preemptions: IntCounterVec::new(
                Opts::new(
                    "trainyard_scheduler_preemptions_total",
                    "Elastic jobs shrunk and jobs preempted for higher-priority ones",
                ),
                &["kind"],
            )?,
        };
        registry.register(Box::new(m.preemptions.clone()))?;
        registry.register(Box::new(m.placement_latency.clone()))?;
        registry.register(Box::new(m.round_seconds.clone()))?;
        registry.register(Box::new(m.queue_length.clone()))?;
        registry.register(Box::new(m.live_executors.clone()))?;
        registry.register(Box::new(m.replans.clone()))?;
        registry.register(Box::new(m.leader.clone()))?;
        Ok(m)
    }
}
