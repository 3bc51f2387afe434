//! The local provisioner with real processes: an API that starts with no
//! executor gets them started for a ring job and a PS job, both succeed,
//! and the fleet goes back to zero after the idle timeout; a job larger
//! than the budget stays queued saying why; a hand-started executor is
//! used but never stopped.

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use trainyard_common::event::Provisioning;
use trainyard_common::EventData;
use trainyard_e2e::{binary, eventually, ApiClient, Consistency, MlpSpec, Platform};

/// An API with the local provisioner on a machine of 2 CPUs and 8 GiB that
/// starts executors of 1 GiB, and `settings` of its own.
fn platform(misses: u32, settings: &[(&str, &str)]) -> Platform {
    let mut b = Platform::builder("prov")
        .heartbeat_misses(misses)
        .local_provisioner(2, 8192, 1024);
    for (k, v) in settings {
        b = b.env(k, v);
    }
    b.start()
}

/// The settings of the first two tests, beside their own.
const START_TIMEOUT: (&str, &str) = ("TRAINYARD_PROVISION_START_TIMEOUT_SECS", "120");

fn digits(name: &str, strategy: &str, workers: u32, ps: u32, steps: u64) -> Value {
    let mut spec = MlpSpec::digits(name)
        .adam(0.005)
        .batch_size(32)
        .steps(steps)
        .no_eval()
        .workers(workers, workers)
        .memory_mb(256)
        .seed(5);
    if ps > 0 {
        spec = spec.ps(ps).consistency(Consistency::Sync);
    }
    let spec = spec.build();
    assert_eq!(spec["strategy"], strategy);
    spec
}

fn state(api: &ApiClient, id: &str) -> (String, String) {
    api.poll_job(id)
        .map(|j| (j.state.to_string(), j.state_reason))
        .unwrap_or_default()
}

fn events(api: &ApiClient) -> Vec<Value> {
    api.get("/v1/provisioner?limit=1000")["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn of_kind<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["kind"] == kind).collect()
}

/// What the provisioner told job `id`, typed.
fn provisioning(api: &ApiClient, id: &str) -> Vec<Provisioning> {
    api.event_page(id, None, Some(1000))
        .events
        .into_iter()
        .filter_map(|e| match e.typed() {
            Ok(EventData::Provisioning(p)) => Some(p),
            _ => None,
        })
        .collect()
}

fn pid_alive(pid: i64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z"))
}

#[test]
fn zero_executors_grow_for_a_ring_and_a_ps_job_and_return_to_zero() {
    let mut p = platform(
        10,
        &[
            START_TIMEOUT,
            ("TRAINYARD_PROVISION_MAX_EXECUTORS", "4"),
            ("TRAINYARD_PROVISION_EXECUTOR_CPUS", "0.5"),
            ("TRAINYARD_PROVISION_IDLE_TIMEOUT_SECS", "3"),
        ],
    );
    let api = p.client.clone();
    let status = api.get("/v1/provisioner");
    assert_eq!(status["settings"]["kind"], "local", "{status}");
    assert_eq!(status["settings"]["max_executors"], 4, "{status}");
    assert!(api.live_executors().is_empty());

    let ring = api.submit(&digits("prov-ring", "allreduce", 2, 0, 150));
    let ps = api.submit(&digits("prov-ps", "parameter_server", 2, 1, 150));

    // Both jobs succeed on executors nobody started by hand, never more
    // than the limit at once.
    let mut most = 0;
    let mut seen = BTreeSet::new();
    let done = eventually(Duration::from_secs(300), || {
        let live = api.live_executors();
        most = most.max(live.len());
        seen.extend(live);
        let (a, b) = (state(&api, &ring).0, state(&api, &ps).0);
        assert!(
            a != "failed" && b != "failed",
            "a job failed: {:?} {:?}\n{}",
            state(&api, &ring),
            state(&api, &ps),
            p.server.output()
        );
        (a == "succeeded" && b == "succeeded").then_some(())
    });
    assert!(
        done.is_some(),
        "jobs did not succeed: {:?} {:?}; provisioner: {}\n{}",
        state(&api, &ring),
        state(&api, &ps),
        api.get("/v1/provisioner"),
        p.server.output()
    );
    assert!(most <= 4, "{most} executors at once, limit 4");
    assert!(
        !seen.is_empty() && seen.iter().all(|n| n.starts_with("local-")),
        "only provisioned executors ran: {seen:?}"
    );

    // After the idle timeout the fleet drains back to zero.
    let zero = eventually(Duration::from_secs(90), || {
        api.live_executors().is_empty().then_some(())
    });
    assert!(
        zero.is_some(),
        "executors still live: {:?}; provisioner: {}",
        api.live_executors(),
        api.get("/v1/provisioner")
    );
    let stopped = eventually(Duration::from_secs(30), || {
        let s = api.get("/v1/provisioner");
        let all = s["executors"].as_array().cloned().unwrap_or_default();
        all.iter().all(|e| e["state"] == "stopped").then_some(all)
    })
    .unwrap_or_else(|| panic!("not all stopped: {}", api.get("/v1/provisioner")));
    for e in &stopped {
        assert!(!pid_alive(e["pid"].as_i64().unwrap()), "{e} still runs");
    }

    // Every decision is an event: starts (for the jobs, within the limit),
    // releases after the idle timeout, and the exits they led to.
    let ev = events(&api);
    let starts = of_kind(&ev, "start");
    assert!(!starts.is_empty(), "{ev:?}");
    let mut started = BTreeSet::new();
    for s in &starts {
        assert!(s["data"]["managed"].as_u64().unwrap() <= 4, "{s}");
        for n in s["data"]["executors"].as_array().unwrap() {
            started.insert(n.as_str().unwrap().to_owned());
        }
    }
    assert_eq!(started.len(), stopped.len(), "{ev:?}");
    let released: BTreeSet<&str> = of_kind(&ev, "release")
        .iter()
        .map(|e| e["executor"].as_str().unwrap())
        .collect();
    assert_eq!(
        released.len(),
        started.len(),
        "every executor released: {ev:?}"
    );
    assert!(of_kind(&ev, "release")
        .iter()
        .all(|e| e["reason"].as_str().unwrap().contains("idle timeout 3s")));
    assert_eq!(of_kind(&ev, "stopped").len(), started.len(), "{ev:?}");
    for job in [&ring, &ps] {
        let told = provisioning(&api, job);
        assert!(
            told.iter()
                .any(|p| matches!(p, Provisioning::Starting { executors, needed }
                if !executors.is_empty() && *needed > 0)),
            "job {job} has no provisioning event: {told:?}"
        );
    }

    // The CLI shows the same.
    let cli = std::process::Command::new(binary("trainyard").unwrap())
        .args(["provisioner", "--api", &api.base, "--limit", "1000"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&cli.stdout);
    assert!(cli.status.success(), "{out}");
    assert!(
        out.starts_with("provisioner: local (max 4 executor(s)"),
        "{out}"
    );
    assert!(
        out.contains(" start ") && out.contains(" release ") && out.contains(" stopped "),
        "{out}"
    );

    // A clean shutdown with nothing running leaves nothing behind.
    p.server.terminate().unwrap();
    assert_eq!(
        p.server.wait_exit(Duration::from_secs(30)).unwrap(),
        Some(0)
    );
}

#[test]
fn a_job_over_the_budget_waits_and_hand_started_executors_are_never_stopped() {
    let mut p = platform(
        10,
        &[
            START_TIMEOUT,
            ("TRAINYARD_PROVISION_MAX_EXECUTORS", "1"),
            ("TRAINYARD_PROVISION_MAX_PER_JOB", "1"),
            ("TRAINYARD_PROVISION_EXECUTOR_CPUS", "1"),
            ("TRAINYARD_PROVISION_IDLE_TIMEOUT_SECS", "2"),
        ],
    );
    let api = p.client.clone();
    let mut hand = p.executor_with("hand-1", 1024, &[]);
    eventually(Duration::from_secs(60), || {
        (api.live_executors() == ["hand-1"]).then_some(())
    })
    .unwrap_or_else(|| panic!("hand-1 did not register:\n{}", hand.output()));

    // Four ring ranks: one hand-started executor and at most one new one
    // cannot hold them. The job stays queued and says why.
    let big = api.submit(&digits("prov-big", "allreduce", 4, 0, 100));
    let (st, why) = eventually(Duration::from_secs(30), || {
        let s = state(&api, &big);
        s.1.contains("provisioner cannot supply").then_some(s)
    })
    .unwrap_or_else(|| panic!("no reason: {:?}", state(&api, &big)));
    assert_eq!(st, "queued");
    assert!(why.contains("max_executors 1"), "{why}");
    eprintln!("the job over the budget: {st}: {why}");
    let blocked = events(&api);
    assert!(
        of_kind(&blocked, "blocked")
            .iter()
            .any(|e| e["job_id"] == big.as_str()),
        "{blocked:?}"
    );
    assert!(provisioning(&api, &big).contains(&Provisioning::Blocked));

    // Two ranks fit: the hand-started executor plus one provisioned.
    let small = api.submit(&digits("prov-small", "allreduce", 2, 0, 60));
    let done = eventually(Duration::from_secs(180), || {
        let s = state(&api, &small).0;
        assert_ne!(s, "failed", "{:?}", state(&api, &small));
        (s == "succeeded").then_some(())
    });
    assert!(
        done.is_some(),
        "{:?}; provisioner: {}\n{}",
        state(&api, &small),
        api.get("/v1/provisioner"),
        p.server.output()
    );
    let ev = events(&api);
    let starts = of_kind(&ev, "start");
    assert_eq!(starts.len(), 1, "one start for the small job: {ev:?}");
    assert_eq!(starts[0]["data"]["executors"].as_array().unwrap().len(), 1);
    assert!(starts
        .iter()
        .all(|s| !s["data"]["jobs"].as_array().unwrap().contains(&json!(big))));

    // The provisioned executor goes after its idle timeout; hand-1 stays,
    // idle as long as it likes.
    eventually(Duration::from_secs(60), || {
        (api.live_executors() == ["hand-1"]).then_some(())
    })
    .unwrap_or_else(|| panic!("live: {:?}", api.live_executors()));
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        assert_eq!(api.live_executors(), ["hand-1"]);
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(hand.running(), "hand-1 was stopped:\n{}", hand.output());
    let ev = events(&api);
    assert!(
        ev.iter().all(|e| e["executor"] != "hand-1"),
        "no decision about hand-1: {ev:?}"
    );
    assert_eq!(state(&api, &big).0, "queued");
    let (code, _) = api.post(&format!("/v1/jobs/{big}/cancel"), &json!({}));
    assert_eq!(code, 200);

    // Shutting the server down releases only what it started: hand-1 runs
    // on (retrying its heartbeats until an API answers again).
    p.server.terminate().unwrap();
    assert_eq!(
        p.server.wait_exit(Duration::from_secs(60)).unwrap(),
        Some(0)
    );
    assert!(hand.running(), "hand-1 was stopped:\n{}", hand.output());
}

#[test]
fn a_restarted_api_adopts_the_executors_its_crashed_predecessor_started() {
    let mut p = platform(
        25,
        &[
            ("TRAINYARD_PROVISION_EXECUTOR_CPUS", "1"),
            ("TRAINYARD_PROVISION_MAX_EXECUTORS", "2"),
            ("TRAINYARD_PROVISION_IDLE_TIMEOUT_SECS", "2"),
            // Slow steps keep the job running through the crash.
            ("TRAINYARD_SLOW_WORKER", "*:50"),
        ],
    );
    let api = p.client.clone();
    let job = api.submit(&digits("prov-adopt", "allreduce", 2, 0, 100_000));
    eventually(Duration::from_secs(120), || {
        (state(&api, &job).0 == "running").then_some(())
    })
    .unwrap_or_else(|| panic!("{:?}\n{}", state(&api, &job), p.server.output()));
    let before: BTreeSet<String> = api.live_executors().into_iter().collect();
    assert_eq!(before.len(), 2, "{before:?}");

    // The API dies without releasing anything; its executors train on.
    p.crash_api(Duration::ZERO);
    let adopted = eventually(Duration::from_secs(30), || {
        let ev = events(&api);
        let names: BTreeSet<String> = of_kind(&ev, "adopted")
            .iter()
            .filter_map(|e| e["executor"].as_str().map(str::to_owned))
            .collect();
        (names.len() == 2).then_some(names)
    })
    .unwrap_or_else(|| {
        panic!(
            "no adoption: {}\n{}",
            api.get("/v1/provisioner"),
            p.server.output()
        )
    });
    assert_eq!(adopted, before);
    // Nothing new was started for the job: it kept its executors.
    assert_eq!(of_kind(&events(&api), "start").len(), 1);
    assert_eq!(state(&api, &job).0, "running");

    // Adopted executors are released like any other once idle.
    let (code, _) = api.post(&format!("/v1/jobs/{job}/cancel"), &json!({}));
    assert_eq!(code, 200);
    eventually(Duration::from_secs(60), || {
        let s = api.get("/v1/provisioner");
        s["executors"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["state"] == "stopped")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("{}", api.get("/v1/provisioner")));
    assert!(api.live_executors().is_empty());
    p.server.terminate().unwrap();
    assert_eq!(
        p.server.wait_exit(Duration::from_secs(30)).unwrap(),
        Some(0)
    );
}
