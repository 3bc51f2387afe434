//! The Slurm provisioner against a real Slurm: the private controller and
//! two nodes `scripts/test` starts (`scripts/slurm.sh`, `SLURM_CONF`). An
//! API with `--provisioner slurm` and no executor gets them as Slurm batch
//! jobs for a ring job and a PS job, both succeed; an executor whose Slurm
//! job is signalled (`scancel --signal=USR1`, Slurm's time-limit warning)
//! drains with a checkpoint and its job goes on; a node set down loses its
//! executor and the job recovers on the other node; a restarted API adopts
//! the Slurm jobs its crashed predecessor submitted, and a requeued one
//! registers again while its job runs on; afterwards the fleet
//! goes back to zero and no Slurm job of this server is left.
//!
//! One test, in stages: the stages share the two nodes (setting one down
//! would disturb a concurrent test).

use serde_json::Value;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;
use trainyard_common::EventKind;
use trainyard_e2e::{eventually, ApiClient, Consistency, MlpSpec, Platform};

/// One `squeue` row of this test's jobs: id, state, name, node.
type Row = (u32, String, String, String);

/// Every job (finished ones too) whose comment is `comment`.
fn ours(comment: &str) -> Vec<Row> {
    let out = Command::new("squeue")
        .args(["--noheader", "--states=all", "--format=%i|%T|%j|%N|%k"])
        .output()
        .expect("squeue runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.splitn(5, '|').collect();
            (f.len() == 5 && f[4] == comment).then(|| {
                (
                    f[0].parse().unwrap_or(0),
                    f[1].to_owned(),
                    f[2].to_owned(),
                    f[3].to_owned(),
                )
            })
        })
        .collect()
}

fn unfinished(rows: &[Row]) -> Vec<&Row> {
    const LIVE: [&str; 6] = [
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
    ];
    rows.iter()
        .filter(|r| LIVE.contains(&r.1.as_str()))
        .collect()
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().expect("runs");
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Cancels whatever this test left in Slurm and resumes its nodes, also
/// when it fails.
struct Cleanup {
    comment: String,
    nodes: Vec<String>,
    logs: std::path::PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for (id, ..) in unfinished(&ours(&self.comment)) {
            let _ = Command::new("scancel").arg(id.to_string()).status();
        }
        for n in &self.nodes {
            let _ = Command::new("scontrol")
                .args(["update", &format!("nodename={n}"), "state=resume"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.logs);
    }
}

fn digits(name: &str, workers: u32, ps: u32, steps: u64) -> Value {
    let mut spec = MlpSpec::digits(name)
        .adam(0.005)
        .batch_size(32)
        .steps(steps)
        .no_eval()
        .workers(workers, workers)
        .memory_mb(256)
        .seed(7);
    if ps > 0 {
        spec = spec.ps(ps).consistency(Consistency::Sync);
    }
    spec.build()
}

fn wait_succeeded(p: &Platform, ids: &[&str], limit: Duration, stage: &str) {
    let done = eventually(limit, || {
        let states: Vec<String> = ids.iter().map(|id| p.state(id)).collect();
        assert!(
            states.iter().all(|s| s != "failed" && s != "cancelled"),
            "{stage}: {states:?}\nprovisioner: {}\n{}",
            p.get("/v1/provisioner?limit=1000"),
            p.server.output()
        );
        states.iter().all(|s| s == "succeeded").then_some(())
    });
    assert!(
        done.is_some(),
        "{stage}: not succeeded: {:?}\nprovisioner: {}\nslurm: {:?}\n{}",
        ids.iter().map(|id| p.state(id)).collect::<Vec<_>>(),
        p.get("/v1/provisioner?limit=1000"),
        ours_any(),
        p.server.output()
    );
}

fn ours_any() -> String {
    let out = Command::new("squeue")
        .args(["--noheader", "--states=all", "--format=%i|%T|%j|%N|%r|%k"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    out.unwrap_or_default()
}

/// The Slurm job id and name of one executor of job `id`.
fn an_executor_of(api: &ApiClient, id: &str) -> (u32, String) {
    let a = api.assignments(id);
    let names: BTreeSet<String> = a.workers.iter().map(|w| w.executor.name.clone()).collect();
    let prov = api.get("/v1/provisioner?limit=1");
    let row = prov["executors"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["state"] == "running" && names.contains(e["name"].as_str().unwrap_or_default()))
        .unwrap_or_else(|| panic!("no provisioned executor of {id} among {names:?}: {prov}"));
    (
        u32::try_from(row["pid"].as_i64().expect("a Slurm job id")).unwrap(),
        row["name"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn slurm_jobs_carry_ring_and_ps_jobs_through_signals_and_a_lost_node() {
    assert!(
        std::env::var_os("SLURM_CONF").is_some() && std::env::var_os("TRAINYARD_TEST_SLURM").is_some(),
        "SLURM_CONF is not set: run ./scripts/test, which starts a private Slurm cluster for these tests"
    );
    let comment = format!("trainyard-e2e-{}", std::process::id());
    let nodes: Vec<String> = std::env::var("TRAINYARD_TEST_SLURM_NODES")
        .unwrap_or_else(|_| "ty-n1,ty-n2".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    let logs = std::env::temp_dir().join(format!("trainyard-slurm-e2e-{}", std::process::id()));
    let _cleanup = Cleanup {
        comment: comment.clone(),
        nodes: nodes.clone(),
        logs: logs.clone(),
    };
    let log_of =
        |name: &str| std::fs::read_to_string(logs.join(format!("{name}.log"))).unwrap_or_default();
    let mut p = Platform::builder("slurm")
        .env("TRAINYARD_SLURM_DIR", logs.to_str().unwrap())
        .heartbeat_misses(10)
        .env("TRAINYARD_PROVISIONER", "slurm")
        .env("TRAINYARD_SLURM_COMMENT", &comment)
        .env("TRAINYARD_SLURM_PARTITION", "trainyard")
        .env("TRAINYARD_SLURM_TIME_LIMIT", "30")
        .env("TRAINYARD_SLURM_DATA_LISTEN", "127.0.0.1:0")
        .env("TRAINYARD_SLURM_EXPORT", "TRAINYARD_SLOW_WORKER")
        .env("TRAINYARD_SLOW_WORKER", "*:10")
        .env("TRAINYARD_PROVISION_MAX_EXECUTORS", "4")
        .env("TRAINYARD_PROVISION_EXECUTOR_CPUS", "1")
        .env("TRAINYARD_PROVISION_EXECUTOR_MEMORY_MB", "1024")
        .env("TRAINYARD_PROVISION_IDLE_TIMEOUT_SECS", "3")
        .env("TRAINYARD_PROVISION_START_TIMEOUT_SECS", "90")
        .start();
    let status = p.get("/v1/provisioner");
    assert_eq!(status["settings"]["kind"], "slurm", "{status}");
    assert!(p.live_executors().is_empty());

    // 1. A ring job and a PS job, from zero executors.
    let ring = p.submit(&digits("slurm-ring", 2, 0, 120));
    let ps = p.submit(&digits("slurm-ps", 2, 1, 120));
    wait_succeeded(&p, &[&ring, &ps], Duration::from_secs(150), "ring and PS");
    let rows = ours(&comment);
    assert!(!rows.is_empty(), "no Slurm job carries {comment}");
    let prov = p.get("/v1/provisioner?limit=1000");
    for e in prov["executors"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        let id = e["pid"].as_i64().unwrap();
        assert!(name.starts_with("slurm-"), "{e}");
        assert!(
            rows.iter().any(|r| i64::from(r.0) == id && r.2 == name),
            "{name} is not Slurm job {id}: {rows:?}"
        );
    }
    for job in [&ring, &ps] {
        assert!(
            p.events(job)
                .iter()
                .any(|e| e.kind == EventKind::Provisioning && e.reason.contains("starting")),
            "{job}: no provisioning event"
        );
    }
    // The start decisions name each executor's Slurm job.
    let started: Vec<String> = prov["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "start")
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        !started.is_empty() && started.iter().all(|r| r.contains("(Slurm job ")),
        "start events without their Slurm job ids: {started:?}"
    );
    for job in [&ring, &ps] {
        assert!(
            p.events(job)
                .iter()
                .any(|e| e.kind == EventKind::Provisioning && e.reason.contains("(Slurm job ")),
            "{job}: its provisioning event names no Slurm job"
        );
    }

    // 2. Slurm's time-limit warning (SIGUSR1) on one executor of a running
    //    ring job: it drains with a checkpoint and the job goes on.
    // No periodic checkpoints: only the drain writes one.
    let mut spec = digits("slurm-signal", 2, 0, 700);
    spec["checkpoint"] = serde_json::json!({"at_end": false});
    let long = p.submit(&spec);
    p.wait_steps(&long, 60, Duration::from_secs(120));
    let (slurm_id, name) = an_executor_of(&p, &long);
    run(
        "scancel",
        &["--full", "--signal=USR1", &slurm_id.to_string()],
    );
    let saved = eventually(Duration::from_secs(60), || {
        p.checkpoint_steps(&long).first().copied()
    })
    .unwrap_or_else(|| {
        panic!(
            "no checkpoint after SIGUSR1 to {name} (Slurm job {slurm_id}): {:?}\n{}",
            p.log_messages(&long),
            log_of(&name)
        )
    });
    wait_succeeded(&p, &[&long], Duration::from_secs(150), "after SIGUSR1");
    let drained = log_of(&name);
    assert!(
        drained.contains("SIGUSR1") && drained.contains("draining"),
        "{name} drained on SIGUSR1: {drained}"
    );
    assert!(saved >= 60, "the drain's checkpoint is of step {saved}");
    let gone = ours(&comment);
    assert!(
        gone.iter().any(|r| r.0 == slurm_id && r.1 == "COMPLETED"),
        "the drained executor's Slurm job ended cleanly: {gone:?}"
    );

    // 3. A node goes down under a running job: its executor is lost, the
    //    job recovers on executors of the other node.
    let third = p.submit(&digits("slurm-node-down", 2, 0, 700));
    p.wait_steps(&third, 60, Duration::from_secs(120));
    let (victim, _) = an_executor_of(&p, &third);
    let node = ours(&comment)
        .into_iter()
        .find(|r| r.0 == victim)
        .map(|r| r.3)
        .expect("the victim's node");
    assert!(nodes.contains(&node), "{node} not in {nodes:?}");
    run(
        "scontrol",
        &[
            "update",
            &format!("nodename={node}"),
            "state=down",
            "reason=trainyard-e2e",
        ],
    );
    wait_succeeded(
        &p,
        &[&third],
        Duration::from_secs(180),
        "after a node went down",
    );
    let after: Vec<Row> = ours(&comment);
    assert!(
        after
            .iter()
            .any(|r| r.0 == victim && !unfinished(&after).contains(&r)),
        "Slurm job {victim} on the down node ended: {after:?}"
    );
    eprintln!(
        "after node {node} went down: {:?}",
        p.events(&third)
            .iter()
            .map(|e| format!("{}: {}", e.kind, e.reason))
            .collect::<Vec<_>>()
    );
    // ReturnToService=2 may have taken it back already when its slurmd
    // registered again; resuming an idle node is refused, which is fine.
    let _ = Command::new("scontrol")
        .args(["update", &format!("nodename={node}"), "state=resume"])
        .output();

    // 4. The API dies without releasing anything: the restarted one
    //    adopts the Slurm jobs still running, by name and comment.
    let kept = p.submit(&digits("slurm-adopt", 2, 0, 100_000));
    p.wait_steps(&kept, 20, Duration::from_secs(120));
    let before: BTreeSet<String> = p.live_executors().into_iter().collect();
    p.crash_api(Duration::ZERO);
    let adopted = eventually(Duration::from_secs(30), || {
        let ev = p.get("/v1/provisioner?limit=1000")["events"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let names: BTreeSet<String> = ev
            .iter()
            .filter(|e| e["kind"] == "adopted")
            .filter_map(|e| e["executor"].as_str().map(str::to_owned))
            .collect();
        names.is_superset(&before).then_some(names)
    })
    .unwrap_or_else(|| {
        panic!(
            "no adoption of {before:?}: {}\n{}",
            p.get("/v1/provisioner?limit=1000"),
            p.server.output()
        )
    });
    // Its executors may have missed heartbeats while no API answered: the
    // job is placed again on the same (adopted) executors.
    eventually(Duration::from_secs(30), || {
        (p.state(&kept) == "running").then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{}: {adopted:?} of {before:?}\n{}",
            p.state(&kept),
            p.get("/v1/provisioner?limit=1000")
        )
    });
    let names: BTreeSet<String> = p
        .assignments(&kept)
        .workers
        .iter()
        .map(|w| w.executor.name.clone())
        .collect();
    assert!(
        names.is_subset(&adopted),
        "{names:?} run the job, adopted {adopted:?}"
    );

    // 5. Slurm requeues one of them (its job marked requeueable first: the
    //    test cluster's default is not): the executor drains, the same
    //    Slurm job runs again, and its executor registers again under the
    //    same name as a new executor while the job runs on.
    let (requeued, name) = an_executor_of(&p, &kept);
    let id_of = |name: &str| {
        p.executors(Some("live"))
            .executors
            .into_iter()
            .find(|e| e.name == name)
            .map(|e| e.id)
    };
    let first_id = id_of(&name).expect("live before the requeue");
    let job = format!("jobid={requeued}");
    run("scontrol", &["update", &job, "requeue=1"]);
    run("scontrol", &["requeue", &requeued.to_string()]);
    // A requeued job waits a while (`BeginTime`) before it may start
    // again; not here.
    eventually(Duration::from_secs(30), || {
        let out = Command::new("squeue")
            .args([
                "--noheader",
                "--format=%T|%r",
                &format!("--jobs={requeued}"),
            ])
            .output()
            .ok()?;
        (String::from_utf8_lossy(&out.stdout).trim() == "PENDING|BeginTime").then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "Slurm job {requeued} was not requeued: {:?}",
            ours(&comment)
        )
    });
    run("scontrol", &["update", &job, "starttime=now"]);
    // The same Slurm job's executor registers again, under the same name,
    // as a new executor, and the job runs again. Usually on it; on a
    // loaded machine the job may have been placed on another executor
    // first (it is then released as idle), so any state counts.
    let again = |p: &Platform| {
        p.executors(None)
            .executors
            .into_iter()
            .find(|e| e.name == name && e.id != first_id)
            .map(|e| e.id)
    };
    eventually(Duration::from_secs(150), || {
        let id = again(&p)?;
        (p.state(&kept) == "running").then_some(id)
    })
    .unwrap_or_else(|| {
        panic!(
            "{name} (Slurm job {requeued}) did not come back: {} {:?}\n{}\n{}",
            p.state(&kept),
            ours(&comment),
            p.get("/v1/provisioner?limit=1000"),
            log_of(&name)
        )
    });
    let (code, _) = p.post(&format!("/v1/jobs/{kept}/cancel"), &serde_json::json!({}));
    assert_eq!(code, 200);

    // 6. Scale to zero: every executor is released, and no Slurm job of
    //    this server is left.
    eventually(Duration::from_secs(60), || {
        let rows = ours(&comment);
        (p.live_executors().is_empty() && unfinished(&rows).is_empty()).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "left: {:?} / {:?}\n{}",
            p.live_executors(),
            ours(&comment),
            p.get("/v1/provisioner?limit=1000")
        )
    });
    let ev = p.get("/v1/provisioner?limit=1000")["events"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let kinds: BTreeSet<&str> = ev.iter().filter_map(|e| e["kind"].as_str()).collect();
    for k in ["start", "release", "stopped"] {
        assert!(kinds.contains(k), "no {k} event: {ev:?}");
    }
    assert!(
        ev.iter().any(|e| e["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("Slurm job {slurm_id}")))),
        "the drained Slurm job is named in an event: {ev:?}"
    );
    p.server.terminate().unwrap();
    assert_eq!(
        p.server.wait_exit(Duration::from_secs(60)).unwrap(),
        Some(0)
    );
}
