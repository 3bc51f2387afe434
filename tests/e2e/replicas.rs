//! Replicated parameter-server shards (`replicas: 1`): a sync-mode PS job
//! (one shard, and two shards) whose shard primary's executor is SIGKILLed
//! mid-training continues on the shard's standby, which the scheduler
//! promotes, and ends with the very weights of the same job run without
//! faults — no update was lost, and with two shards the one that survived
//! never runs a version ahead of the promoted one for good.
//!
//! The executors declare two RAM sizes so that placement is determined by
//! the planner's rules, not by tie-breaking: workers go best-fit (the small
//! executors), shards where the most RAM is (the big ones). The test still
//! picks as its victim an executor that holds a shard primary and no worker
//! (the data split must not change), and says so if none does. In the
//! two-shard case shard 1 pauses before replicating each update (the
//! `TRAINYARD_SLOW_STANDBY` test hook), so that the kill of its primary
//! most likely lands while shard 0 is a version ahead.

use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use trainyard_common::{EventKind, JobState};
use trainyard_e2e::{eventually, kill9, safetensors_f32, Consistency, MlpSpec, Platform, Proc};

/// An API that declares an executor lost after 40 silent 200 ms beats
/// (8 s: a busy CI machine must not make a live worker look lost, which
/// would change the data split), whose executors' workers sleep 60 ms after
/// each step, so that a kill after the first steps lands mid-training.
fn platform() -> Platform {
    Platform::builder("replicas")
        .heartbeat_misses(40)
        .executor_env("TRAINYARD_SLOW_WORKER", "*:60")
        .start()
}

/// The final weights of a succeeded job, tensor by tensor, as raw bits.
fn weights(p: &Platform, id: &str) -> BTreeMap<String, Vec<u32>> {
    safetensors_f32(&p.weights_url(id))
        .into_iter()
        .map(|(k, v)| (k, v.into_iter().map(f32::to_bits).collect()))
        .collect()
}

/// How long a job may take here.
const JOB_LIMIT: Duration = Duration::from_secs(240);

/// Sync PS with Adam (optimizer state and step count travel to the
/// standby too), two workers, `shards` shards with one standby each.
fn replicated_digits(name: &str, shards: u32, steps: u64) -> Value {
    MlpSpec::digits(name)
        .batch_size(32)
        .steps(steps)
        .ps(shards)
        .replicas(1)
        .consistency(Consistency::Sync)
        .workers(2, 2)
        .seed(7)
        .build()
}

/// The word after `marker` in `line`.
fn after<'a>(line: &'a str, marker: &str) -> &'a str {
    line.split(marker)
        .nth(1)
        .and_then(|rest| rest.split([' ', ',']).next())
        .unwrap_or_else(|| panic!("{marker:?} in {line:?}"))
}

/// Where the roles of job `id` are, by executor name.
struct Roles {
    /// Per shard: (primary, standby).
    shards: Vec<(String, String)>,
    workers: Vec<String>,
}

fn roles(p: &Platform, id: &str, shards: usize) -> Option<Roles> {
    let a = p.get(&format!("/v1/jobs/{id}/assignments"));
    let list = a["parameter_servers"].as_array()?;
    let mut out = Vec::new();
    for i in 0..shards {
        let shard = list
            .iter()
            .find(|s| s["shard"].as_u64() == Some(i as u64))?;
        let primary = shard["executor"]["name"].as_str()?.to_owned();
        let standby = shard["standby"]["name"].as_str()?.to_owned();
        out.push((primary, standby));
    }
    let workers = a["workers"]
        .as_array()?
        .iter()
        .filter_map(|w| w["executor"]["name"].as_str().map(str::to_owned))
        .collect();
    Some(Roles {
        shards: out,
        workers,
    })
}

/// One at a time: each test runs four executors on a small machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_killed_ps_primary_is_replaced_by_its_standby_and_the_weights_equal_a_fault_free_run() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    kill_a_primary(1, 200, &[]);
}

#[test]
fn with_two_shards_a_killed_primary_leaves_no_shard_a_version_ahead() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Shard 1 pauses 500 ms before it replicates each update: for most of
    // each step shard 0 has published a version shard 1's standby does not
    // have yet, and the victim is shard 1's primary.
    kill_a_primary(2, 60, &[("TRAINYARD_SLOW_STANDBY", "1:500")]);
}

/// Trains the job fault-free, then again killing the executor of a shard
/// primary (the last shard's where it shares no executor with a worker)
/// after 10 steps, and compares the final weights bit for bit.
fn kill_a_primary(shards: u32, steps: u64, env: &[(&str, &str)]) {
    let p = platform();
    // Two small executors (the workers, best fit) and two big ones (the
    // shards, where the most RAM is; their standbys avoid them).
    let mut execs: Vec<(String, Proc)> = (0..4)
        .map(|i| {
            let name = format!("rep-{i}");
            let proc_ = p.executor_with(&name, if i < 2 { 1536 } else { 4096 }, env);
            (name, proc_)
        })
        .collect();

    // Every executor is in before the first plan, so each job is placed
    // alike.
    eventually(Duration::from_secs(60), || {
        (p.live_executors().len() == execs.len()).then_some(())
    })
    .expect("four live executors");

    // Fault-free, in one generation (else a false loss changed the split
    // and the comparison below would fail for that reason).
    let clean = p.submit(&replicated_digits("replicas-clean", shards, steps));
    let job = p.wait_end(&clean, JOB_LIMIT);
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{job:?} {:?}",
        p.log_messages(&clean)
    );
    let clean_placements = p
        .events(&clean)
        .into_iter()
        .filter(|e| e.kind == EventKind::Placement)
        .count();
    assert_eq!(
        clean_placements,
        1,
        "the fault-free run changed membership: {:?}",
        p.events(&clean)
    );

    // The same job; a primary's executor dies after the first steps.
    let faulty = p.submit(&replicated_digits("replicas-killed", shards, steps));
    let r = eventually(Duration::from_secs(60), || {
        (p.steps_recorded(&faulty) >= 10)
            .then(|| roles(&p, &faulty, shards as usize))
            .flatten()
    })
    .unwrap_or_else(|| {
        panic!(
            "the job trains with standbys: {:?}",
            p.log_messages(&faulty)
        )
    });
    for (primary, standby) in &r.shards {
        assert_ne!(primary, standby, "a standby on its shard's executor");
    }
    // Only shards die: the workers (and so the data split) stay.
    let (victim_shard, (primary, standby)) = r
        .shards
        .iter()
        .enumerate()
        .rev()
        .find(|(_, (primary, _))| !r.workers.contains(primary))
        .map(|(i, ps)| (i, ps.clone()))
        .unwrap_or_else(|| {
            panic!(
                "every shard primary shares its executor with a worker: shards {:?}, workers {:?}",
                r.shards, r.workers
            )
        });
    let generation = p.job(&faulty).generation;
    // Rank 0 reported this many steps: it pulled version `seen - 1`, so
    // that version was published, so the standby has it.
    let seen = u64::try_from(p.metrics(&faulty, Some(1)).steps_recorded).unwrap();
    let at = execs.iter().position(|(n, _)| *n == primary).unwrap();
    let (_, victim) = execs.remove(at);
    kill9(victim.pid());
    let job = p.wait_end(&faulty, JOB_LIMIT);
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{job:?} {:?}",
        p.log_messages(&faulty)
    );

    // The scheduler promoted the standby and said so.
    let promoted = p
        .events(&faulty)
        .into_iter()
        .filter(|e| e.kind == EventKind::Placement)
        .map(|e| e.reason)
        .find(|r| r.contains("standby on") && r.contains("promoted"))
        .unwrap_or_else(|| {
            panic!(
                "a placement event for the promotion: {:?}",
                p.events(&faulty)
            )
        });
    println!("promotion (after generation {generation}): {promoted}");
    assert!(
        promoted.contains(&format!(
            "PS shard {victim_shard} primary on {primary} (lost)"
        )) && promoted.contains(&format!("standby on {standby} promoted")),
        "{promoted}"
    );
    // The shard was not restored from a checkpoint or a worker's pull: the
    // promoted standby served on from a version workers had seen.
    let lines = p.log_messages(&faulty);
    assert!(
        !lines.iter().any(|l| l.contains("restored from")),
        "{lines:?}"
    );
    let resumed_at: u64 = lines
        .iter()
        .filter(|l| l.starts_with(&format!("PS shard {victim_shard} serves")))
        .find(|l| {
            let g: i64 = after(l, "(generation ")
                .trim_end_matches(')')
                .parse()
                .unwrap();
            g > generation
        })
        .map(|l| after(l, " at version ").parse().unwrap())
        .unwrap_or_else(|| panic!("the promoted shard's first line: {lines:?}"));
    println!("rank 0 had reported {seen} steps at the kill; the promoted shard {victim_shard} served from version {resumed_at}");
    assert!(
        resumed_at + 1 >= seen,
        "the promoted shard started at version {resumed_at}, behind what workers had seen ({seen} steps)"
    );
    // Whether a surviving shard had completed a version the promoted one
    // had not (timing decides; either way the weights must match).
    let caught_up = lines
        .iter()
        .filter(|l| l.contains("this worker's gradient of version"))
        .count();
    println!("workers that pushed a step again to a shard left behind: {caught_up}");
    // The kill landed mid-training, and training went on after it on the
    // promoted shard.
    assert!(
        resumed_at < steps,
        "the kill landed after the last step ({resumed_at} of {steps})"
    );
    let finished: u64 = lines
        .iter()
        .filter(|l| l.starts_with("worker 0 done at step "))
        .map(|l| {
            after(l, "done at step ")
                .trim_end_matches(';')
                .parse()
                .unwrap()
        })
        .max()
        .unwrap_or_else(|| panic!("rank 0's last line: {lines:?}"));
    assert_eq!(finished, steps, "{lines:?}");

    let (a, b) = (weights(&p, &clean), weights(&p, &faulty));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let differing: Vec<&String> = a.keys().filter(|k| a[*k] != b[*k]).collect();
    let values: usize = a.values().map(Vec::len).sum();
    println!("final weights: {values} values, tensors that differ: {differing:?}");
    assert!(
        differing.is_empty(),
        "the final weights differ from the fault-free run's in {differing:?}"
    );
}
