//! The chaos suite: jobs of both patterns (ring all-reduce and parameter
//! server) train while a seeded random schedule of faults hits the
//! platform under them — SIGKILL of executors that hold ring ranks, PS
//! shards or PS workers, SIGKILL and restart of the API process, and stop
//! and start of Postgres.
//!
//! What must hold afterwards: every job succeeded; its held-out accuracy
//! is within one point of the same spec trained without faults (on a
//! second, undisturbed platform at the same time); no job is missing from
//! the job list, and each keeps its whole event history (the submit, an
//! unbroken chain of state changes, one result, the end); every executor
//! kill that hit a job is explained in that job's events (the placement
//! that repaired it names the executor as lost), and no executor the test
//! did not kill is declared lost (restarts of the API and of Postgres are
//! invisible to training). An event stream kept open through each
//! Postgres restart is told to resync after it.
//!
//! The chaos platform runs on a Postgres cluster of its own
//! ([`TestPostgres`]), so restarting it disturbs no other test. Executors
//! that die are replaced by new ones (joining at any time is part of the
//! product), so capacity comes back. The seed is printed;
//! `TRAINYARD_CHAOS_SEED=<n>` replays a schedule. The closing summary
//! (`chaos: … faults injected …`) is printed and written to
//! `target/chaos-summary.txt`, which `scripts/test` prints at its end.
//!
//! Beside it, a focused test of what a lost Postgres session means for the
//! event stream: open streams are told to resync.

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use trainyard_common::api::{Job, JobEvent};
use trainyard_common::cluster::ExecutorState;
use trainyard_common::event::Outcome;
use trainyard_common::{EventData, EventKind, JobState};
use trainyard_e2e::{
    eventually, kill9, sse_events, tail, target_dir, ApiClient, Consistency, MlpSpec, Platform,
    Proc, TestPostgres,
};

/// Heartbeats (200 ms) an executor may miss before it is lost: 3 s.
const MISSES: u32 = 15;

/// RAM each executor offers; a worker asks for [`WORKER_MB`]. An
/// executor's one (CPU) device takes one worker, of any job; PS shards
/// take RAM only and sit beside workers.
const EXECUTOR_MB: u32 = 2048;
const WORKER_MB: u64 = 384;

/// Executors of the fault-free platform: one per worker the jobs want at
/// least (an executor's device takes one worker).
const EXECUTORS: usize = 5;

/// Executors of the chaos platform: one more, so that a kill leaves every
/// job's minimum until the replacement joins.
const CHAOS_EXECUTORS: usize = EXECUTORS + 1;

/// Optimizer steps of every job.
const STEPS: u64 = 3000;

/// Every worker sleeps this long after each step (`TRAINYARD_SLOW_WORKER`):
/// the jobs run long enough for the schedule while leaving the two cores
/// mostly idle. Both patterns train synchronously here, so the pause
/// changes no result.
const STEP_PAUSE: &str = "*:20";

/// The faults are spread over the first part of training: fault `i` of
/// `n` comes once the furthest job has done `(i + 1) / (n + 1)` of this
/// share of its steps (and a random moment more), so that every one lands
/// on training that is going on, however fast the machine.
const INJECT_BY: f64 = 0.7;

/// Bounds of the phases (generous: the suite shares two cores with the
/// other end-to-end tests).
const FIRST_PLACEMENT: Duration = Duration::from_secs(120);
const RECOVERY: Duration = Duration::from_secs(60);
const TRAINING: Duration = Duration::from_secs(300);

/// The job specs, trained on both platforms: a ring and two PS jobs on the
/// digits dataset, with checkpoints (a lost PS shard is restored from the
/// newest one).
fn specs() -> Vec<(&'static str, Value)> {
    let base = |name: &str, workers: (u32, u32), seed: u64| {
        MlpSpec::digits(name)
            .hidden(&[128])
            .adamw_warmup(0.005)
            .batch_size(32)
            .steps(STEPS)
            .workers(workers.0, workers.1)
            .memory_mb(WORKER_MB)
            .checkpoint(json!({"every_steps": 50, "keep": 2}))
            .seed(seed)
    };
    let ps = |name: &str, shards: u32, workers: (u32, u32), seed: u64| {
        base(name, workers, seed)
            .ps(shards)
            .consistency(Consistency::Sync)
    };
    vec![
        ("ring", base("ring", (2, 3), 3).build()),
        ("ps-2-shards", ps("ps-2-shards", 2, (2, 2), 7).build()),
        ("ps-1-shard", ps("ps-1-shard", 1, (1, 2), 11).build()),
    ]
}

/// splitmix64: a small seeded generator, so a schedule replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// Which executor a kill looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    RingRank,
    PsShard,
    PsWorker,
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill(Target),
    Api,
    Postgres(&'static str),
}

/// The seeded schedule: four executor kills (a ring rank, a PS shard, a
/// PS worker, and one more of any kind), two API restarts, and two
/// Postgres restarts (one `fast`, one `immediate`), in a random order. A
/// kill waits until the previous victim has been declared lost.
fn schedule(rng: &mut Rng) -> Vec<Fault> {
    let targets = [Target::RingRank, Target::PsShard, Target::PsWorker];
    let extra = targets[rng.below(3) as usize];
    let mut faults = vec![
        Fault::Kill(Target::RingRank),
        Fault::Kill(Target::PsShard),
        Fault::Kill(Target::PsWorker),
        Fault::Kill(extra),
        Fault::Api,
        Fault::Api,
        Fault::Postgres("fast"),
        Fault::Postgres("immediate"),
    ];
    for i in (1..faults.len()).rev() {
        faults.swap(i, rng.below(i as u64 + 1) as usize);
    }
    faults
}

/// A platform with the executors the suite started on it.
struct Fleet {
    label: &'static str,
    p: Platform,
    executors: BTreeMap<String, Proc>,
    /// Output of processes that were killed: (what, the last lines).
    dead: Vec<(String, String)>,
    started: usize,
}

/// A fleet is used through its platform (and so its client).
impl std::ops::Deref for Fleet {
    type Target = Platform;

    fn deref(&self) -> &Platform {
        &self.p
    }
}

/// The options of the suite's platforms: no provisioner (the suite starts
/// and replaces executors itself), heartbeats lost after [`MISSES`].
fn platform(label: &str) -> trainyard_e2e::PlatformBuilder {
    Platform::builder(label)
        .heartbeat_misses(MISSES)
        .no_provisioner()
        .executor_ram_mb(EXECUTOR_MB)
        .executor_env("TRAINYARD_SLOW_WORKER", STEP_PAUSE)
}

impl Fleet {
    fn start(label: &'static str, p: Platform, executors: usize) -> Fleet {
        let mut f = Fleet {
            label,
            p,
            executors: BTreeMap::new(),
            dead: Vec::new(),
            started: 0,
        };
        for _ in 0..executors {
            f.add_executor();
        }
        // Every executor registered before the jobs come: the planner
        // grows the first jobs into free capacity and does not take it
        // back for a later job's start.
        eventually(FIRST_PLACEMENT, || {
            (f.live_executors().len() == executors).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "{label}: the executors did not all register:\n{}",
                f.diagnostics()
            )
        });
        f
    }

    /// Starts one more executor (a new name each time); its name.
    fn add_executor(&mut self) -> String {
        let name = format!("{}-{}", self.label, self.started);
        self.started += 1;
        let proc_ = self.p.executor(&name);
        self.executors.insert(name.clone(), proc_);
        name
    }

    fn kill_executor(&mut self, name: &str) {
        let mut p = self.executors.remove(name).expect("a running executor");
        kill9(p.pid());
        let _ = p.wait_exit(Duration::from_secs(10));
        self.dead
            .push((format!("executor {name} (killed)"), tail(&p.output(), 30)));
    }

    /// SIGKILLs the API, waits `down`, starts it again on the same port
    /// against the same database, and waits until it is ready.
    fn restart_api(&mut self, down: Duration) {
        let old = self.p.crash_api(down);
        self.dead
            .push(("API (killed)".into(), tail(&old.output(), 30)));
    }

    /// The share of its steps job `id` has done, by its metrics.
    fn progress(&self, id: &str) -> f64 {
        let m = self.get(&format!("/v1/jobs/{id}/metrics?max_points=1"));
        let step = m["points"]
            .as_array()
            .and_then(|p| p.last())
            .and_then(|p| p["step"].as_i64())
            .unwrap_or(0);
        step as f64 / STEPS as f64
    }

    /// Executor name → the jobs (of `ids`) it holds a role of, and the
    /// names holding each kind of role, by job.
    fn holders(&self, ids: &[String]) -> BTreeMap<String, BTreeMap<Target, Vec<String>>> {
        let mut out = BTreeMap::new();
        for id in ids {
            let a = self.get(&format!("/v1/jobs/{id}/assignments"));
            let ring = a["strategy"] == "allreduce";
            let names = |key: &str| -> Vec<String> {
                a[key]
                    .as_array()
                    .map(|v| {
                        v.iter()
                            .filter_map(|r| r["executor"]["name"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let mut by_kind = BTreeMap::new();
            if ring {
                by_kind.insert(Target::RingRank, names("workers"));
            } else {
                by_kind.insert(Target::PsWorker, names("workers"));
                by_kind.insert(Target::PsShard, names("parameter_servers"));
            }
            out.insert(id.clone(), by_kind);
        }
        out
    }

    /// The last lines of every process's output, for a failure message.
    fn diagnostics(&self) -> String {
        let mut s = format!(
            "=== {} API (running) ===\n{}\n",
            self.label,
            tail(&self.p.server.output(), 40)
        );
        for (what, out) in &self.dead {
            s.push_str(&format!("=== {} {what} ===\n{out}\n", self.label));
        }
        for (name, p) in &self.executors {
            s.push_str(&format!(
                "=== {} executor {name} ===\n{}\n",
                self.label,
                tail(&p.output(), 20)
            ));
        }
        s
    }
}

/// What one injected fault did.
struct Injected {
    fault: Fault,
    /// For a kill: the executor and the jobs it held roles of.
    victim: Option<(String, BTreeSet<String>)>,
}

/// Polls until every job of `ids` is placed and running.
fn wait_running(p: &Fleet, ids: &[String]) {
    eventually(FIRST_PLACEMENT, || {
        ids.iter().all(|id| p.state(id) == "running").then_some(())
    })
    .unwrap_or_else(|| {
        let states: Vec<Option<Job>> = ids.iter().map(|id| p.poll_job(id)).collect();
        panic!("the {} jobs are not all running: {states:?}", p.label)
    });
}

/// Polls until every job of `ids` has ended; the jobs then.
fn wait_ended(p: &Fleet, ids: &[String]) -> Vec<Job> {
    eventually(TRAINING, || {
        let jobs: Option<Vec<Job>> = ids.iter().map(|id| p.poll_job(id)).collect();
        jobs.filter(|jobs| jobs.iter().all(|j| j.state.is_terminal()))
    })
    .unwrap_or_else(|| {
        let jobs: Vec<Option<Job>> = ids.iter().map(|id| p.poll_job(id)).collect();
        panic!("the {} jobs did not all end: {jobs:?}", p.label)
    })
}

fn accuracy(events: &[JobEvent]) -> Option<f64> {
    events.iter().find_map(|e| match e.typed() {
        Ok(EventData::Result(Outcome::Trained { eval_accuracy, .. })) => eval_accuracy,
        _ => None,
    })
}

/// Checks that `events` is a whole history: increasing ids, the submit
/// first, state changes that each leave the state the previous one
/// entered, one result, and the end in `succeeded`.
fn check_history(name: &str, events: &[JobEvent]) {
    assert!(
        events.windows(2).all(|w| w[0].id < w[1].id),
        "{name}: event ids do not increase: {events:?}"
    );
    let first = events
        .first()
        .unwrap_or_else(|| panic!("{name}: no events"));
    assert_eq!(first.kind, EventKind::Submitted, "{name}: {first:?}");
    assert_eq!(first.to_state, Some(JobState::Queued), "{name}: {first:?}");
    let mut state = "queued".to_owned();
    for e in events.iter().filter(|e| e.kind == EventKind::Transition) {
        assert_eq!(
            e.from_state.map(|s| s.to_string()),
            Some(state.clone()),
            "{name}: a state change is missing before {e:?}"
        );
        state = e.to_state.map_or_else(|| "?".to_owned(), |s| s.to_string());
    }
    assert_eq!(state, "succeeded", "{name}: the history ends in {state}");
    let results = events
        .iter()
        .filter(|e| e.kind == EventKind::Result)
        .count();
    assert_eq!(results, 1, "{name}: {results} result events: {events:?}");
}

/// The executors the reasons of `events` declare lost ("NAME (lost)").
fn declared_lost(events: &[JobEvent]) -> BTreeSet<String> {
    events
        .iter()
        .map(|e| e.reason.as_str())
        .flat_map(|r| {
            r.match_indices(" (lost)")
                .map(|(at, _)| {
                    r[..at]
                        .rsplit([' ', ','])
                        .next()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn summary_path() -> PathBuf {
    target_dir().join("chaos-summary.txt")
}

#[test]
fn jobs_of_both_patterns_survive_killed_executors_api_and_postgres_restarts() {
    let seed = std::env::var("TRAINYARD_CHAOS_SEED")
        .ok()
        .map(|s| s.parse::<u64>().expect("TRAINYARD_CHAOS_SEED is a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!("chaos: seed {seed} (replay with TRAINYARD_CHAOS_SEED={seed})");
    eprintln!("chaos: seed {seed} (replay with TRAINYARD_CHAOS_SEED={seed})");
    let _ = std::fs::remove_file(summary_path());
    let mut rng = Rng(seed);
    let faults = schedule(&mut rng);

    let pg = TestPostgres::start().unwrap();
    let chaos_db = pg.create_database("chaos").unwrap();
    let mut chaos = Fleet::start(
        "chaos",
        platform("chaos").database(&chaos_db).start(),
        CHAOS_EXECUTORS,
    );
    let mut reference = Fleet::start("calm", platform("calm").start(), EXECUTORS);

    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run(&mut chaos, &mut reference, &pg, &mut rng, &faults, seed)
    }));
    if let Err(panic) = outcome {
        // The test command prints the summary file at its end, where a
        // CI log that keeps only part of the output still shows why.
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("(a panic without a message)");
        let first: String = why
            .lines()
            .next()
            .unwrap_or_default()
            .chars()
            .take(600)
            .collect();
        let summary = std::fs::read_to_string(summary_path()).unwrap_or_default();
        let _ = std::fs::write(
            summary_path(),
            format!("{summary}chaos: FAILED (seed {seed}): {first}\n"),
        );
        eprintln!(
            "chaos: failed (seed {seed}); the processes' last lines:\n{}\n{}\n=== Postgres ===\n{}",
            chaos.diagnostics(),
            reference.diagnostics(),
            pg.log_tail(30)
        );
        drop(reference);
        std::panic::resume_unwind(panic);
    }
}

fn run(
    chaos: &mut Fleet,
    reference: &mut Fleet,
    pg: &TestPostgres,
    rng: &mut Rng,
    faults: &[Fault],
    seed: u64,
) {
    let specs = specs();
    let mut ids = Vec::new();
    let mut reference_ids = Vec::new();
    for (_, spec) in &specs {
        ids.push(chaos.client.submit(spec));
        reference_ids.push(reference.client.submit(spec));
    }
    let names: BTreeMap<String, &str> = ids
        .iter()
        .cloned()
        .zip(specs.iter().map(|(n, _)| *n))
        .collect();
    wait_running(chaos, &ids);

    // An open event stream, as the web UI keeps one (opened again after
    // each API restart): a Postgres restart must make it resync.
    let mut stream = watch_stream(&chaos.client);
    let started = Instant::now();
    let mut injected: Vec<Injected> = Vec::new();
    for (i, &fault) in faults.iter().enumerate() {
        let mark = INJECT_BY * (i + 1) as f64 / (faults.len() + 1) as f64;
        eventually(TRAINING, || {
            ids.iter()
                .any(|id| chaos.progress(id) >= mark)
                .then_some(())
        })
        .unwrap_or_else(|| panic!("no job reached {:.0}% of its steps", mark * 100.0));
        std::thread::sleep(rng.millis(0, 1000));
        let at = started.elapsed();
        match fault {
            Fault::Kill(target) => {
                // The previous victim is declared lost first: two deaths the
                // scheduler notices in one round would leave the second's
                // roles unnamed when the first releases the job they share.
                if let Some((previous, _)) = injected.iter().rev().find_map(|i| i.victim.as_ref()) {
                    eventually(RECOVERY, || {
                        chaos.get("/v1/executors?state=lost")["executors"]
                            .as_array()
                            .is_some_and(|a| a.iter().any(|e| e["name"] == previous.as_str()))
                            .then_some(())
                    })
                    .unwrap_or_else(|| panic!("{previous} was not declared lost"));
                }
                let live: Vec<String> = ids
                    .iter()
                    .filter(|id| {
                        ["running", "recovering", "scheduling"].contains(&chaos.state(id).as_str())
                    })
                    .cloned()
                    .collect();
                let holders = chaos.holders(&live);
                let running: Vec<&String> = chaos.executors.keys().collect();
                let mut candidates: Vec<String> = holders
                    .values()
                    .filter_map(|k| k.get(&target))
                    .flatten()
                    .filter(|n| running.contains(n))
                    .cloned()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                if candidates.is_empty() {
                    // No job has such a role right now: any role holder.
                    candidates = holders
                        .values()
                        .flat_map(|k| k.values().flatten())
                        .filter(|n| running.contains(n))
                        .cloned()
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect();
                }
                let Some(victim) = candidates
                    .get(rng.below(candidates.len() as u64) as usize)
                    .cloned()
                else {
                    eprintln!("chaos: {fault:?}: no executor holds a role; skipped");
                    continue;
                };
                let hit: BTreeSet<String> = holders
                    .iter()
                    .filter(|(_, k)| k.values().flatten().any(|n| *n == victim))
                    .map(|(id, _)| id.clone())
                    .collect();
                chaos.kill_executor(&victim);
                let replacement = chaos.add_executor();
                eprintln!(
                    "chaos: {at:.1?}: SIGKILL {victim} ({target:?}; roles of {:?}); {replacement} joins",
                    hit.iter().map(|id| names[id]).collect::<Vec<_>>()
                );
                injected.push(Injected {
                    fault,
                    victim: Some((victim, hit)),
                });
            }
            Fault::Api => {
                let down = rng.millis(500, 4500);
                eprintln!("chaos: {at:.1?}: SIGKILL the API, down for {down:.1?}");
                chaos.restart_api(down);
                stream = watch_stream(&chaos.client);
                injected.push(Injected {
                    fault,
                    victim: None,
                });
            }
            Fault::Postgres(mode) => {
                let down = rng.millis(500, 3000);
                eprintln!("chaos: {at:.1?}: Postgres stops ({mode}), down for {down:.1?}");
                // The stream is open and has had the resync of its hub's start.
                eventually(RECOVERY, || {
                    (count(&stream, "ready") == 1 && count(&stream, "resync") >= 1).then_some(())
                })
                .unwrap_or_else(|| panic!("the event stream did not open: {stream:?}"));
                let resyncs = count(&stream, "resync");
                pg.stop(mode).unwrap();
                std::thread::sleep(down);
                pg.start_again().unwrap();
                trainyard_e2e::wait_ready(
                    &format!("{}/readyz", chaos.client.base),
                    &mut chaos.p.server,
                    RECOVERY,
                )
                .unwrap_or_else(|e| panic!("the API is not ready after Postgres came back: {e}"));
                eventually(RECOVERY, || (count(&stream, "resync") > resyncs).then_some(()))
                    .unwrap_or_else(|| {
                        panic!("the open event stream was not told to resync after Postgres came back: {stream:?}")
                    });
                injected.push(Injected {
                    fault,
                    victim: None,
                });
            }
        }
    }

    let reference_ended = wait_ended(reference, &reference_ids);
    // Their memory goes back to the machine (the chaos run may go on).
    reference.executors.clear();
    let ended = wait_ended(chaos, &ids);

    // What each job says, and the summary (written before the assertions,
    // so a failing run reports its counts too).
    let histories: Vec<Vec<JobEvent>> = ids.iter().map(|id| chaos.events(id)).collect();
    let reference_histories: Vec<Vec<JobEvent>> = reference_ids
        .iter()
        .map(|id| reference.events(id))
        .collect();
    let survived = ended
        .iter()
        .filter(|j| j.state == JobState::Succeeded)
        .count();
    let deltas: Vec<(String, Option<f64>, Option<f64>)> = specs
        .iter()
        .zip(histories.iter().zip(&reference_histories))
        .map(|((name, _), (h, r))| ((*name).to_owned(), accuracy(h), accuracy(r)))
        .collect();
    let count = |f: fn(&Fault) -> bool| injected.iter().filter(|i| f(&i.fault)).count();
    let summary = format!(
        "chaos: {} faults injected ({} executor kills, {} API restarts, {} Postgres restarts), {survived}/{} jobs survived, accuracy deltas {} (seed {seed})",
        injected.len(),
        count(|f| matches!(f, Fault::Kill(_))),
        count(|f| matches!(f, Fault::Api)),
        count(|f| matches!(f, Fault::Postgres(_))),
        ids.len(),
        deltas
            .iter()
            .map(|(n, a, r)| match (a, r) {
                (Some(a), Some(r)) => format!("{n} {:+.2} ({:.2}% vs {:.2}%)", (a - r) * 100.0, a * 100.0, r * 100.0),
                _ => format!("{n} n/a"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("{summary}");
    eprintln!("{summary}");
    let _ = std::fs::write(summary_path(), format!("{summary}\n"));

    assert_eq!(
        injected.len(),
        faults.len(),
        "not every fault of the schedule was injected: {faults:?}"
    );
    // Every job succeeded, on both platforms.
    for (j, r) in ended.iter().zip(&reference_ended) {
        assert_eq!(j.state, JobState::Succeeded, "under chaos: {j:?}");
        assert_eq!(r.state, JobState::Succeeded, "without faults: {r:?}");
    }
    // Within a point of the fault-free run.
    for (name, a, r) in &deltas {
        let (a, r) = (a.expect("an accuracy"), r.expect("an accuracy"));
        assert!(
            (a - r).abs() <= 0.01,
            "{name}: held-out accuracy {a:.4} under chaos, {r:.4} without faults"
        );
    }
    // No job lost: all listed, each with its whole history.
    let listed: BTreeSet<String> = chaos.get("/v1/jobs?limit=500")["jobs"]
        .as_array()
        .expect("a job list")
        .iter()
        .filter_map(|j| j["id"].as_str().map(str::to_owned))
        .collect();
    for (id, h) in ids.iter().zip(&histories) {
        assert!(listed.contains(id), "{} is not listed", names[id]);
        check_history(names[id], h);
    }
    // Each kill that hit a job is explained in its events; nothing else
    // was declared lost.
    let killed: BTreeSet<String> = injected
        .iter()
        .filter_map(|i| i.victim.as_ref().map(|v| v.0.clone()))
        .collect();
    for i in &injected {
        let Some((victim, hit)) = &i.victim else {
            continue;
        };
        for id in hit {
            let h = &histories[ids.iter().position(|x| x == id).expect("a job")];
            let why = h.iter().find(|e| {
                matches!(e.typed(), Ok(EventData::Placement(p))
                    if p.departed.iter().any(|d| &d.name == victim && d.state == ExecutorState::Lost))
            });
            assert!(
                why.is_some(),
                "{}: no event explains the loss of {victim}: {:?}",
                names[id],
                h.iter().map(|e| &e.reason).collect::<Vec<_>>()
            );
        }
    }
    for (id, h) in ids.iter().zip(&histories) {
        let lost = declared_lost(h);
        assert!(
            lost.is_subset(&killed),
            "{}: executors the test did not kill were declared lost: {:?} (killed {killed:?})",
            names[id],
            lost.difference(&killed).collect::<Vec<_>>()
        );
    }
}

/// The names of the events `/v1/events/stream` of `api` sends, collected
/// by a thread until the stream ends (the API stops).
fn watch_stream(api: &ApiClient) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = seen.clone();
    let api = api.clone();
    std::thread::spawn(move || {
        let Ok(r) = api.event_stream() else {
            return;
        };
        for (name, _) in sse_events(r) {
            if let Ok(mut s) = out.lock() {
                s.push(name);
            }
        }
    });
    seen
}

fn count(seen: &std::sync::Mutex<Vec<String>>, name: &str) -> usize {
    seen.lock()
        .map_or(0, |s| s.iter().filter(|n| *n == name).count())
}

/// The event stream's `LISTEN` session dies under it (its backend is
/// terminated, as a Postgres restart or a network cut would end it) and
/// comes back at once: its open streams are told to resync, since what
/// was notified meanwhile is gone.
#[test]
fn an_event_stream_is_told_to_resync_when_its_listen_session_is_lost() {
    let p = platform("stream").start();
    let seen = watch_stream(&p.client);
    // `ready`, then the resync of the hub's first LISTEN.
    eventually(Duration::from_secs(30), || {
        (count(&seen, "ready") == 1 && count(&seen, "resync") >= 1).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the stream opened: {:?}\n{}",
            seen,
            tail(&p.server.output(), 30)
        )
    });
    let before = count(&seen, "resync");
    let name = p.db.rsplit('/').next().unwrap_or_default();
    let out = std::process::Command::new("psql")
        .args([trainyard_e2e::admin_url().as_str(), "-Atqc"])
        .arg(format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = '{name}' AND query LIKE 'LISTEN%'"
        ))
        .output()
        .expect("psql");
    let ended: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(ended >= 1, "no LISTEN session to end: {out:?}");
    eventually(Duration::from_secs(30), || {
        (count(&seen, "resync") > before).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "no resync after the LISTEN session was lost: {:?}\n{}",
            seen,
            tail(&p.server.output(), 30)
        )
    });
}
