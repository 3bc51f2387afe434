//! Checkpoints end to end: written by ring ranks and PS shard servers to a
//! real S3 server (Garage, started by `scripts/test`) and to local folders,
//! committed by the API, kept to the newest K, listed, used to resume — also
//! after every executor was SIGKILLed in the middle of an upload — and the
//! final weights read back in Python with the accuracy the platform reported.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use trainyard_common::JobState;
use trainyard_e2e::{
    binary, eventually, kill9, repo_root, run_ok, safetensors_header, ApiClient, MlpSpec, Platform,
    Proc, TestS3,
};

/// A platform whose executors are lost after 5 silent heartbeats (1 s),
/// with its objects in `s3` or else in its data folder.
fn platform(s3: Option<&TestS3>) -> Platform {
    let mut b = Platform::builder("ckpt")
        .heartbeat_misses(5)
        .client_timeout(Duration::from_secs(20));
    if let Some(s3) = s3 {
        b = b.s3(s3);
    }
    b.start()
}

/// A ring of two on digits for `steps` steps.
fn digits(name: &str, steps: u64) -> Value {
    MlpSpec::digits(name)
        .steps(steps)
        .workers(2, 2)
        .seed(5)
        .build()
}

/// Waits until job `id`'s committed checkpoints are `want` (newest first).
fn wait_checkpoints(p: &ApiClient, id: &str, want: &[u64]) {
    let ok = eventually(Duration::from_secs(60), || {
        (p.checkpoint_steps(id) == want).then_some(())
    });
    assert!(
        ok.is_some(),
        "checkpoints of {id}: {:?}, wanted {want:?}; events {:?}; logs {:?}",
        p.checkpoint_steps(id),
        p.events(id),
        p.log_messages(id)
            .iter()
            .filter(|l| !l.starts_with("step "))
            .collect::<Vec<_>>()
    );
}

/// Step folders under a job's prefix and the files in each.
fn folders(keys: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for k in keys {
        let parts: Vec<&str> = k.split('/').collect();
        if parts.len() == 3 {
            out.entry(parts[1].to_owned())
                .or_default()
                .push(parts[2].to_owned());
        }
    }
    out
}

#[test]
fn checkpoints_of_ring_and_ps_jobs_go_to_s3_are_kept_to_k_and_resume_a_new_job_with_another_shape()
{
    let s3 = TestS3::from_env();
    let p = platform(Some(&s3));
    let _e: Vec<Proc> = (0..4).map(|i| p.executor(&format!("s3-{i}"))).collect();

    // A ring of two: each rank writes its half; steps 40, 80, 120 and the
    // end (150); the newest two are kept. Its dataset is read from S3 too.
    let mut ring = digits("ring-s3", 150);
    ring["dataset"]["url"] =
        json!(s3.upload("datasets/digits.npz", &repo_root().join("data/digits.npz")));
    ring["checkpoint"] = json!({"every_steps": 40, "keep": 2});
    let ring_id = p.submit(&ring);
    let job = p.wait_end(&ring_id, Duration::from_secs(240));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{:?}",
        p.log_messages(&ring_id)
    );
    wait_checkpoints(&p, &ring_id, &[150, 120]);
    let listed = p.checkpoints(&ring_id);
    let newest = &listed.checkpoints[0];
    assert_eq!(newest.shards, 2, "{listed:?}");
    assert!(newest
        .manifest_url
        .starts_with(&format!("{}/{ring_id}/step-150/manifest.json", s3.url)));
    let in_s3 = folders(&s3.list(&ring_id));
    assert_eq!(
        in_s3.keys().collect::<Vec<_>>(),
        ["final", "step-120", "step-150"],
        "{in_s3:?}"
    );
    for step in ["step-120", "step-150"] {
        assert_eq!(
            in_s3[step],
            [
                "manifest.json",
                "shard-0.safetensors",
                "shard-1.safetensors"
            ]
        );
    }
    // The final model streams from S3 through the API.
    let model = p.get_response(&format!("/v1/jobs/{ring_id}/model"));
    assert_eq!(model.status(), 200);
    let header = safetensors_header(&model.bytes().unwrap());
    assert_eq!(header["fc0.weight"]["shape"], json!([64, 64]));

    // Two PS shards, two workers, sync: each shard writes its own ranges
    // of the same version.
    let mut ps = digits("ps-s3", 150);
    ps["strategy"] = json!("parameter_server");
    ps["parameter_servers"] = json!(2);
    ps["checkpoint"] = json!({"every_steps": 40, "keep": 2});
    let ps_id = p.submit(&ps);
    let job = p.wait_end(&ps_id, Duration::from_secs(240));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{:?}",
        p.log_messages(&ps_id)
    );
    wait_checkpoints(&p, &ps_id, &[150, 120]);
    let in_s3 = folders(&s3.list(&ps_id));
    assert_eq!(
        in_s3.keys().collect::<Vec<_>>(),
        ["final", "step-120", "step-150"],
        "{in_s3:?}"
    );
    assert_eq!(in_s3["step-150"].len(), 3, "{in_s3:?}");

    // Large shards go up as multipart uploads; the S3 server takes them.
    s3.multipart_round_trip();

    // The PS job's checkpoint resumes a ring of three: each rank loads the
    // two shards' ranges it needs.
    let mut ring3 = digits("resumed-from-ps", 200);
    ring3["workers"] = json!({"min": 3, "max": 3});
    ring3["resume_from"] = json!({"job_id": ps_id});
    let ring3_id = p.submit(&ring3);
    let job = p.wait_end(&ring3_id, Duration::from_secs(240));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{:?}",
        p.log_messages(&ring3_id)
    );
    // Every rank says where it started (a rank's last lines may land just
    // after the job ended).
    let resumed = |lines: Vec<String>| {
        let want = format!("resumed from the checkpoint of step 150 (job {ps_id})");
        lines.iter().filter(|l| l.contains(&want)).count()
    };
    let all_three = eventually(Duration::from_secs(30), || {
        (resumed(p.log_messages(&ring3_id)) == 3).then_some(())
    });
    assert!(all_three.is_some(), "{:?}", p.log_messages(&ring3_id));
    let metrics = p.metrics(&ring3_id, None);
    assert_eq!(
        metrics.points.first().map(|m| m.step),
        Some(151),
        "{metrics:?}"
    );

    // A new job starts from the ring's checkpoint with another shape: two
    // PS shards re-shard the ring's two slices.
    let mut next = ps.clone();
    next["name"] = json!("resumed-from-ring");
    next["steps"] = json!(250);
    next["resume_from"] = json!({"job_id": ring_id});
    let next_id = p.submit(&next);
    let job = p.wait_end(&next_id, Duration::from_secs(240));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{:?}",
        p.log_messages(&next_id)
    );
    let restored = |lines: Vec<String>| {
        let want = format!("restored from the checkpoint of step 150 (job {ring_id})");
        lines.iter().filter(|l| l.contains(&want)).count()
    };
    let both = eventually(Duration::from_secs(30), || {
        (restored(p.log_messages(&next_id)) == 2).then_some(())
    });
    assert!(both.is_some(), "{:?}", p.log_messages(&next_id));
    let metrics = p.metrics(&next_id, None);
    let first = metrics.points[0].step;
    assert_eq!(first, 151, "{metrics:?}");
    let acc = p.result_accuracy(&next_id);
    assert!(acc >= 0.9, "accuracy {acc}");

    // A resume point that does not exist is refused, naming the field.
    let mut bad = digits("bad-resume", 10);
    bad["resume_from"] = json!({"job_id": ring_id, "step": 7});
    let (status, body) = p.post("/v1/jobs", &bad);
    assert_eq!(status, 422);
    assert_eq!(body["errors"][0]["field"], "resume_from.step", "{body}");
}

#[test]
fn a_fleet_killed_mid_upload_resumes_from_the_last_committed_checkpoint() {
    let p = platform(None);
    let objects = p.data.join("objects");
    // One executor's uploads from step 100 on are held (for longer than
    // the test), so the checkpoint of step 100 stays half in the store
    // until the fleet is killed, whatever the machine's load; steps are
    // slowed so the job is still running then.
    let mut first = vec![
        p.executor_with("kill-a", 2048, &[("TRAINYARD_SLOW_WORKER", "*:15")]),
        p.executor_with(
            "kill-b",
            2048,
            &[
                ("TRAINYARD_SLOW_WORKER", "*:15"),
                ("TRAINYARD_UPLOAD_DELAY_MS", "600000@100"),
            ],
        ),
    ];
    let mut spec = digits("kill-mid-upload", 400);
    spec["checkpoint"] = json!({"every_steps": 50, "keep": 3});
    let id = p.submit(&spec);
    let job_dir = objects.join(&id);
    // Wait until one checkpoint is committed and a later one has some of
    // its shards in the store but no manifest.
    let partial = eventually(Duration::from_secs(120), || {
        let committed = p.checkpoint_steps(&id);
        let newest = *committed.first()?;
        let dirs = std::fs::read_dir(&job_dir).ok()?;
        dirs.filter_map(Result::ok).find_map(|d| {
            let step: u64 = d
                .file_name()
                .to_str()?
                .strip_prefix("step-")?
                .parse()
                .ok()?;
            let files: Vec<String> = std::fs::read_dir(d.path())
                .ok()?
                .filter_map(|f| f.ok()?.file_name().into_string().ok())
                .filter(|f| f.ends_with(".safetensors"))
                .collect();
            let manifest = d.path().join("manifest.json").exists();
            (step > newest && files.len() == 1 && !manifest).then_some((newest, step))
        })
    });
    let Some((committed, partial)) = partial else {
        panic!(
            "no half-uploaded checkpoint seen: {:?} {:?}",
            p.checkpoint_steps(&id),
            p.log_messages(&id)
        );
    };
    for e in &first {
        kill9(e.pid());
    }
    for e in &mut first {
        let _ = e.wait_exit(Duration::from_secs(10));
    }
    assert_eq!(
        p.checkpoint_steps(&id).first(),
        Some(&committed),
        "{:?}",
        p.log_messages(&id)
    );
    assert!(!job_dir
        .join(format!("step-{partial}/manifest.json"))
        .exists());

    // A new fleet: the job resumes from the committed checkpoint, never
    // from the partial one, and succeeds. `kill-a` comes back on this
    // machine with its local cache tier: it reads the shard it wrote there.
    let _second = [p.executor("kill-a"), p.executor("kill-c")];
    let job = p.wait_end(&id, Duration::from_secs(240));
    assert_eq!(job.state, JobState::Succeeded, "{:?}", p.log_messages(&id));
    // A rank's log lines may reach the API after the job has ended (on a
    // loaded machine, seconds after): wait for both ranks' resume lines.
    let resumed_lines = || -> Vec<String> {
        p.log_messages(&id)
            .into_iter()
            .filter(|l| l.contains("resumed from the checkpoint of step"))
            .collect()
    };
    let resumed = eventually(Duration::from_secs(30), || {
        let r = resumed_lines();
        (r.len() >= 2).then_some(r)
    })
    .unwrap_or_else(|| panic!("fewer than two ranks resumed: {:?}", p.log_messages(&id)));
    eprintln!(
        "killed with step {committed} committed and step {partial} half uploaded; {resumed:?}"
    );
    assert!(
        resumed
            .iter()
            .any(|l| l.contains("read from the local cache")),
        "the restarted executor read its checkpoint shard from its local cache: {resumed:?}"
    );
    // Both ranks of the new fleet start from it. (Until they commit a
    // checkpoint of their own, every resume does; a later one, after a
    // spurious repair on a loaded machine, may start from theirs.)
    assert!(
        resumed.len() >= 2
            && resumed[..2]
                .iter()
                .all(|l| l.contains(&format!("step {committed} "))),
        "resumed from {resumed:?}, the last committed was {committed} (partial {partial})"
    );
    wait_checkpoints(&p, &id, &[400, 350, 300]);
    // Nothing without a manifest is left behind.
    eventually(Duration::from_secs(30), || {
        let left: Vec<String> = std::fs::read_dir(&job_dir)
            .unwrap()
            .filter_map(|d| d.ok()?.file_name().into_string().ok())
            .filter(|d| d.starts_with("step-"))
            .collect();
        (left.len() == 3).then_some(())
    })
    .expect("only the kept checkpoints remain");
}

#[test]
fn final_weights_read_in_python_give_the_accuracy_the_platform_reported() {
    let p = platform(None);
    let _e = p.executor("py-eval");
    let mut spec = digits("python-eval", 300);
    spec["workers"] = json!({"min": 1, "max": 1});
    spec["checkpoint"] = json!({"every_steps": 100});
    let id = p.submit(&spec);
    let job = p.wait_end(&id, Duration::from_secs(180));
    assert_eq!(job.state, JobState::Succeeded, "{:?}", p.log_messages(&id));
    let reported = p.result_accuracy(&id);

    let dir = p.data.join("python");
    std::fs::create_dir_all(&dir).unwrap();
    // The command-line client lists the checkpoints and downloads the model.
    let model = dir.join("model.safetensors");
    let cli = |args: &[&str]| {
        let mut cmd = std::process::Command::new(binary("trainyard").unwrap());
        cmd.args(args).args(["--api", &p.base]);
        String::from_utf8_lossy(&run_ok(&mut cmd, "trainyard").stdout).into_owned()
    };
    let listed = cli(&["checkpoints", &id]);
    assert!(
        listed.lines().nth(1).is_some_and(|l| l.starts_with("300 ")),
        "{listed}"
    );
    let said = cli(&["model", &id, "-o", model.to_str().unwrap()]);
    assert!(said.contains("bytes of safetensors"), "{said}");
    let spec_file = dir.join("spec.json");
    std::fs::write(&spec_file, spec.to_string()).unwrap();
    let out = run_ok(
        std::process::Command::new("python3")
            .arg(repo_root().join("tests/python/evaluate_mlp.py"))
            .arg(&model)
            .arg(&spec_file)
            .arg(repo_root().join("data/digits.npz")),
        "python3 (the venv's, with torch and safetensors: run ./scripts/test)",
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    let acc = got["accuracy"].as_f64().unwrap();
    let n = got["samples"].as_f64().unwrap();
    assert!(
        (acc - reported).abs() < 0.5 / n,
        "Python says {acc}, the platform reported {reported} over {n} held-out samples"
    );
    assert!(acc > 0.9, "{acc}");

    // No final weights yet / no such job: a problem body, not a 500.
    let r = p.get_response(&format!("/v1/jobs/{}/model", uuid::Uuid::nil()));
    assert_eq!(r.status(), 404);
}

#[test]
fn a_drained_fleet_leaves_a_checkpoint_that_the_next_fleet_resumes_from() {
    let p = platform(None);
    let slow = [("TRAINYARD_SLOW_WORKER", "*:10")];
    let first = [
        p.executor_with("drain-a", 2048, &slow),
        p.executor_with("drain-b", 2048, &slow),
    ];
    // No periodic checkpoints: only the drain writes one.
    let mut spec = digits("drained", 1500);
    spec["checkpoint"] = json!({"at_end": false});
    let id = p.submit(&spec);
    eventually(Duration::from_secs(120), || {
        (p.steps_recorded(&id) >= 100).then_some(())
    })
    .expect("the job trains");
    // SIGTERM: each executor drains; a checkpoint is written and uploaded
    // before it leaves.
    for mut e in first {
        e.terminate().unwrap();
        assert!(e.wait_exit(Duration::from_secs(90)).unwrap().is_some());
    }
    let steps = p.checkpoint_steps(&id);
    let Some(&saved) = steps.first() else {
        panic!("no checkpoint after the drain: {:?}", p.log_messages(&id));
    };
    // The spec asks for none: the drain did (the draining rank's vote makes
    // every rank write its slice at the next step; a rank stopped later
    // writes the whole state it holds).
    assert!(saved >= 100, "{steps:?}");
    let _second = [p.executor("drain-c"), p.executor("drain-d")];
    let job = p.wait_end(&id, Duration::from_secs(240));
    let lines = p.log_messages(&id);
    assert_eq!(job.state, JobState::Succeeded, "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("resumed from the checkpoint of step {saved} "))),
        "{lines:?}"
    );
}
