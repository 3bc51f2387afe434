//! The agent loop: register, heartbeat, run the assigned roles.
//!
//! The executor registers with the cluster join token (retrying with
//! backoff until the API answers), then heartbeats at the interval the API
//! gives, reporting the roles it runs. Each beat is a long-poll: the API
//! holds it (up to one interval) until a membership change gives this
//! executor other roles, so a new generation reaches it in milliseconds. Each answer lists every role
//! assigned to it; a role whose generation changed is stopped and started
//! again, a role no longer listed is stopped. When the API is unreachable
//! the executor keeps its roles running and retries at the heartbeat
//! interval; when the
//! API says it was declared lost (410) or forgotten (404), it registers
//! again. On SIGTERM/SIGINT/SIGUSR1 it drains (the scheduler moves its roles away),
//! waits until nothing is assigned, leaves, and exits.
//!
//! The drain is bounded by the grace period (`--shutdown-grace-secs`): when
//! the API is unreachable the roles still stop with a checkpoint, whose
//! shards are uploaded to the object store (and kept in the local cache
//! tier) while the reports are retried; when the grace period ends the
//! executor exits and logs what it could not deliver. A second signal
//! during the drain exits at once.
//!
//! The data-plane listener is bound before registering so that the address
//! peers receive is real.

use super::report::Sink;
use super::REGISTER;
use crate::context::Context;
use crate::roles::Roles;
use crate::storage::Fetcher;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use trainyard_client::{Client, ClientError};
use trainyard_common::cluster::{ExecutorState, HeartbeatRequest, HeldDevice, RegisterRequest};
use uuid::Uuid;

/// Timeout of each request to the API.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The default grace period of a drain: the longest it waits for the
/// scheduler to move roles away, for checkpoint shards to be uploaded and
/// for reports to be delivered, before the executor exits.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings of the agent.
pub struct AgentConfig {
    /// Base URL of the API, e.g. `http://127.0.0.1:8080`.
    pub api: String,
    /// Cluster join token.
    pub join_token: String,
    /// What to register.
    pub registration: RegisterRequest,
    /// The data-plane listener (its address is in the registration).
    pub plane: Arc<trainyard_dataplane::DataPlane>,
    /// How roles reach the object store and the local cache tier.
    pub fetcher: Fetcher,
    /// Where users' code runs.
    pub sandbox: std::sync::Arc<crate::sandbox::Sandbox>,
    /// How long an inspection may take.
    pub inspection_timeout: std::time::Duration,
    /// The longest a drain may take ([`DRAIN_TIMEOUT`] by default).
    pub grace: Duration,
}

struct Session {
    id: Uuid,
    interval: Duration,
}

/// Runs the agent until a shutdown signal, then drains and leaves.
pub async fn run(config: AgentConfig) -> Result<(), ClientError> {
    let client = Client::builder(config.api.clone())
        .timeout(REQUEST_TIMEOUT)
        .build()?;
    let mut ctx = Context::new(config.fetcher.clone(), config.sandbox.clone());
    ctx.inspection_timeout = config.inspection_timeout;
    let (checks, checked) = tokio::sync::mpsc::unbounded_channel();
    ctx.suspects = crate::signals::Suspicions::new(checks);
    let sink = Sink {
        client: client.clone(),
        id: Arc::new(RwLock::new(Uuid::nil())),
        object_store: Arc::new(RwLock::new(String::new())),
        uploads: ctx.uploads.clone(),
        deliveries: Default::default(),
    };
    tokio::spawn(super::suspects::run(
        client.clone(),
        sink.id.clone(),
        checked,
    ));
    let mut roles = Roles::new(Arc::new(sink.clone()), config.plane.clone(), ctx.clone());
    let shutdown = trainyard_shutdown::termination_or_time_limit();
    tokio::pin!(shutdown);

    let mut session = tokio::select! {
        s = register(&client, &config, &sink) => s,
        () = &mut shutdown => return Ok(()),
    };
    loop {
        let sent = tokio::time::Instant::now();
        let wait = match heartbeat(&client, &session, &mut roles, true).await {
            // New roles are reported running at once (that beat waits for
            // the next change); otherwise one beat per interval, the
            // long-poll's hold included.
            Ok(true) => Duration::ZERO,
            Ok(false) => session.interval.saturating_sub(sent.elapsed()),
            Err(Beat::Gone(why)) => {
                tracing::warn!(%why, "the API no longer knows this executor; stopping its roles and registering again");
                roles.apply(&[]);
                session = tokio::select! {
                    s = register(&client, &config, &sink) => s,
                    () = &mut shutdown => return Ok(()),
                };
                continue;
            }
            Err(Beat::Failed(e)) => {
                // Heartbeats are retried at the heartbeat interval, not with
                // a growing backoff: the first beat after the API comes back
                // must arrive before the scheduler's lost timeout runs out.
                // (Reports, which are larger, back off.)
                tracing::warn!(error = %e, retry_in = ?session.interval, "heartbeat failed; roles keep running");
                session.interval
            }
        };
        let held = roles.held();
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = released(&mut roles, held) => {}
            () = &mut shutdown => break,
        }
    }
    // A second signal ends the drain: the operator wants out now.
    tokio::spawn(async {
        trainyard_shutdown::termination_or_time_limit().await;
        tracing::warn!("a second signal during the drain: exiting at once");
        std::process::exit(130);
    });
    drain_and_leave(&client, &session, &mut roles, &ctx, &sink, config.grace).await;
    Ok(())
}

/// Registers with the join token, as often as it takes ([`REGISTER`]).
async fn register(client: &Client, config: &AgentConfig, sink: &Sink) -> Session {
    for attempt in 1u32.. {
        match client
            .register(&config.join_token, &config.registration)
            .await
        {
            Ok(reg) => {
                tracing::info!(id = %reg.id, "registered with the API");
                client.set_token(Some(reg.token.clone()));
                if let Ok(mut id) = sink.id.write() {
                    *id = reg.id;
                }
                if let Ok(mut o) = sink.object_store.write() {
                    o.clone_from(&reg.object_store);
                }
                return Session {
                    id: reg.id,
                    interval: Duration::from_millis(reg.heartbeat_interval_ms.max(50)),
                };
            }
            Err(e) if e.status().is_some() => tracing::error!(error = %e, "registration refused"),
            Err(e) => tracing::warn!(error = %e, "API unreachable"),
        }
        tokio::time::sleep(REGISTER.delay(attempt)).await;
    }
    unreachable!("registration retries without end")
}

/// Returns when the devices held by roles let go differ from `held` (a
/// model process exited: the scheduler may place another job there), or
/// never when none is held.
async fn released(roles: &mut Roles, held: Vec<HeldDevice>) {
    if held.is_empty() {
        return std::future::pending().await;
    }
    while roles.held() == held {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

enum Beat {
    Gone(String),
    Failed(ClientError),
}

/// One heartbeat; with `long_poll` the API may hold it up to one interval
/// until this executor's roles change. Whether the running roles changed.
async fn heartbeat(
    client: &Client,
    s: &Session,
    roles: &mut Roles,
    long_poll: bool,
) -> Result<bool, Beat> {
    let before = roles.running();
    let held = roles.held();
    // Walking the environments' folder blocks (now and then).
    let environments = tokio::task::spawn_blocking(crate::script::packages::cache_report)
        .await
        .ok()
        .flatten();
    // Not held by the API while a device is held: its release is news.
    let body = HeartbeatRequest {
        roles: before.clone(),
        wait_ms: (long_poll && held.is_empty()).then_some(s.interval.as_millis() as u64),
        progress: roles.progress(),
        held,
        environments,
    };
    match client.heartbeat(s.id, &body).await {
        Ok(hb) => {
            if hb.state == ExecutorState::Draining {
                // Roles checkpoint before they are moved away.
                roles.context().drain.start();
            }
            roles.apply(&hb.assignments);
            roles.inspect(&hb.inspections);
            let mut before = before;
            let mut after = roles.running();
            before.sort();
            after.sort();
            Ok(before != after)
        }
        Err(e) if matches!(e.status(), Some(404 | 410)) => Err(Beat::Gone(e.to_string())),
        Err(e) => Err(Beat::Failed(e)),
    }
}

async fn drain_and_leave(
    client: &Client,
    s: &Session,
    roles: &mut Roles,
    ctx: &Context,
    sink: &Sink,
    grace: Duration,
) {
    tracing::info!(
        ?grace,
        "draining: asking the scheduler to move this executor's roles away"
    );
    let deadline = tokio::time::Instant::now() + grace;
    let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
    ctx.drain.start();
    match tokio::time::timeout(left(), client.drain(s.id)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "drain failed; leaving without it"),
        Err(_) => tracing::warn!("drain not answered within the grace period"),
    }
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(left(), heartbeat(client, s, roles, false)).await {
            Ok(Ok(_)) if roles.is_empty() => break,
            Ok(Ok(_)) => {}
            // The API is gone too (a whole-system stop, or a partition):
            // nothing to hand over; the roles stop here with a checkpoint.
            Ok(Err(_)) | Err(_) => break,
        }
        tokio::time::sleep(s.interval.min(left())).await;
    }
    roles.apply(&[]);
    let wait = left();
    tokio::task::block_in_place(|| roles.wait_stopped(wait));
    // Checkpoint shards still uploading, and every report still held, go
    // first — for as long as the grace period lasts.
    while (ctx.uploads.count() > 0 || sink.deliveries.count() > 0)
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held = sink.deliveries.held();
    if sink.deliveries.count() > 0 || ctx.uploads.count() > 0 {
        tracing::error!(
            metrics = held.metrics,
            logs = held.logs,
            checkpoint_shards = held.checkpoints,
            outcome = held.outcome,
            uploads_unacknowledged = ctx.uploads.count(),
            "the grace period ended with reports the API has not received; exiting without them \
             (uploaded checkpoint shards stay in the object store and the local cache, uncommitted)"
        );
    }
    let left = left().max(Duration::from_secs(1)).min(REQUEST_TIMEOUT);
    match tokio::time::timeout(left, client.leave(s.id)).await {
        Ok(Ok(_)) => tracing::info!("left the cluster"),
        Ok(Err(e)) if e.status().is_some() => tracing::warn!(error = %e, "leave refused"),
        Ok(Err(e)) => tracing::warn!(error = %e, "leave failed"),
        Err(_) => tracing::warn!("leave not answered"),
    }
}
