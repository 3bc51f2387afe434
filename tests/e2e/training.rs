//! Training through the platform: a job submitted over REST is placed by the
//! scheduler, trained by a real executor process, and ends `succeeded` with
//! its weights in the object store — or `failed` with a reason that names
//! the problem. Metrics and logs stay readable after the executors exit.

use serde_json::{json, Value};
use std::time::Duration;
use trainyard_common::api::JobLogLine;
use trainyard_common::cluster::ExecutorState;
use trainyard_common::JobState;
use trainyard_e2e::{
    digits_url, eventually, example_digits, kill9, safetensors_f32, safetensors_header,
    torchscript, write_torchscript, Consistency, MlpSpec, Paired, Platform, Proc,
};

/// A platform that declares an executor lost after 25 silent heartbeats
/// (5 s).
fn platform() -> Platform {
    Platform::builder("train").start()
}

/// The digits MLP of these tests: one worker, 30 epochs.
fn digits(name: &str) -> Value {
    MlpSpec::digits(name)
        .hidden(&[128])
        .adamw_warmup(0.003)
        .epochs(30)
        .seed(3)
        .build()
}

/// [`digits`] on a ring of `workers` (min, max), batches of 32, at a higher
/// learning rate.
fn ring_digits(name: &str, workers: (u32, u32), epochs: u64) -> Value {
    ring(name, workers, epochs).build()
}

fn ring(name: &str, workers: (u32, u32), epochs: u64) -> MlpSpec {
    MlpSpec::digits(name)
        .hidden(&[128])
        .adamw_warmup(0.005)
        .batch_size(32)
        .epochs(epochs)
        .workers(workers.0, workers.1)
        .seed(3)
}

/// Two PS shards and three workers, 40 epochs.
fn ps_digits(name: &str, consistency: Consistency) -> Value {
    ring(name, (3, 3), 40)
        .ps(2)
        .consistency(consistency)
        .build()
}

#[test]
fn a_single_worker_job_trains_digits_to_95_percent_and_keeps_its_telemetry() {
    let p = platform();
    let mut exec = p.executor("trainer");
    // The quick start's demo job, as `scripts/run` submits it.
    let id = p.submit(&example_digits());
    let job = p.wait_end(&id, Duration::from_secs(180));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");

    let acc = p.result_accuracy(&id);
    assert!(acc >= 0.95, "held-out accuracy {acc}");
    assert_eq!(
        p.states(&id),
        ["queued", "scheduling", "running", "succeeded"]
    );

    // The weights are a safetensors file with the model's tensors.
    let url = p.weights_url(&id);
    let header = safetensors_header(&std::fs::read(url.strip_prefix("file://").unwrap()).unwrap());
    assert_eq!(header["fc0.weight"]["shape"], json!([128, 64]));
    assert_eq!(header["fc1.bias"]["dtype"], "F32");

    // Telemetry outlives the executor.
    exec.terminate().unwrap();
    exec.wait_exit(Duration::from_secs(30)).unwrap();
    let m = p.metrics(&id, None);
    assert_eq!(m.steps_recorded, 1200, "{m:?}");
    let points = &m.points;
    assert!(points.len() <= 500 && !points.is_empty());
    assert!(points.last().unwrap().eval_accuracy.unwrap() >= 0.95);
    assert!(points[0].loss > points.last().unwrap().loss);
    let small = p.metrics(&id, Some(10));
    assert!(small.downsampled && small.points.len() <= 10);
    let logs = p.log_page(&id, None, None);
    let lines: Vec<&str> = logs.lines.iter().map(|l| l.message.as_str()).collect();
    assert!(
        lines.iter().any(|l| l.contains("rank 0 of 1 starts")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("done after") && l.contains("weights written")),
        "{lines:?}"
    );
}

#[test]
fn unreadable_data_and_mismatched_shapes_fail_the_job_with_a_reason() {
    let p = platform();
    let _exec = p.executor("failer");
    let mut missing = digits("missing-data");
    missing["dataset"]["url"] = json!("file:///nonexistent/trainyard/digits.npz");
    missing["epochs"] = json!(1);
    let a = p.submit(&missing);
    let ja = p.wait_end(&a, Duration::from_secs(60));
    assert_eq!(ja.state, JobState::Failed);
    assert!(
        ja.state_reason
            .contains("cannot read dataset file:///nonexistent/trainyard/digits.npz"),
        "{ja:?}"
    );

    let mut shapes = digits("wrong-shape");
    shapes["model"]["inputs"] = json!(32);
    shapes["epochs"] = json!(1);
    let b = p.submit(&shapes);
    let jb = p.wait_end(&b, Duration::from_secs(60));
    assert_eq!(jb.state, JobState::Failed);
    let reason = &jb.state_reason;
    assert!(
        reason.contains("64 features") && reason.contains("takes 32"),
        "{reason}"
    );
    let logs = p.log_page(&b, None, None);
    assert!(logs.lines.iter().any(|l| l.level == "error"), "{logs:?}");
}

#[test]
fn a_torchscript_model_from_python_is_inspected_and_trained() {
    let p = platform();
    let _exec = p.executor("scripter");
    let model = p.file("net.pt");
    write_torchscript(&model);
    let id = p.submit(&torchscript("byom", &format!("file://{}", model.display())));
    let job = p.wait_end(&id, Duration::from_secs(120));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let events = p.events(&id);
    assert_eq!(
        p.states(&id),
        ["queued", "inspecting", "scheduling", "running", "succeeded"],
        "{events:?}"
    );
    let inspected = events
        .iter()
        .find(|e| e.to_state == Some(JobState::Scheduling))
        .unwrap();
    assert!(
        inspected
            .reason
            .contains("inspected: 4 tensors, 321 parameters"),
        "{inspected:?}"
    );
    // The tensors under PyTorch's dotted names, as the inspection found them.
    let t = p.tensors(&id);
    assert_eq!(t.source, trainyard_common::api::TensorSource::Inspection);
    let names: Vec<&str> = t.tensors.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(
        names,
        ["hidden.bias", "hidden.weight", "out.bias", "out.weight"]
    );
    assert_eq!((t.parameters, t.buffers, t.frozen), (321, 0, 0));
    let m = p.metrics(&id, Some(10000));
    let first = m.points[0].loss;
    let last = m.points.last().unwrap().loss;
    assert!(
        first / last >= 10.0,
        "loss fell only from {first} to {last}"
    );
}

#[test]
fn a_corrupt_torchscript_file_fails_the_job_with_a_reason() {
    let p = platform();
    let _exec = p.executor("inspector");
    let model = p.file("corrupt.pt");
    std::fs::write(&model, b"this is not a TorchScript archive").unwrap();
    let id = p.submit(&torchscript(
        "corrupt",
        &format!("file://{}", model.display()),
    ));
    let job = p.wait_end(&id, Duration::from_secs(60));
    assert_eq!(job.state, JobState::Failed);
    assert!(
        job.state_reason
            .contains("not a loadable TorchScript module"),
        "{job:?}"
    );
}

#[test]
fn a_model_that_cannot_train_on_its_data_fails_in_inspecting_naming_the_mismatch() {
    let p = platform();
    let _exec = p.executor("inspector");
    let dir = p.file("misfits");
    std::fs::create_dir_all(&dir).unwrap();
    trainyard_e2e::python_script("misfits.py", &dir);
    let cases = [
        (
            "two",
            vec!["takes 2 tensors (x, mask)", "dataset.inputs", "Tensor mask"],
        ),
        ("few", vec!["labels go up to 9", "at least 10"]),
        ("wide", vec!["cannot take a batch of the dataset", "64"]),
    ];
    let ids: Vec<String> = cases
        .iter()
        .map(|(name, _)| {
            let mut spec = torchscript(
                name,
                &format!("file://{}", dir.join(format!("{name}.pt")).display()),
            );
            spec["dataset"] = json!({"kind": "file", "url": digits_url()});
            spec["loss"] = json!("cross_entropy");
            p.submit(&spec)
        })
        .collect();
    for ((name, words), id) in cases.iter().zip(&ids) {
        p.wait_failed_with(name, id, Duration::from_secs(90), words);
        // Refused before any worker started.
        assert_eq!(p.states(id), ["queued", "inspecting", "failed"], "{name}");
    }
}

#[test]
fn a_transformer_language_model_beats_the_unigram_entropy_of_its_text() {
    let p = platform();
    let _exec = p.executor("lm");
    // A text with structure beyond letter frequencies.
    let words = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    ];
    let mut text = String::new();
    let mut x: u64 = 12345;
    while text.len() < 30_000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let w = words[(x >> 33) as usize % words.len()];
        text.push_str(w);
        text.push_str(if (x >> 20) % 5 == 0 { ". " } else { " " });
    }
    let path = p.file("corpus.txt");
    std::fs::write(&path, &text).unwrap();
    let mut counts = [0f64; 256];
    for b in text.bytes() {
        counts[b as usize] += 1.0;
    }
    let n = text.len() as f64;
    let entropy: f64 = counts
        .iter()
        .filter(|&&c| c > 0.0)
        .map(|&c| -(c / n) * (c / n).ln())
        .sum();

    let id = p.submit(&json!({
        "name": "tiny-lm",
        "model": {"kind": "transformer", "vocab": 128, "context": 32, "layers": 2, "heads": 4, "width": 64},
        "dataset": {"kind": "file", "url": format!("file://{}", path.display())},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adamw", "lr": 0.003, "grad_clip": 1.0},
        "batch_size": 32,
        "steps": 250,
        "strategy": "allreduce",
        "workers": {"min": 1, "max": 1}
    }));
    let job = p.wait_end(&id, Duration::from_secs(240));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let eval = p.result(&id)["eval_loss"].as_f64().unwrap();
    assert!(
        eval < entropy,
        "held-out loss {eval} nats ≥ unigram entropy {entropy} nats"
    );
    eprintln!("language model: held-out loss {eval:.3} nats vs unigram entropy {entropy:.3} nats");
}

#[test]
fn training_goes_on_through_an_api_crash_and_loses_no_metric() {
    let mut p = platform();
    let _exec = p.executor("steady");
    let mut spec = digits("through-a-crash");
    spec.as_object_mut().unwrap().remove("epochs");
    spec["steps"] = json!(6000);
    let id = p.submit(&spec);
    p.wait_steps(&id, 1, Duration::from_secs(60));
    // A rank's first step is reported at once; the job is `running` once
    // the scheduler has heard from its executor's heartbeat too.
    let before = eventually(Duration::from_secs(60), || {
        let j = p.job(&id);
        (j.state == JobState::Running).then_some(j)
    })
    .unwrap_or_else(|| panic!("the job never ran: {:?}", p.job(&id)));
    assert!(
        p.steps_recorded(&id) < 6000,
        "the crash must come mid-training: {before:?}"
    );
    // The API (and its scheduler) vanishes for 7 s — longer than the 5 s
    // lost timeout — while the executor trains on and buffers its reports.
    p.crash_api(Duration::from_secs(7));
    let job = p.wait_end(&id, Duration::from_secs(180));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let m = p.metrics(&id, Some(10000));
    assert_eq!(m.steps_recorded, 6000, "every step arrived exactly once");
    let logs = p.log_page(&id, None, None);
    assert!(logs
        .lines
        .iter()
        .any(|l| l.message.contains("done after 6000 steps")));
    let executors = p.executors(None);
    assert_eq!(
        executors.executors.len(),
        1,
        "the executor was not declared lost: {executors:?}"
    );
    assert_eq!(executors.executors[0].state, ExecutorState::Live);
}

/// The SHA-256 each rank logged for its final weights, by executor.
fn final_hashes(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.split("weights sha256 ").nth(1))
        .map(|h| h.split_whitespace().next().unwrap().to_owned())
        .collect()
}

#[test]
fn four_ring_ranks_train_digits_to_95_percent_with_bit_identical_weights() {
    let p = platform();
    let _execs: Vec<Proc> = (0..4).map(|i| p.executor(&format!("ring-{i}"))).collect();
    let id = p.submit(&ring_digits("ring-4", (4, 4), 40));
    let job = p.wait_end(&id, Duration::from_secs(300));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let acc = p.result_accuracy(&id);
    assert!(acc >= 0.95, "held-out accuracy {acc}");
    let lines = eventually(Duration::from_secs(20), || {
        let l = p.log_messages(&id);
        (final_hashes(&l).len() == 4).then_some(l)
    })
    .unwrap_or_else(|| panic!("four ranks report their weights: {:?}", p.log_messages(&id)));
    // All-reduce time and bus bandwidth per step, through the metrics API.
    let m = p.metrics(&id, Some(20));
    let last = m.points.last().unwrap().clone();
    assert!(last.comm_seconds > 0.0, "{last:?}");
    assert!(last.comm_bytes > 0.0, "{last:?}");
    let bus = last.bus_gbps.unwrap();
    assert!(bus > 0.0, "{last:?}");
    println!(
        "ring of 4: all-reduce {:.2} ms per step, bus bandwidth {bus:.3} GB/s",
        last.comm_seconds * 1e3
    );
    let hashes = final_hashes(&lines);
    println!(
        "ring of 4: held-out accuracy {:.2}%, weight hashes {hashes:?}",
        acc * 100.0
    );
    assert!(hashes.iter().all(|h| h == &hashes[0]), "{hashes:?}");
    for r in 0..4 {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("rank {r} of 4 starts"))),
            "{lines:?}"
        );
    }
}

/// Ranks of `generation`'s ring, from the "rank r of n starts" lines.
fn ring_size_of_generation(p: &Platform, id: &str, generation: i64) -> Option<usize> {
    let logs = p.logs(id);
    let ranks: Vec<&JobLogLine> = logs
        .iter()
        .filter(|l| l.generation == generation && l.message.contains(" starts on "))
        .collect();
    ranks.first().map(|l| after(&l.message, " of "))
}

#[test]
fn a_killed_rank_is_survived_and_a_new_executor_grows_the_ring_back() {
    let p = Platform::builder("train").heartbeat_misses(10).start();
    let mut execs: Vec<Proc> = (0..4)
        .map(|i| p.executor(&format!("elastic-{i}")))
        .collect();
    let mut spec = ring_digits("ring-elastic", (2, 4), 300);
    spec["model"]["hidden"] = json!([256, 256]);
    let id = p.submit(&spec);
    // Wait until the ring of 4 has trained a while. Executors register one
    // after another, so the first generation may be a ring of 2 or 3 that
    // grows; and a generation's "starts" lines reach the log a heartbeat
    // after it begins: wait for a generation that is a ring of 4.
    p.wait_steps(&id, 30, Duration::from_secs(120));
    let generation = eventually(Duration::from_secs(60), || {
        let g = p.job(&id).generation;
        (ring_size_of_generation(&p, &id, g) == Some(4)).then_some(g)
    })
    .unwrap_or_else(|| panic!("a ring of 4 forms: {:?}", p.log_messages(&id)));

    let victim = execs.remove(2);
    kill9(victim.pid());
    let rebuilt = eventually(Duration::from_secs(60), || {
        p.log_messages(&id)
            .into_iter()
            .find(|l| l.contains("ring of 3 rebuilt"))
    })
    .unwrap_or_else(|| panic!("the ring rebuilds with 3: {:?}", p.log_messages(&id)));
    let seconds: f64 = after(&rebuilt, " ran ");
    println!("SIGKILL of a rank → first step of the rebuilt ring of 3: {seconds:.2} s");
    let state = p.job(&id);
    assert!(
        [JobState::Running, JobState::Recovering].contains(&state.state),
        "{state:?}"
    );

    // A new executor joins the ring at the next generation.
    execs.push(p.executor("elastic-new"));
    let grown = eventually(Duration::from_secs(60), || {
        let g = p.job(&id).generation;
        (g > generation + 1 && ring_size_of_generation(&p, &id, g) == Some(4)).then_some(g)
    });
    assert!(
        grown.is_some(),
        "the ring grows back to 4: {:?}",
        p.log_messages(&id)
    );
    let job = p.wait_end(&id, Duration::from_secs(600));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let acc = p.result_accuracy(&id);
    println!(
        "elastic ring (4 → 3 → 4): held-out accuracy {:.2}%",
        acc * 100.0
    );
    assert!(acc >= 0.95, "held-out accuracy {acc}");
    // Every rank of the last ring logs its hash (the others' reports may
    // arrive just after rank 0's outcome).
    let lines = eventually(Duration::from_secs(20), || {
        let l = p.log_messages(&id);
        (final_hashes(&l).len() >= 4).then_some(l)
    })
    .unwrap_or_else(|| panic!("four ranks report their weights: {:?}", p.log_messages(&id)));
    assert!(
        lines
            .iter()
            .any(|l| l.contains("received weights and optimizer state")),
        "the new member got the state: {lines:?}"
    );
    let hashes = final_hashes(&lines);
    assert!(hashes.iter().all(|h| h == &hashes[0]), "{hashes:?}");
}

/// The number that follows `marker` in a log line.
fn after<T: std::str::FromStr>(line: &str, marker: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    let rest = line
        .split(marker)
        .nth(1)
        .unwrap_or_else(|| panic!("{marker:?} in {line:?}"));
    rest.split([' ', ',']).next().unwrap().parse().unwrap()
}

/// The shards' closing statistics: (rejected, staleness histogram) each.
fn shard_stats(lines: &[String]) -> Vec<(u64, Vec<u64>)> {
    lines
        .iter()
        .filter(|l| l.starts_with("PS shard") && l.contains("staleness histogram"))
        .map(|l| {
            let rejected = after(l, " applied, ");
            let hist = l
                .split("histogram [")
                .nth(1)
                .unwrap()
                .split(']')
                .next()
                .unwrap();
            (
                rejected,
                hist.split(", ").map(|v| v.parse().unwrap()).collect(),
            )
        })
        .collect()
}

#[test]
fn two_ps_shards_and_three_workers_train_digits_in_sync_async_and_bounded_modes() {
    let p = platform();
    let _execs: Vec<Proc> = (0..4).map(|i| p.executor(&format!("ps-{i}"))).collect();
    let sync = p.submit(&ps_digits("ps-sync", Consistency::Sync));
    let job = p.wait_end(&sync, Duration::from_secs(300));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{job:?} {:?}",
        p.log_messages(&sync)
    );
    let acc = p.result_accuracy(&sync);
    println!(
        "PS sync, 2 shards × 3 workers: held-out accuracy {:.2}%",
        acc * 100.0
    );
    assert!(acc >= 0.95, "sync accuracy {acc}");

    for (name, consistency) in [
        ("ps-async", Consistency::Async),
        ("ps-bounded", Consistency::Bounded(2)),
    ] {
        let id = p.submit(&ps_digits(name, consistency));
        let job = p.wait_end(&id, Duration::from_secs(300));
        assert_eq!(
            job.state,
            JobState::Succeeded,
            "{job:?} {:?}",
            p.log_messages(&id)
        );
        let acc = p.result_accuracy(&id);
        println!("PS {name}: held-out accuracy {:.2}%", acc * 100.0);
        assert!(acc >= 0.93, "{name} accuracy {acc}");
    }
}

#[test]
fn bounded_staleness_rejects_a_slow_workers_stale_pushes_and_applies_none_older_than_tau() {
    let p = platform();
    // Rank 2 sleeps 30 ms after each accepted step; the others do not.
    let _execs: Vec<Proc> = (0..4)
        .map(|i| {
            p.executor_with(
                &format!("slow-{i}"),
                2048,
                &[("TRAINYARD_SLOW_WORKER", "2:30")],
            )
        })
        .collect();
    let id = p.submit(&ps_digits("ps-bounded-slow", Consistency::Bounded(2)));
    let job = p.wait_end(&id, Duration::from_secs(300));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let stats = eventually(Duration::from_secs(30), || {
        let s = shard_stats(&p.log_messages(&id));
        (s.len() >= 2).then_some(s)
    })
    .expect("both shards log their statistics");
    let rejected: u64 = stats.iter().map(|s| s.0).sum();
    println!("bounded(2) with a slow worker: {rejected} pushes rejected; histograms {stats:?}");
    assert!(rejected > 0, "{stats:?}");
    // The same through the metrics API, as the workers saw it.
    let m = p.get(&format!("/v1/jobs/{id}/metrics?max_points=10"));
    let hist: Vec<i64> = m["staleness_histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    println!(
        "metrics API: staleness histogram {hist:?}, {} rejected",
        m["rejected_pushes"]
    );
    assert!(m["rejected_pushes"].as_i64().unwrap() > 0, "{m}");
    assert!(hist[3..].iter().all(|&c| c == 0) && hist[0] > 0, "{hist:?}");
    for (_, hist) in &stats {
        assert!(
            hist[3..].iter().all(|&c| c == 0),
            "an applied gradient older than τ: {hist:?}"
        );
        assert!(
            hist[1..3].iter().sum::<u64>() > 0,
            "stale-but-accepted gradients happen: {hist:?}"
        );
    }
}

/// Sync SGD through 2 PS shards with 3 workers of batch 16 ends with the
/// weights of one worker with batch 48 (the concatenation of theirs).
#[test]
fn sync_sgd_through_the_ps_tier_equals_one_process_on_the_concatenated_batches() {
    let p = platform();
    let _execs: Vec<Proc> = (0..4).map(|i| p.executor(&format!("exact-{i}"))).collect();
    let sgd = |mut spec: Value, batch: u32| {
        spec["optimizer"] = json!({"kind": "sgd", "lr": 0.1});
        spec["batch_size"] = json!(batch);
        spec.as_object_mut().unwrap().remove("epochs");
        spec["steps"] = json!(12);
        spec
    };
    let ps = p.submit(&sgd(ps_digits("exact-ps", Consistency::Sync), 16));
    assert_eq!(
        p.wait_end(&ps, Duration::from_secs(120)).state,
        JobState::Succeeded
    );
    let mut single = sgd(digits("exact-single"), 48);
    single["seed"] = json!(3);
    let one = p.submit(&single);
    assert_eq!(
        p.wait_end(&one, Duration::from_secs(120)).state,
        JobState::Succeeded
    );
    let (a, b) = (
        safetensors_f32(&p.weights_url(&ps)),
        safetensors_f32(&p.weights_url(&one)),
    );
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let mut worst = 0f64;
    for (k, va) in &a {
        let vb = &b[k];
        let scale = vb.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
        let diff = va
            .iter()
            .zip(vb)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        worst = worst.max(f64::from(diff / scale));
    }
    println!("PS sync SGD vs one process: largest relative difference {worst:.2e}");
    assert!(worst < 1e-5, "relative difference {worst}");
}

#[test]
fn a_ps_job_survives_a_killed_worker_and_a_killed_ps_and_grows_with_a_new_executor() {
    let p = Platform::builder("train").heartbeat_misses(10).start();
    let mut execs: Vec<(String, Proc)> = (0..3)
        .map(|i| (format!("psf-{i}"), p.executor(&format!("psf-{i}"))))
        .collect();
    let mut spec = ps_digits("ps-faults", Consistency::Sync);
    spec["workers"] = json!({"min": 2, "max": 4});
    spec["epochs"] = json!(250);
    spec["model"]["hidden"] = json!([256, 256]);
    spec["checkpoint"] = json!({"every_steps": 20, "keep": 2});
    let id = p.submit(&spec);
    p.wait_steps(&id, 30, Duration::from_secs(120));
    let hosts = p.get(&format!("/v1/jobs/{id}/assignments"));
    let ps_hosts: Vec<String> = hosts["parameter_servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["executor"]["name"].as_str().unwrap().to_owned())
        .collect();
    // A worker-only executor dies.
    let victim = execs
        .iter()
        .position(|(n, _)| !ps_hosts.contains(n))
        .expect("an executor with a worker and no shard");
    let (name, proc_) = execs.remove(victim);
    kill9(proc_.pid());
    let g0 = p.job(&id).generation;
    eventually(Duration::from_secs(30), || {
        (p.job(&id).generation > g0).then_some(())
    })
    .unwrap_or_else(|| panic!("{name} is replaced: {:?}", p.log_messages(&id)));
    // Two executors join: the job grows to 4 workers.
    execs.push(("psf-new-0".into(), p.executor("psf-new-0")));
    execs.push(("psf-new-1".into(), p.executor("psf-new-1")));
    eventually(Duration::from_secs(60), || {
        let a = p.get(&format!("/v1/jobs/{id}/assignments"));
        (a["workers"].as_array().map_or(0, Vec::len) == 4).then_some(())
    })
    .unwrap_or_else(|| panic!("the job grows to 4 workers: {:?}", p.log_messages(&id)));
    // The executor of shard 1 dies while spares exist.
    let hosts = p.get(&format!("/v1/jobs/{id}/assignments"));
    let shard1 = hosts["parameter_servers"][1]["executor"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let at = execs.iter().position(|(n, _)| *n == shard1).unwrap();
    let (_, ps_proc) = execs.remove(at);
    kill9(ps_proc.pid());
    let job = p.wait_end(&id, Duration::from_secs(600));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{job:?} {:?}",
        p.log_messages(&id)
    );
    let lines = p.log_messages(&id);
    // The lost shard's ranges come back from the newest committed
    // checkpoint (values and optimizer state), not from a worker's pull.
    assert!(
        lines.iter().any(
            |l| l.starts_with("PS shard") && l.contains("restored from the checkpoint of step")
        ),
        "{lines:?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("restored from this worker's newest pull")),
        "{lines:?}"
    );
    // The same spec without faults, on the executors left.
    let mut clean = spec.clone();
    clean["name"] = json!("ps-no-faults");
    let clean_id = p.submit(&clean);
    let job = p.wait_end(&clean_id, Duration::from_secs(600));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    // Both downloaded models, judged by PyTorch on the held-out fifth.
    let (digits, dir) = (
        trainyard_e2e::repo_root().join("data/digits.npz"),
        p.file("eval"),
    );
    let faulted = p.pytorch_evaluation(&id, &spec, &digits, &dir);
    let undisturbed = p.pytorch_evaluation(&clean_id, &clean, &digits, &dir);
    let paired = Paired::new(&faulted.correct, &undisturbed.correct);
    println!(
        "PS job through a killed worker, growth to 4 and a killed PS: held-out accuracy {:.2}%; \
         the same spec without faults: {:.2}% (rows only the faulted run misses {}, only the \
         undisturbed run misses {}, p = {:.3})",
        faulted.accuracy * 100.0,
        undisturbed.accuracy * 100.0,
        paired.only_baseline,
        paired.only_candidate,
        paired.p_worse,
    );
    assert!(faulted.accuracy >= 0.95, "accuracy {}", faulted.accuracy);
    assert!(
        undisturbed.accuracy >= 0.95,
        "accuracy {}",
        undisturbed.accuracy
    );
    // The faults cost no accuracy: the rows the faulted model misses and
    // the undisturbed one gets are no more than chance explains (a
    // one-sided exact test at 1 %; see `trainyard_e2e::compare`).
    assert!(
        !paired.candidate_is_worse(0.01),
        "the faulted run is worse than the undisturbed one beyond chance: {paired:?}"
    );
}
