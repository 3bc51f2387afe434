//! The scheduler with real processes on loopback: an API, executor
//! processes that register, heartbeat and get killed, and a second API
//! process that takes over scheduling when the leader dies.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use trainyard_common::EventKind;
use trainyard_e2e::{eventually, kill9, ApiClient, MlpSpec, Platform, Proc};

/// An API that loses an executor after 10 silent heartbeats (2 s), whose
/// executors offer 1 GiB each.
fn platform() -> Platform {
    Platform::builder("cluster")
        .heartbeat_misses(10)
        .client_timeout(Duration::from_secs(5))
        .executor_ram_mb(1024)
        // The jobs here train for real; a step every 100 ms keeps them
        // running, lightly, for as long as the scheduling scenario takes.
        .executor_env("TRAINYARD_SLOW_WORKER", "*:100")
        .start()
}

/// Executor name → its roles (`ps0`, `worker1`, …) for `job`.
fn roles_of(api: &ApiClient, job: &str) -> BTreeMap<String, Vec<String>> {
    let list = api.get("/v1/executors?state=live");
    list["executors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let roles = e["roles"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["job_id"] == job)
                .map(|r| format!("{}{}", r["role"].as_str().unwrap(), r["index"]))
                .collect();
            (e["name"].as_str().unwrap().to_owned(), roles)
        })
        .collect()
}

/// A PS job on synthetic data that trains until it is stopped.
fn ps_spec(name: &str) -> Value {
    MlpSpec::digits(name)
        .hidden(&[128])
        .classification(1000)
        .adam(0.001)
        .batch_size(32)
        .steps(1_000_000)
        .no_eval()
        .ps(2)
        .workers(2, 3)
        .memory_mb(600)
        .build()
}

fn job_state(api: &ApiClient, id: &str) -> (String, i64, usize, usize) {
    let j = api.job(id);
    let roles = roles_of(api, id);
    let workers = roles
        .values()
        .flatten()
        .filter(|r| r.starts_with("worker"))
        .count();
    let ps = roles
        .values()
        .flatten()
        .filter(|r| r.starts_with("ps"))
        .count();
    (j.state.to_string(), j.generation, workers, ps)
}

#[test]
fn ps_job_is_placed_repaired_after_a_kill_and_grows_when_an_executor_joins() {
    let p = platform();
    let api = &p.client;
    let mut execs: BTreeMap<String, Proc> = (1..=4)
        .map(|i| (format!("ex{i}"), p.executor(&format!("ex{i}"))))
        .collect();
    let job = api.submit(&ps_spec("e2e-ps"));

    // 2 PS + 2 workers at least; with 4 executors of 1 GiB and 600 MiB
    // workers it grows to its maximum of 3, leaving one worker slot spare.
    let (_, g1, _, _) = eventually(Duration::from_secs(20), || {
        let s = job_state(api, &job);
        (s.0 == "running" && s.2 == 3 && s.3 == 2).then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "not placed: {:?} {:?}",
            job_state(api, &job),
            api.event_page(&job, None, None)
        )
    });

    // SIGKILL an executor that holds only a worker: its role moves to the spare.
    let roles = roles_of(api, &job);
    let victim = roles
        .iter()
        .find(|(_, r)| r.len() == 1 && r[0].starts_with("worker"))
        .map(|(n, _)| n.clone())
        .expect("a worker-only executor");
    let killed_at = Instant::now();
    kill9(execs[&victim].pid());
    execs.remove(&victim);
    // Repaired: the dead executor is lost (no longer live, so it holds
    // nothing) and a later generation is at full size. (A generation in
    // between may still list it: a crash report from its peers can restart
    // the job in place before the executor is found lost.)
    let (_, g2, _, _) = eventually(Duration::from_secs(5), || {
        let s = job_state(api, &job);
        let gone = !roles_of(api, &job).contains_key(&victim);
        (s.1 > g1 && s.2 == 3 && s.3 == 2 && gone).then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "not repaired within 5 s (the dead executor's roles moved): {:?} {:?}",
            job_state(api, &job),
            roles_of(api, &job)
        )
    });
    let repaired_in = killed_at.elapsed();
    // Once seen (a full run here, 2026-12-07) the repaired placement was
    // read back before any event of it: the explaining event is waited for
    // a few seconds rather than read once. It must still come.
    let explains = |reasons: &[String]| {
        reasons
            .iter()
            .any(|r| r.contains(&format!("{victim} (lost)")))
    };
    let reasons_now = || -> Vec<String> {
        api.event_page(&job, None, None)
            .events
            .into_iter()
            .map(|e| e.reason)
            .collect()
    };
    let explained = eventually(Duration::from_secs(5), || {
        explains(&reasons_now()).then_some(())
    });
    assert!(
        explained.is_some(),
        "no event explains the loss: {:?}",
        reasons_now()
    );
    eprintln!("repaired in {repaired_in:?} (generation {g1} → {g2})");
    eventually(Duration::from_secs(10), || {
        (job_state(api, &job).0 == "running").then_some(())
    })
    .expect("running again");

    // Kill another worker-only executor: no spare left, the job runs with
    // its minimum of 2 workers.
    let roles = roles_of(api, &job);
    if let Some(victim) = roles
        .iter()
        .find(|(_, r)| r.len() == 1 && r[0].starts_with("worker"))
        .map(|(n, _)| n.clone())
    {
        kill9(execs[&victim].pid());
        execs.remove(&victim);
        eventually(Duration::from_secs(10), || {
            let s = job_state(api, &job);
            (s.2 == 2 && s.3 == 2 && s.1 > g2).then_some(())
        })
        .unwrap_or_else(|| panic!("did not shrink to 2 workers: {:?}", job_state(api, &job)));
    }

    // A new executor is absorbed: the job grows back to its maximum.
    execs.insert("ex5".into(), p.executor("ex5"));
    eventually(Duration::from_secs(10), || {
        let s = job_state(api, &job);
        (s.2 == 3
            && s.3 == 2
            && roles_of(api, &job)
                .get("ex5")
                .is_some_and(|r| !r.is_empty()))
        .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "ex5 not absorbed: {:?} {:?}",
            job_state(api, &job),
            roles_of(api, &job)
        )
    });
}

fn leader(api: &ApiClient) -> bool {
    api.get_text("/metrics")
        .lines()
        .any(|l| l == "trainyard_scheduler_leader 1")
}

#[test]
fn two_api_processes_schedule_once_and_fail_over() {
    let a = platform();
    let api_a = &a.client;
    eventually(Duration::from_secs(10), || leader(api_a).then_some(())).expect("A leads");
    let b = a.another_api();
    let api_b = &b.client;
    std::thread::sleep(Duration::from_millis(500));
    assert!(!leader(api_b), "only one process leads");

    // Executors talk to B, so they outlive A.
    let _execs: Vec<Proc> = (1..=3).map(|i| b.executor(&format!("fx{i}"))).collect();
    let mut spec = ps_spec("e2e-failover");
    spec["workers"] = json!({"min": 2, "max": 2});
    let job = api_b.submit(&spec);
    eventually(Duration::from_secs(20), || {
        (job_state(api_b, &job).0 == "running").then_some(())
    })
    .expect("placed");
    std::thread::sleep(Duration::from_secs(1));
    let events = api_b.event_page(&job, None, None);
    let placements = events
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Placement)
        .count();
    assert_eq!(placements, 1, "scheduled twice: {events:?}");
    assert_eq!(job_state(api_b, &job).1, 1, "one generation");

    // Kill the leader: B takes over and schedules the next job.
    let killed = Instant::now();
    kill9(a.server.pid());
    eventually(Duration::from_secs(5), || leader(api_b).then_some(())).expect("B leads within 5 s");
    eprintln!("failover in {:?}", killed.elapsed());
    let mut small = ps_spec("after-failover");
    small["strategy"] = json!("allreduce");
    small.as_object_mut().unwrap().remove("parameter_servers");
    small["workers"] = json!({"min": 1, "max": 1});
    let second = api_b.submit(&small);
    eventually(Duration::from_secs(10), || {
        (job_state(api_b, &second).0 == "running").then_some(())
    })
    .unwrap_or_else(|| panic!("B does not schedule: {:?}", api_b.job(&second)));
}
