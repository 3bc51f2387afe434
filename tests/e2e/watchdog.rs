//! Live roles that make no progress, with the real binaries.
//!
//! * **A stalled disk.** A ring of three trains on six local npz shards
//!   (a manifest gives their sample counts). Mid-training one shard file is
//!   swapped for a FIFO that nobody writes: the rank whose lane reads it
//!   blocks in `open(2)` — a real kernel stall, its process and heartbeat
//!   alive — while its peers wait on it in the all-reduce. The scheduler
//!   declares that rank (and only it) stuck once it has spent the spec's
//!   floor (3 s) waiting for data; the job leaves its executor (which
//!   stays live for other jobs: it is not declared lost) and the two
//!   others train on in a new generation. The test puts
//!   the real file back as soon as the event appears (and then lets the
//!   stalled reader go), so the next generation reads it; the job ends,
//!   judged by PyTorch on held-out rows it never saw.
//! * **A straggler.** A ring of three in which rank 2 sleeps 60 ms after
//!   each step (the executors' `TRAINYARD_SLOW_WORKER` hook): the metrics
//!   API marks rank 2, and no other, a straggler. With
//!   `watchdog.exclude_stragglers`, the next generation runs without it:
//!   a `straggler` event, the job leaves its executor (still live), the
//!   job ends on two.

use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use trainyard_common::{EventData, EventKind, JobState};
use trainyard_e2e::{eventually, ApiClient, Platform};
use uuid::Uuid;

const WRITE_SHARDS: &str = r#"
import json, sys, numpy as np
out, shards, held = sys.argv[1], int(sys.argv[2]), int(sys.argv[4])
d = np.load(sys.argv[3])
x, y = d["x"], d["y"]
train = 1500
parts = np.array_split(np.arange(train), shards)
entries = []
for i, idx in enumerate(parts):
    np.savez(f"{out}/part-{i}.npz", x=x[idx], y=y[idx])
    entries.append({"url": f"part-{i}.npz", "samples": int(len(idx))})
json.dump({"shards": entries}, open(f"{out}/train.json", "w"))
np.savez(f"{out}/eval.npz", x=x[train:train + held], y=y[train:train + held])
"#;

/// A folder with the first 1,500 digits as `count` training shards, a
/// manifest, and (at most) `held` of the rows after them as a held-out file.
fn shards(label: &str, count: usize, held: usize) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ty-watchdog-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-c", WRITE_SHARDS])
        .arg(&dir)
        .arg(count.to_string())
        .arg(trainyard_e2e::repo_root().join("data/digits.npz"))
        .arg(held.to_string())
        .output()
        .expect("running Python");
    assert!(
        out.status.success(),
        "writing the shards: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

fn spec(name: &str, dir: &Path, steps: u64, watchdog: serde_json::Value) -> serde_json::Value {
    json!({
        "name": name,
        "model": {"kind": "mlp", "inputs": 64, "hidden": [128], "outputs": 10},
        "dataset": {"kind": "file", "url": format!("file://{}/train.json", dir.display()),
                    "eval_url": format!("file://{}/eval.npz", dir.display()),
                    "shuffle_buffer": 128},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "lr": 0.003},
        "batch_size": 16, "steps": steps, "seed": 7,
        "strategy": "allreduce",
        "workers": {"min": 2, "max": 3},
        "watchdog": watchdog,
    })
}

fn executor_state(c: &ApiClient, id: Uuid) -> String {
    let listed = c.executors(None);
    let e = listed
        .executors
        .iter()
        .find(|e| e.id == id)
        .unwrap_or_else(|| panic!("executor {id} is listed"));
    serde_json::to_value(e.state)
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

/// The events of job `id` of `kind`.
fn events_of(c: &ApiClient, id: &str, kind: EventKind) -> Vec<trainyard_common::api::JobEvent> {
    c.events(id)
        .into_iter()
        .filter(|e| e.kind == kind)
        .collect()
}

/// PyTorch's accuracy of job `id`'s downloaded weights on the held-out file.
fn pytorch(c: &ApiClient, id: &str, spec: &serde_json::Value, dir: &Path) -> f64 {
    c.pytorch_accuracy(id, spec, &dir.join("eval.npz"), &dir.join("eval-out"))
}

/// The size of job `id`'s current ring when it has one without executor
/// `without`.
fn rings_without(c: &ApiClient, id: &str, without: Uuid) -> Option<usize> {
    let a = c.assignments(id);
    (!a.workers.is_empty() && a.workers.iter().all(|w| w.executor.id != without))
        .then_some(a.workers.len())
}

#[test]
fn a_rank_stalled_on_its_data_is_declared_stuck_and_its_job_leaves_the_executor() {
    // Ten shards of 150 samples (a lane of the ring of three holds three or
    // four) and a data budget that the shuffle window nearly fills: by the
    // loader's arithmetic (`executor::data`: 528 bytes a decoded row, two
    // windows, two of the largest unit, four batches ahead) the 16 MiB
    // leave room to cache two decoded shards, so every epoch opens its
    // lane's shards again. The held-out file is smaller than a shard.
    let dir = shards("stuck", 10, 140);
    let p = Platform::builder("watchdog-stuck")
        .executor_env("TRAINYARD_SLOW_WORKER", "*:10")
        .start();
    let _execs: Vec<_> = (0..3).map(|i| p.executor(&format!("wd-{i}"))).collect();
    let mut s = spec(
        "stalled-disk",
        &dir,
        800,
        json!({"stuck_floor_seconds": 3, "stuck_factor": 20}),
    );
    s["dataset"]["memory_mb"] = json!(16);
    s["dataset"]["shuffle_buffer"] = json!(15_690);
    let id = p.submit(&s);
    eventually(Duration::from_secs(120), || {
        (p.assignments(&id).workers.len() == 3).then_some(())
    })
    .expect("a ring of three forms");
    p.wait_steps(&id, 40, Duration::from_secs(120));

    // Shard 3 becomes a FIFO nobody writes (a second name keeps it, so
    // that the stalled reader can be let go afterwards).
    let shard = dir.join("part-3.npz");
    let (real, fifo, held) = (
        dir.join("part-3.real"),
        dir.join("part-3.fifo"),
        dir.join("part-3.held"),
    );
    std::fs::copy(&shard, &real).unwrap();
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo");
    std::fs::hard_link(&fifo, &held).unwrap();
    std::fs::rename(&fifo, &shard).unwrap();
    let swapped_at = std::time::Instant::now();

    // Once a rank has waited on its data for over a second (its
    // heartbeat says so), the real bytes go back under the name: the
    // stalled open(2) stays on the FIFO, and the next generation, which
    // resumes right there in the epoch, opens the real file.
    let stalled = eventually(Duration::from_secs(60), || {
        p.metrics(&id, Some(1))
            .ranks
            .into_iter()
            .find(|r| r.phase == "data" && r.phase_seconds >= 1.0)
    });
    std::fs::rename(&real, &shard).unwrap();
    let stalled = stalled.unwrap_or_else(|| {
        panic!(
            "no rank stalled within 60 s of the swap: {:?}",
            p.log_messages(&id)
        )
    });
    let stuck = eventually(Duration::from_secs(30), || {
        events_of(&p, &id, EventKind::Stuck).into_iter().next()
    })
    .unwrap_or_else(|| panic!("no stuck event: {:?}", p.events(&id)));
    println!(
        "{:.1} s after the swap: {}",
        swapped_at.elapsed().as_secs_f64(),
        stuck.reason
    );
    let d = &stuck.data;
    assert_eq!(d["phase"], "data", "stalled on its data: {d}");
    assert!(
        d["phase_seconds"].as_f64().unwrap() > 3.0 && d["bound_seconds"].as_f64().unwrap() >= 3.0,
        "past the floor: {d}"
    );
    let victim: Uuid = d["executor"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        executor_state(&p, victim),
        "live",
        "neither lost nor drained"
    );
    let size = eventually(Duration::from_secs(60), || rings_without(&p, &id, victim))
        .unwrap_or_else(|| panic!("a ring without {victim}: {:?}", p.assignments(&id)));
    assert_eq!(size, 2, "the two others train on");
    let Ok(EventData::Stuck(stuck)) = stuck.typed() else {
        panic!("a stuck event's data: {stuck:?}");
    };
    assert_eq!(
        i64::from(stuck.rank),
        i64::from(stalled.rank),
        "the stalled rank is the one declared stuck"
    );
    // The stalled reader gets an end of file now: its role, of a past
    // generation, fails, and that outcome must not end the job.
    drop(std::fs::OpenOptions::new().write(true).open(&held));
    let _ = std::fs::remove_file(&held);
    let job = p.wait_end(&id, Duration::from_secs(240));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{job:?}: {:?}",
        p.log_messages(&id)
    );
    // Only the stalled rank was judged: its peers waited on it in the
    // all-reduce, not on themselves.
    let all = events_of(&p, &id, EventKind::Stuck);
    assert_eq!(all.len(), 1, "one stuck role: {all:?}");
    let live = p
        .executors(None)
        .executors
        .iter()
        .map(|e| serde_json::to_value(e.state).unwrap())
        .collect::<Vec<_>>();
    assert_eq!(live, vec![json!("live"); 3], "every executor stays live");
    let acc = pytorch(&p, &id, &s, &dir);
    println!(
        "PyTorch held-out accuracy after the stall: {:.2}%",
        acc * 100.0
    );
    assert!(acc >= 0.88, "held-out accuracy {acc}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_slow_rank_is_shown_as_a_straggler_and_left_out_when_the_spec_asks() {
    let dir = shards("straggler", 6, 297);
    // Rank 2, wherever it runs, sleeps 60 ms after each step.
    let p = Platform::builder("watchdog-straggler")
        .executor_env("TRAINYARD_SLOW_WORKER", "2:60")
        .start();
    let _execs: Vec<_> = (0..3).map(|i| p.executor(&format!("st-{i}"))).collect();
    let watch = json!({"window_steps": 10, "straggler_factor": 3});
    let shown = spec("straggler-shown", &dir, 100_000, watch.clone());
    let id = p.submit(&shown);
    let ranks = eventually(Duration::from_secs(120), || {
        let r = p.metrics(&id, Some(10)).ranks;
        (r.len() == 3 && r.iter().all(|r| r.window_steps >= 10)).then_some(r)
    })
    .unwrap_or_else(|| panic!("three timed ranks: {:?}", p.metrics(&id, Some(10)).ranks));
    for r in &ranks {
        println!(
            "rank {}: {:.1} ms own work per step, {:.1} ms median step, straggler {}",
            r.rank,
            r.busy_ms,
            r.median_step_seconds * 1e3,
            r.straggler
        );
    }
    let flagged: Vec<i32> = ranks
        .iter()
        .filter(|r| r.straggler)
        .map(|r| r.rank)
        .collect();
    assert_eq!(flagged, vec![2], "{ranks:?}");
    assert!(ranks[2].busy_ms >= 60.0, "{ranks:?}");
    assert!(
        events_of(&p, &id, EventKind::Straggler).is_empty(),
        "shown only: the spec does not ask to leave it out"
    );
    let (code, body) = p.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
    assert_eq!(code, 200, "cancel: {body}");
    p.wait_end(&id, Duration::from_secs(60));

    let mut left_out = watch;
    left_out["exclude_stragglers"] = json!(true);
    let s = spec("straggler-left-out", &dir, 800, left_out);
    let id = p.submit(&s);
    let ev = eventually(Duration::from_secs(120), || {
        events_of(&p, &id, EventKind::Straggler).into_iter().next()
    })
    .unwrap_or_else(|| panic!("a straggler event: {:?}", p.events(&id)));
    println!("{}", ev.reason);
    let Ok(EventData::Straggler(straggler)) = ev.typed() else {
        panic!("a straggler event's data: {ev:?}");
    };
    assert_eq!(straggler.rank, 2, "{ev:?}");
    let victim: Uuid = straggler.executor;
    assert_eq!(executor_state(&p, victim), "live", "only the job left it");
    let size = eventually(Duration::from_secs(60), || rings_without(&p, &id, victim))
        .unwrap_or_else(|| panic!("a ring without {victim}: {:?}", p.assignments(&id)));
    assert_eq!(size, 2);
    let job = p.wait_end(&id, Duration::from_secs(240));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{job:?}: {:?}",
        p.log_messages(&id)
    );
    // Two ranks at a minimum of two: however their step times scatter,
    // the job leaves no second executor.
    let left = events_of(&p, &id, EventKind::Straggler);
    assert_eq!(left.len(), 1, "one executor left: {left:?}");
    let acc = pytorch(&p, &id, &s, &dir);
    println!(
        "PyTorch held-out accuracy without the straggler: {:.2}%",
        acc * 100.0
    );
    assert!(acc >= 0.88, "held-out accuracy {acc}");
    // Only that job left it: the next job's ring uses it again.
    let next = p.submit(&spec("after-straggler", &dir, 100_000, json!({})));
    eventually(Duration::from_secs(60), || {
        let a = p.assignments(&next);
        (a.workers.len() == 3 && a.workers.iter().any(|w| w.executor.id == victim)).then_some(())
    })
    .unwrap_or_else(|| panic!("a ring of three with {victim}: {:?}", p.assignments(&next)));
    let (code, body) = p.post(&format!("/v1/jobs/{next}/cancel"), &json!({}));
    assert_eq!(code, 200, "cancel: {body}");
    let _ = std::fs::remove_dir_all(&dir);
}
