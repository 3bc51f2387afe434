//! `GET /v1/events/stream`: server-sent events that say *what* changed, so
//! a page can refetch it instead of polling everything.
//!
//! One [`EventHub`] per server holds one Postgres `LISTEN` session on the
//! channels the scheduler and the API already notify (`trainyard_jobs`,
//! `trainyard_executors`; the payload is the id that changed) and fans the
//! notifications out to every open stream through a broadcast channel.
//! Training metrics and log lines are not announced by Postgres, so while a
//! stream is open the hub also looks once a second at the newest step and
//! log line of every running (or just ended) job and announces those that
//! moved (`progress`). The hub's task starts with the first subscriber and ends
//! with the last one, giving its pooled connection back.
//!
//! Events (`data` is JSON): `ready` (subscribed: fetch what you show),
//! `job` `{"id"}`, `executor` `{"id"}`, `progress` `{"job","step"}`, and
//! `resync` (notifications may have been missed — the hub's `LISTEN`
//! session started, or was lost and opened again: refetch everything). The
//! stream ends when the server shuts down ([`EventHub::close`]), so a
//! graceful shutdown is not held open by browsers.
//!
//! The endpoint sits behind the same bearer token as the rest of `/v1`; the
//! web page reads it with `fetch` (which can send the header) rather than
//! `EventSource` (which cannot). A user's stream carries only its own jobs'
//! events ([`Visibility`]) and no executor events (executors are an admin's
//! to see); an admin's carries everything.

use crate::auth::Principal;
use crate::AppState;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::stream::Stream;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;
use trainyard_scheduler::lifecycle::JOB_CHANNEL;
use trainyard_scheduler::service::EXECUTOR_CHANNEL;
use trainyard_shutdown::Shutdown;
use uuid::Uuid;

/// Changes a slow stream may fall behind by before it is told to resync.
pub const BACKLOG: usize = 1024;
/// How often running jobs are checked for new metrics and log lines.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// How long after a job ends its late metrics and logs are still announced.
pub const LATE_TELEMETRY: Duration = Duration::from_secs(30);
/// Interval of the comment lines that keep idle streams open through proxies.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One change announced to the streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A job changed (state, generation, placement, events).
    Job(Uuid),
    /// An executor changed (registered, state, drained, left).
    Executor(Uuid),
    /// A running job recorded new steps or log lines.
    Progress {
        /// The job.
        job: Uuid,
        /// Its newest recorded step (0 before the first).
        step: i64,
    },
    /// Notifications may have been lost: refetch everything.
    Resync,
}

impl Change {
    fn event(&self) -> Event {
        let (name, data) = match self {
            Change::Job(id) => ("job", serde_json::json!({ "id": id })),
            Change::Executor(id) => ("executor", serde_json::json!({ "id": id })),
            Change::Progress { job, step } => {
                ("progress", serde_json::json!({ "job": job, "step": step }))
            }
            Change::Resync => ("resync", serde_json::json!({})),
        };
        Event::default().event(name).data(data.to_string())
    }
}

/// Fans Postgres notifications out to the open streams (see the module docs).
#[derive(Clone)]
pub struct EventHub {
    inner: Arc<Inner>,
}

struct Inner {
    db: PgPool,
    changes: broadcast::Sender<Change>,
    /// Whether the listening task runs; taken by subscribers and by the task
    /// when it decides to stop, so that neither misses the other.
    running: Mutex<bool>,
    closed: Shutdown,
}

impl EventHub {
    /// A hub over `db`; nothing runs until the first subscriber.
    pub fn new(db: PgPool) -> EventHub {
        EventHub {
            inner: Arc::new(Inner {
                db,
                changes: broadcast::channel(BACKLOG).0,
                running: Mutex::new(false),
                closed: Shutdown::new(),
            }),
        }
    }

    /// Ends every open stream and refuses new ones (server shutdown).
    pub fn close(&self) {
        self.inner.closed.trigger();
    }

    /// A receiver of changes (and of the close signal); starts the task.
    fn subscribe(&self) -> (broadcast::Receiver<Change>, Shutdown) {
        let rx = self.inner.changes.subscribe();
        let mut running = self.inner.running.lock().unwrap_or_else(|e| e.into_inner());
        if !*running && !self.inner.closed.is_triggered() {
            *running = true;
            tokio::spawn(self.clone().run());
        }
        (rx, self.inner.closed.clone())
    }

    /// Listens and polls until the last subscriber leaves or the hub closes.
    async fn run(self) {
        let closed = self.inner.closed.clone();
        let mut last: HashMap<Uuid, (i64, i64)> = HashMap::new();
        let mut listener: Option<PgListener> = None;
        let mut tick = tokio::time::interval(PROGRESS_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if closed.is_triggered() || self.done() {
                return;
            }
            if listener.is_none() {
                match connect(&self.inner.db).await {
                    Ok(l) => {
                        listener = Some(l);
                        // Anything may have changed while nobody listened.
                        let _ = self.inner.changes.send(Change::Resync);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "event stream: cannot LISTEN; retrying");
                        if self.inner.db.is_closed() {
                            self.stop();
                            return;
                        }
                    }
                }
            }
            let Some(l) = listener.as_mut() else {
                tokio::select! {
                    _ = tokio::time::sleep(PROGRESS_INTERVAL) => {}
                    () = closed.wait() => {}
                }
                continue;
            };
            tokio::select! {
                // `try_recv`, not `recv`: `recv` reopens a lost session
                // silently, and what was notified meanwhile is gone unsaid.
                n = l.try_recv() => match n {
                    Ok(Some(n)) => {
                        if let Some(change) = change_of(n.channel(), n.payload()) {
                            let _ = self.inner.changes.send(change);
                        }
                    }
                    Ok(None) => {
                        // Opened again above, and only then do the streams
                        // resync: what changes before the new LISTEN is
                        // covered by the refetch.
                        tracing::warn!("event stream: LISTEN session lost; reconnecting");
                        listener = None;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "event stream: LISTEN session failed; reconnecting");
                        listener = None;
                        if self.inner.db.is_closed() {
                            self.stop();
                            return;
                        }
                    }
                },
                _ = tick.tick() => {
                    match progress(&self.inner.db).await {
                        Ok(now) => {
                            for (job, (step, log)) in &now {
                                if last.get(job) != Some(&(*step, *log)) {
                                    let _ = self.inner.changes.send(Change::Progress { job: *job, step: *step });
                                }
                            }
                            last = now;
                        }
                        Err(e) => tracing::warn!(error = %e, "event stream: progress query failed"),
                    }
                }
                () = closed.wait() => {}
            }
        }
    }

    /// True (and the task marked stopped) when nobody listens any more.
    fn done(&self) -> bool {
        let mut running = self.inner.running.lock().unwrap_or_else(|e| e.into_inner());
        if self.inner.changes.receiver_count() == 0 || self.inner.closed.is_triggered() {
            *running = false;
            return true;
        }
        false
    }

    fn stop(&self) {
        *self.inner.running.lock().unwrap_or_else(|e| e.into_inner()) = false;
    }
}

async fn connect(db: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut l = PgListener::connect_with(db).await?;
    // A lost session makes `try_recv` return `None` at once instead of
    // being reopened inside it: that reopening waits for the pool (long
    // while Postgres is down), and the `select!` in `run` would cancel it
    // and with it the only sign that notifications were missed.
    l.eager_reconnect(false);
    l.listen_all([JOB_CHANNEL, EXECUTOR_CHANNEL]).await?;
    Ok(l)
}

/// The change a notification announces; `None` for a payload that is not an id.
fn change_of(channel: &str, payload: &str) -> Option<Change> {
    let id = Uuid::parse_str(payload.trim()).ok()?;
    match channel {
        JOB_CHANNEL => Some(Change::Job(id)),
        EXECUTOR_CHANNEL => Some(Change::Executor(id)),
        _ => None,
    }
}

/// Newest rank-0 step and newest log line of every running job, and of
/// jobs that ended in the last [`LATE_TELEMETRY`] (an executor's last
/// metrics and log lines may arrive just after the outcome).
async fn progress(db: &PgPool) -> Result<HashMap<Uuid, (i64, i64)>, sqlx::Error> {
    let rows: Vec<(Uuid, i64, i64)> = sqlx::query_as(
        "SELECT j.id,
                coalesce((SELECT max(step) FROM job_metrics m WHERE m.job_id = j.id AND m.rank = 0), 0),
                coalesce((SELECT max(id) FROM job_logs l WHERE l.job_id = j.id), 0)
         FROM jobs j
         WHERE j.state IN ('running', 'recovering')
            OR j.finished_at > clock_timestamp() - make_interval(secs => $1)",
    )
    .bind(LATE_TELEMETRY.as_secs_f64())
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|(id, s, l)| (id, (s, l))).collect())
}

/// One event of the stream as its `text/event-stream` lines carry it (the
/// schema of each event, not of the whole body).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // Documentation only: the events are written by `axum::response::sse`.
pub struct StreamEvent {
    /// `ready`, `job`, `executor`, `progress` or `resync`.
    pub event: String,
    /// JSON text: `{}` (`ready`, `resync`), `{"id": …}` (`job`, `executor`) or `{"job": …, "step": …}` (`progress`).
    pub data: String,
}

/// Server-sent events announcing changes to jobs and executors.
///
/// Each event names what changed (`job`, `executor`, `progress` of a running
/// job's metrics and logs); read it again with the REST endpoints. `ready`
/// comes first; `resync` means events may have been missed.
#[utoipa::path(
    get, path = "/v1/events/stream", operation_id = "stream_events", tag = "jobs",
    responses(
        (status = 200, description = "An endless text/event-stream: events `ready`, `job` {id}, `executor` {id}, `progress` {job, step}, `resync`", body = StreamEvent, content_type = "text/event-stream"),
        (status = 401, description = "Missing or wrong token", body = crate::error::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn stream(
    State(st): State<AppState>,
    who: Principal,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (rx, closed) = st.events.subscribe();
    let first = Some(Event::default().event("ready").data("{}"));
    let seen = Visibility::new(st.db.clone(), who);
    let s = futures::stream::unfold(
        (first, rx, closed, seen),
        |(first, mut rx, closed, mut seen)| async move {
            if let Some(ev) = first {
                return Some((Ok(ev), (None, rx, closed, seen)));
            }
            loop {
                if closed.is_triggered() {
                    return None;
                }
                tokio::select! {
                    r = rx.recv() => {
                        let change = match r {
                            Ok(change) => change,
                            Err(broadcast::error::RecvError::Lagged(_)) => Change::Resync,
                            Err(broadcast::error::RecvError::Closed) => return None,
                        };
                        let Some(change) = seen.filter(change).await else {
                            continue;
                        };
                        return Some((Ok(change.event()), (None, rx, closed, seen)));
                    }
                    () = closed.wait() => return None,
                }
            }
        },
    );
    Sse::new(s).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// Which changes one stream's caller may see: an admin everything; a user
/// its own jobs' (owners never change, so each job is looked up once per
/// stream; the memo is dropped when it grows past [`MEMO_LIMIT`]) and no
/// executor's.
pub struct Visibility {
    db: PgPool,
    who: Principal,
    memo: HashMap<Uuid, bool>,
}

/// Jobs one stream remembers the visibility of.
pub const MEMO_LIMIT: usize = 10_000;

impl Visibility {
    fn new(db: PgPool, who: Principal) -> Visibility {
        Visibility {
            db,
            who,
            memo: HashMap::new(),
        }
    }

    /// The change as this caller may see it, or nothing.
    async fn filter(&mut self, change: Change) -> Option<Change> {
        if self.who.is_admin() {
            return Some(change);
        }
        let job = match &change {
            Change::Resync => return Some(change),
            Change::Executor(_) => return None,
            Change::Job(id) | Change::Progress { job: id, .. } => *id,
        };
        if let Some(v) = self.memo.get(&job) {
            return v.then_some(change);
        }
        match crate::auth::owner_of(&self.db, job).await {
            Ok(owner) => {
                let v = owner.is_some_and(|o| self.who.sees(&o));
                if self.memo.len() >= MEMO_LIMIT {
                    self.memo.clear();
                }
                self.memo.insert(job, v);
                v.then_some(change)
            }
            // The database is away: whether this change was the caller's is
            // unknown, so tell it to refetch what it shows.
            Err(_) => Some(Change::Resync),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_name_what_changed() {
        let id = Uuid::now_v7();
        assert_eq!(
            change_of(JOB_CHANNEL, &id.to_string()),
            Some(Change::Job(id))
        );
        assert_eq!(
            change_of(EXECUTOR_CHANNEL, &id.to_string()),
            Some(Change::Executor(id))
        );
        assert_eq!(change_of(JOB_CHANNEL, "not an id"), None);
        assert_eq!(change_of("elsewhere", &id.to_string()), None);
    }
}
