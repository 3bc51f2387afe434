//! A user's module trains in a confined process of its own: the hostile
//! modules of `tests/python/attacks.py`, each built into a replica and
//! stepped the way a ring or PS worker steps it, with no screen in front
//! (the screen is the inspection's). Each refusal is shown beside a
//! control: the same module in an unconfined child does what it set out
//! to, so the refusal is the sandbox's.

use super::process::{Host, STOP_GRACE};
use super::*;
use crate::sandbox::{Mode, Sandbox};
use crate::storage::Fetcher;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use trainyard_shutdown::Shutdown;

/// The attack modules, written once per test binary into a folder of
/// their own, aimed at a secret and a victim file in another.
struct Attacks {
    dir: PathBuf,
    secret: PathBuf,
    victim: PathBuf,
}

fn attacks() -> &'static Attacks {
    static A: std::sync::OnceLock<Attacks> = std::sync::OnceLock::new();
    A.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("trainyard-confined-{}", std::process::id()));
        let (dir, host) = (root.join("models"), root.join("host"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&host).unwrap();
        let secret = host.join("join-token");
        std::fs::write(&secret, "trainyard-join-token-0123456789ab").unwrap();
        let victim = host.join("victim");
        std::fs::write(&victim, "untouched by any model").unwrap();
        std::fs::write(
            dir.join("targets.json"),
            json!({"read": [secret], "write": victim}).to_string(),
        )
        .unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/attacks.py");
        let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
        let run = std::process::Command::new(python)
            .arg(&script)
            .arg(&dir)
            .output()
            .expect("python3 with torch");
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        Attacks {
            dir,
            secret,
            victim,
        }
    })
}

fn spec_of(model: &str, memory_mb: u64) -> UncheckedJobSpec {
    let digits = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/digits.npz");
    let s: trainyard_common::JobSpec = serde_json::from_value(json!({
        "name": "attack",
        "model": {"kind": "torchscript",
                  "url": format!("file://{}", attacks().dir.join(model).display())},
        "dataset": {"kind": "file", "url": format!("file://{}", digits.display())},
        "loss": "cross_entropy", "optimizer": {"kind": "sgd", "lr": 0.1},
        "batch_size": 32, "steps": 4, "seed": 1,
        "resources": {"memory_mb": memory_mb}
    }))
    .unwrap();
    s.into()
}

fn host(mode: Mode, timeout: Duration) -> Host {
    Host {
        sandbox: Arc::new(Sandbox::for_tests_in(mode)),
        timeout,
        stop: Shutdown::new(),
        grace: STOP_GRACE,
    }
}

fn replica_of(model: &str, host: &Host) -> Result<Replica, TrainError> {
    Replica::new(
        &spec_of(model, 512),
        tch::Device::Cpu,
        &Fetcher::local_only(),
        host,
    )
}

fn one_step(r: &mut Replica) -> Result<(), TrainError> {
    let b = r.batches(0, 1, r.cursor).recv().unwrap();
    let (loss, g) = r.forward_backward(&b)?;
    let n = b.samples as f32;
    r.apply_summed(g, n, loss / f64::from(n), 0.1, b.next)
}

fn leak(r: &Replica) -> Vec<u8> {
    let w = r.weights();
    let t = &w.iter().find(|(k, _)| k == "leak").unwrap().1;
    let mut out = vec![0u8; 32];
    t.copy_data_u8(&mut out, 32);
    out
}

#[test]
fn a_module_reads_no_host_file_while_it_trains() {
    let a = attacks();
    let secret = std::fs::read(&a.secret).unwrap();
    // Control: unconfined, the module copies the secret into its buffer.
    let mut open = replica_of("read-0.pt", &host(Mode::Off, Duration::from_secs(120))).unwrap();
    one_step(&mut open).unwrap();
    assert_eq!(leak(&open), secret[..32]);
    // Confined, the read fails and fails the step; nothing leaks.
    let mut r = replica_of("read-0.pt", &host(Mode::On, Duration::from_secs(120))).unwrap();
    let e = one_step(&mut r).unwrap_err().to_string();
    assert!(e.contains("Permission denied"), "{e}");
    assert!(leak(&r).iter().all(|b| *b == 0));
}

#[test]
fn a_module_writes_no_host_file_while_it_trains() {
    let a = attacks();
    let before = std::fs::read(&a.victim).unwrap();
    let mut r = replica_of("write.pt", &host(Mode::On, Duration::from_secs(120))).unwrap();
    assert!(one_step(&mut r).is_err());
    assert_eq!(std::fs::read(&a.victim).unwrap(), before);
}

#[test]
fn a_memory_bomb_ends_its_replica_with_the_limit_named() {
    let h = host(Mode::On, Duration::from_secs(120));
    let spec = spec_of("hog.pt", 256);
    let mut r = Replica::new(&spec, tch::Device::Cpu, &Fetcher::local_only(), &h).unwrap();
    let e = one_step(&mut r).unwrap_err().to_string();
    assert!(e.contains("memory"), "{e}");
    // Every later call says the same, and this process goes on.
    let again = one_step(&mut r).unwrap_err().to_string();
    assert_eq!(again, e);
}

#[test]
fn a_module_that_spins_is_killed_at_its_deadline_or_its_stop() {
    let mut r = replica_of("spin.pt", &host(Mode::On, Duration::from_secs(3))).unwrap();
    let started = Instant::now();
    let e = one_step(&mut r).unwrap_err().to_string();
    assert!(e.contains("did not answer within 3 s"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(60));

    let mut h = host(Mode::On, Duration::from_secs(600));
    h.grace = Duration::from_millis(500);
    let mut r = replica_of("spin.pt", &h).unwrap();
    let stop = Shutdown::new();
    r.watch(stop.clone());
    let flag = stop.clone();
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        flag.trigger();
    });
    let e = one_step(&mut r).unwrap_err().to_string();
    setter.join().unwrap();
    assert!(e.contains("its role was stopped"), "{e}");
    // Such a replica is not handed to the next generation.
    assert!(!r.usable());
    assert!(replica_of("good-for-fuzz.pt", &h).unwrap().usable());
}

#[test]
fn a_broken_archive_fails_its_replica_not_the_executor() {
    let h = host(Mode::On, Duration::from_secs(120));
    for model in ["truncated.pt", "fuzzed.pt"] {
        let e = replica_of(model, &h).err().expect("refused").to_string();
        assert!(
            e.contains("TorchScript") || e.contains("model process"),
            "{model}: {e}"
        );
    }
}

/// A replica of the module that counts its own steps in a buffer.
fn counting_replica() -> Replica {
    Replica::new(
        &super::tests::spec(),
        tch::Device::Cpu,
        &Fetcher::local_only(),
        &Host::for_tests(),
    )
    .unwrap()
}

/// The steps the module counted, as the executor sees its buffer.
fn steps_counted(r: &Replica) -> i64 {
    let w = r.weights();
    w.iter()
        .find(|(k, _)| k == "steps")
        .unwrap()
        .1
        .int64_value(&[])
}

#[test]
fn the_module_runs_in_another_process_than_the_executor() {
    // The buffer module counts its own steps: a counter that only the
    // child's module moves, seen here through the shared flat vector.
    let mut r = counting_replica();
    for _ in 0..3 {
        one_step(&mut r).unwrap();
    }
    assert_eq!(steps_counted(&r), 3);
    assert!(r.process.is_some());
}

/// A survivor's replica is started by one generation's role thread and
/// trained by the next one's: its model process must outlive the thread
/// that forked it (a thread's death signal would kill it).
#[test]
fn a_model_process_outlives_the_thread_that_started_it() {
    let mut r = std::thread::spawn(|| {
        let mut r = counting_replica();
        one_step(&mut r).unwrap();
        r
    })
    .join()
    .unwrap();
    // Time for a death signal to land, were one set.
    std::thread::sleep(Duration::from_millis(300));
    assert!(r.usable());
    for _ in 0..2 {
        one_step(&mut r).expect("the handed-on replica trains on");
    }
    assert_eq!(steps_counted(&r), 3);
}

#[test]
fn a_diverged_loss_from_the_model_process_is_named_as_one() {
    // NaN has no JSON: the loss crosses the pipe as its bits.
    let h = host(Mode::On, Duration::from_secs(120));
    let mut r = replica_of("good-for-fuzz.pt", &h).unwrap();
    let e = (0..10)
        .find_map(|_| {
            let b = r.batches(0, 1, r.cursor).recv().unwrap();
            let (loss, g) = r.forward_backward(&b).unwrap();
            let n = b.samples as f32;
            r.apply_summed(g, n, loss / f64::from(n), 1e38, b.next)
                .err()
        })
        .expect("the loss diverges")
        .to_string();
    assert!(e.contains("diverged"), "{e}");
}

#[test]
fn a_model_process_ends_with_its_executor() {
    // A stand-in executor (a shell) starts the model process, gives it its
    // task, keeps its stdin open and dies: the child must not outlive it.
    let sandbox = Sandbox::for_tests();
    let ws = sandbox.workspace("orphan").unwrap();
    let load = super::process::Load {
        model: attacks().dir.join("good-for-fuzz.pt"),
        scratch: ws.scratch(),
        cuda: None,
        spec: spec_of("good-for-fuzz.pt", 512),
    };
    let envelope = trainyard_confined::protocol::Envelope {
        confinement: None,
        torch_threads: Some(1),
        // The shell's pid, put in by the shell ($$).
        parent: Some(4_294_967_295),
        task: load,
    };
    let line = serde_json::to_string(&envelope).unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"(printf '%s\n' "$(printf '%s' "$TASK" | sed "s/4294967295/$$/")"; sleep 30) 2>/dev/null | "$EXE" model >/dev/null 2>&1 & echo $!"#)
        .env("TASK", line)
        .env("EXE", sandbox.program())
        .output()
        .unwrap();
    let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
    };
    let started = Instant::now();
    // Its stdin stays open for 30 s: only the watch ends it sooner.
    while alive() && started.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!alive(), "the model process {pid} outlived its executor");
}
