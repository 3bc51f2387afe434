//! Bounded shutdown: an executor told to stop while the API is unreachable
//! drains within its grace period — its ranks stop with a checkpoint whose
//! shards reach the object store — and exits, saying what the API did not
//! receive; a second signal during a drain exits at once.

use std::time::{Duration, Instant};
use trainyard_e2e::{eventually, MlpSpec, Platform};

/// Shard objects of job `id` in the platform's file store.
fn shard_objects(p: &Platform, id: &str) -> Vec<String> {
    let mut out = Vec::new();
    let root = p.data.join("objects").join(id);
    for step in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(step.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.starts_with("shard-") {
                out.push(format!("{}/{name}", step.file_name().to_string_lossy()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_drain_while_the_api_is_down_ends_within_the_grace_period_and_a_second_signal_at_once() {
    // Executors are lost only after 100 silent heartbeats: the API's
    // absence, not the scheduler, is what this test is about.
    let mut p = Platform::builder("shutdown").heartbeat_misses(100).start();
    let slow = ("TRAINYARD_SLOW_WORKER", "*:10");
    let mut short = p.executor_with(
        "grace-short",
        2048,
        &[slow, ("TRAINYARD_SHUTDOWN_GRACE_SECS", "5")],
    );
    let mut long = p.executor_with(
        "grace-long",
        2048,
        &[slow, ("TRAINYARD_SHUTDOWN_GRACE_SECS", "3600")],
    );
    // No periodic checkpoint: only the drain writes one.
    let mut spec = MlpSpec::digits("grace")
        .steps(100_000)
        .workers(2, 2)
        .seed(3)
        .build();
    spec["checkpoint"] = serde_json::json!({"at_end": false});
    let id = p.submit(&spec);
    eventually(Duration::from_secs(120), || {
        (p.steps_recorded(&id) >= 20).then_some(())
    })
    .expect("the job trains");
    assert!(shard_objects(&p, &id).is_empty());

    p.stop_api();
    // One SIGTERM, a 5 s grace period, no API: the executor still exits
    // (before, it retried its reports without end). The bound below only
    // tells an exit from a hang.
    let started = Instant::now();
    short.terminate().unwrap();
    let code = short
        .wait_exit(Duration::from_secs(60))
        .expect("the executor exits after its grace period");
    let took = started.elapsed();
    let out = short.output();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        took >= Duration::from_secs(4),
        "it waited for the API first ({took:?}): {out}"
    );
    assert!(
        out.contains("the grace period ended with reports the API has not received"),
        "{out}"
    );
    // Its rank stopped with a checkpoint: the shards are in the store,
    // though the API could not commit them.
    let shards = shard_objects(&p, &id);
    assert!(!shards.is_empty(), "no shard uploaded: {out}");

    // An hour's grace: the first signal starts a drain that would wait for
    // the API all that time; the second ends it at once.
    long.terminate().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(long.running(), "{}", long.output());
    long.terminate().unwrap();
    let code = long
        .wait_exit(Duration::from_secs(20))
        .expect("a second signal exits at once");
    let out = long.output();
    assert_eq!(code, Some(130), "{out}");
    assert!(out.contains("a second signal during the drain"), "{out}");

    // The API comes back: the job is still there and waits for executors.
    p.start_api();
    let job = p.job(&id);
    assert!(!job.state.is_terminal(), "{job:?}");
}
