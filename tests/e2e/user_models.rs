//! Users' own models, trained faithfully: TorchScript modules written by
//! Python's torch at test time (`tests/python/user_models.py`) — a
//! BatchNorm + Dropout CNN, an embedding + LayerNorm + attention block, a
//! GRU, a model with a frozen layer and tied weights, a model with an
//! int64 and a float buffer — each trained on a ring of 1 and of 2 and by
//! two PS shards with two workers in sync and async mode, downloaded in
//! both formats and evaluated *by PyTorch, in eval mode*, on digits no job
//! ever saw, against the same recipe trained by plain PyTorch in the same
//! run. Also: a one-rank job ends with the same weights and buffers as
//! plain PyTorch in the executor's data order, and a checkpoint of a
//! BatchNorm model evaluates in PyTorch as the job did at that step and
//! resumes a job that ends where the uninterrupted one ended, and a job
//! one of whose ranks' model process is SIGKILLed mid-run tries again and
//! ends there too.
//!
//! The data: `user_models.py write` splits digits into `train.npz` (1297
//! rows, the jobs' dataset, of which each job holds out 5 % for its own
//! evaluation) and `test.npz` (500 rows no job is given). The reference
//! trains on the job's own training split (the executor's seeded split,
//! ported to Python) in the executor's order, with the global batch of
//! the job: 32 samples a step, as one worker of 32, two ring ranks or two
//! sync PS workers of 16, or async PS workers of 32 each (each push one
//! step of 32); it also trains in the orders of two more seeds, and each
//! cell is held to the mean of the three. All references train in one
//! Python process while the 20 jobs train on one platform of six
//! executors (about a minute on two cores).

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use trainyard_common::JobState;
use trainyard_e2e::{eventually, repo_root, Platform, Proc};

/// The models of the matrix, as `user_models.py` names them.
const MODELS: [&str; 5] = ["bn_cnn", "attention", "recurrent", "frozen_tied", "counted"];

/// Rows of `train.npz` (digits less the 500 test rows).
const TRAIN_ROWS: u64 = 1297;

/// How far (in accuracy points) a platform-trained model may be from
/// PyTorch's own training of the same recipe (see [`Pattern::misses`]).
const POINTS: f64 = 1.5;

/// Reference runs per model: the recipe in the job's data order and in
/// the orders of the next seeds; the platform is held to their mean.
const REFERENCE_ORDERS: u64 = 3;

/// The venv's Python (`TRAINYARD_PYTHON`, else `python3` on PATH, the
/// venv's in `scripts/test`).
fn python() -> Command {
    let mut cmd =
        Command::new(std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into()));
    cmd.arg(repo_root().join("tests/python/user_models.py"));
    cmd
}

/// Runs a `user_models.py` command to its end; its JSON answer.
fn py(args: &[&Path]) -> Value {
    trainyard_e2e::async_matrix::user_models(args)
}

/// Starts a `user_models.py` command in the background (see [`py_wait`]).
fn py_spawn(args: &[&Path]) -> Child {
    let mut cmd = python();
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("python3 with torch (run through scripts/test): {e}"))
}

/// The JSON answer of a command started by [`py_spawn`].
fn py_wait(child: Child, what: &str) -> Value {
    parse(child.wait_with_output(), &[Path::new(what)])
}

fn parse(out: std::io::Result<std::process::Output>, args: &[&Path]) -> Value {
    let out = out.unwrap_or_else(|e| panic!("python3 with torch (run through scripts/test): {e}"));
    assert!(
        out.status.success(),
        "user_models.py {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "user_models.py {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A recipe: what the job spec says and what the PyTorch reference does.
#[derive(Debug, Clone, Copy)]
struct Recipe {
    seed: u64,
    eval_fraction: f64,
    /// Samples per step, all workers together.
    batch: u32,
    epochs: u32,
    optimizer: &'static str,
    lr: f64,
    /// Models trained at a rate of their own (and by PyTorch at the same).
    lr_of: &'static [(&'static str, f64)],
    /// A cosine decay to 0 (`warmup_cosine` with no warm-up), else constant.
    cosine: bool,
}

impl Recipe {
    /// The recipe of `model`: its own learning rate, if it has one.
    fn of(&self, model: &str) -> Recipe {
        let mut r = *self;
        if let Some(&(_, lr)) = self.lr_of.iter().find(|(m, _)| *m == model) {
            r.lr = lr;
        }
        r
    }

    /// As `user_models.py` reads it, for `models`; a reference trains in
    /// the job's data order and those of the next seeds, `orders` in all.
    fn json(&self, models: &[&str], orders: u64) -> Value {
        json!({
            "lr_by_model": self.lr_of.iter().map(|&(m, lr)| (m, lr)).collect::<BTreeMap<_, _>>(),
            "seed": self.seed,
            "orders": (self.seed..self.seed + orders).collect::<Vec<_>>(),
            "eval_fraction": self.eval_fraction,
            "batch": self.batch,
            "epochs": self.epochs,
            "optimizer": {"kind": self.optimizer, "lr": self.lr},
            "schedule": if self.cosine { "cosine" } else { "constant" },
            "models": models,
        })
    }

    /// The spec's `optimizer`.
    fn optimizer(&self) -> Value {
        let mut o = json!({"kind": self.optimizer, "lr": self.lr});
        if self.cosine {
            o["schedule"] = json!({"kind": "warmup_cosine", "warmup_steps": 0});
        }
        o
    }

    /// Samples the job trains on (`train.npz` less its held-out share).
    fn train_len(&self) -> u64 {
        TRAIN_ROWS - (TRAIN_ROWS as f64 * self.eval_fraction).round() as u64
    }

    /// Global steps of the whole job.
    fn steps(&self) -> u64 {
        u64::from(self.epochs) * self.train_len().div_ceil(u64::from(self.batch))
    }
}

/// How a job is trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pattern {
    PsSync,
    PsAsync,
    Ring2,
    Ring1,
}

impl Pattern {
    /// Submission order: the jobs that need two executors first.
    const ALL: [Pattern; 4] = [
        Pattern::PsSync,
        Pattern::PsAsync,
        Pattern::Ring2,
        Pattern::Ring1,
    ];

    fn name(self) -> &'static str {
        match self {
            Pattern::Ring1 => "ring×1",
            Pattern::Ring2 => "ring×2",
            Pattern::PsSync => "PS sync",
            Pattern::PsAsync => "PS async",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Pattern::Ring1 => "ring1",
            Pattern::Ring2 => "ring2",
            Pattern::PsSync => "ps-sync",
            Pattern::PsAsync => "ps-async",
        }
    }

    fn workers(self) -> u32 {
        match self {
            Pattern::Ring1 => 1,
            _ => 2,
        }
    }

    /// Workers whose batches make one step together (an async push is a
    /// step of its own).
    fn per_step(self) -> u32 {
        match self {
            Pattern::PsAsync => 1,
            p => p.workers(),
        }
    }

    /// Whether a model `gap` points from PyTorch's own training (positive:
    /// better) misses it: every pattern must land within [`POINTS`] either
    /// way. (Async PS applies each push as it comes, 2-3 versions stale, so
    /// its cells wander most: the recipe's rates are ones where PyTorch
    /// itself has plateaued, so that staleness neither costs nor buys more
    /// than that.)
    fn misses(self, gap: f64) -> bool {
        gap.abs() > POINTS
    }

    /// Whether every global step is one of rank 0's forwards, whose
    /// buffers every replica takes, so that BatchNorm's
    /// `num_batches_tracked` ends at the job's global steps (async workers
    /// walk their own steps; rank 0's buffers count its own).
    fn buffers_count_every_step(self) -> bool {
        self != Pattern::PsAsync
    }
}

/// The `file://` URL of `path`.
fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// A job of TorchScript `model` on `data` trained by `pattern` on `recipe`.
fn spec(name: &str, model: &Path, data: &Path, recipe: &Recipe, pattern: Pattern) -> Value {
    let w = pattern.workers();
    let mut spec = json!({
        "name": name,
        "model": {"kind": "torchscript", "url": file_url(model)},
        "dataset": {"kind": "file", "url": file_url(data)},
        "loss": "cross_entropy",
        "optimizer": recipe.optimizer(),
        "batch_size": recipe.batch / pattern.per_step(),
        "epochs": recipe.epochs,
        "eval_fraction": recipe.eval_fraction,
        "seed": recipe.seed,
        "strategy": "allreduce",
        "workers": {"min": w, "max": w},
        // Small: several jobs share an executor's RAM (a worker each, and
        // PS shards beside them).
        "resources": {"memory_mb": 256},
    });
    if matches!(pattern, Pattern::PsSync | Pattern::PsAsync) {
        spec["strategy"] = json!("parameter_server");
        spec["parameter_servers"] = json!(2);
        spec["consistency"] = json!(if pattern == Pattern::PsSync {
            "sync"
        } else {
            "async"
        });
    }
    spec
}

/// The models and data `user_models.py write` made in `dir`.
struct Files {
    dir: PathBuf,
    train: PathBuf,
}

impl Files {
    fn write(p: &Platform) -> Files {
        let dir = p.file("user-models");
        std::fs::create_dir_all(&dir).unwrap();
        let written = py(&[Path::new("write"), &dir]);
        assert_eq!(written["train"], TRAIN_ROWS, "{written}");
        Files {
            train: dir.join("train.npz"),
            dir,
        }
    }

    fn model(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pt"))
    }

    /// Writes `value` as `name` in the folder; its path.
    fn json(&self, name: &str, value: &Value) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, value.to_string()).unwrap();
        path
    }
}

/// Downloads job `id`'s final model in `format` to `path` through
/// `GET /v1/jobs/{id}/model?format=...`.
fn download(p: &Platform, id: &str, format: &str, path: &Path) -> Result<(), String> {
    let r = p.get_response(&format!("/v1/jobs/{id}/model?format={format}"));
    let status = r.status();
    let bytes = r
        .bytes()
        .map_err(|e| format!("reading the {format} model: {e}"))?;
    if status != 200 {
        return Err(format!(
            "GET model?format={format}: {status} {}",
            String::from_utf8_lossy(&bytes)
        ));
    }
    std::fs::write(path, &bytes).unwrap();
    Ok(())
}

/// Accuracy in points.
fn points(v: &Value) -> Option<f64> {
    v["accuracy"].as_f64().map(|a| a * 100.0)
}

/// Waits for job `id`; `Err` with its state and reason unless it succeeded.
fn succeeded(p: &Platform, id: &str, limit: Duration) -> Result<(), String> {
    let job = p.wait_end(id, limit);
    if job.state == JobState::Succeeded {
        return Ok(());
    }
    let errors: Vec<String> = p
        .logs(id)
        .into_iter()
        .filter(|l| l.level == "error")
        .map(|l| l.message)
        .collect();
    Err(format!("{}: {} ({errors:?})", job.state, job.state_reason))
}

#[test]
fn five_user_models_train_in_every_pattern_as_well_as_in_pytorch() {
    let started = Instant::now();
    let p = Platform::builder("user-models").start();
    let files = Files::write(&p);
    let recipe = Recipe {
        seed: 7,
        eval_fraction: 0.05,
        batch: 32,
        epochs: 30,
        optimizer: "adam",
        lr: 0.003,
        // Measured against the 2-3 versions of staleness of async pushes:
        // the GRU learns slowest and is still climbing at 0.003, where
        // staleness cost it a point (at 0.008 PyTorch reaches 97.7 and async
        // 97.8-99.0); the attention block is the most sensitive to stale
        // steps: at 0.003 async lost 0.2-1.5 points (mean 0.7 in 11 runs), at
        // 0.002 it scored 93.2 and 94.0 against PyTorch's 93.3.
        lr_of: &[("recurrent", 0.008), ("attention", 0.002)],
        cosine: true,
    };
    // PyTorch's own runs (one process) train while the platform does.
    let r = files.json("recipe.json", &recipe.json(&MODELS, REFERENCE_ORDERS));
    let reference = py_spawn(&[Path::new("reference"), &files.dir, &r]);
    let _execs: Vec<Proc> = (0..6).map(|i| p.executor(&format!("user-{i}"))).collect();

    let mut jobs = Vec::new();
    for pattern in Pattern::ALL {
        for model in MODELS {
            let name = format!("{model}-{}", pattern.slug());
            let s = spec(
                &name,
                &files.model(model),
                &files.train,
                &recipe.of(model),
                pattern,
            );
            jobs.push((model, pattern, name, p.submit(&s)));
        }
    }
    let mut failures = Vec::new();
    let mut cells = Vec::new();
    for (model, pattern, name, id) in &jobs {
        if let Err(e) = succeeded(&p, id, Duration::from_secs(900)) {
            failures.push(format!("{model} {}: the job {e}", pattern.name()));
            continue;
        }
        let pt = files.dir.join(format!("{name}.result.pt"));
        let st = files.dir.join(format!("{name}.result.safetensors"));
        match download(&p, id, "torchscript", &pt)
            .and_then(|()| download(&p, id, "safetensors", &st))
        {
            Ok(()) => {
                cells.push(json!({"cell": name, "model": model, "pt": pt, "safetensors": st}))
            }
            Err(e) => failures.push(format!("{model} {}: {e}", pattern.name())),
        }
    }
    let trained = started.elapsed();
    // How stale the async pushes were (versions behind, over all workers):
    // what async SGD costs against PyTorch's synchronous steps.
    let staleness: Vec<String> = jobs
        .iter()
        .filter(|(_, pattern, _, _)| *pattern == Pattern::PsAsync)
        .map(|(model, _, _, id)| {
            format!("{model} {:?}", p.metrics(id, Some(1)).staleness_histogram)
        })
        .collect();
    let cells_file = files.json("cells.json", &Value::Array(cells));
    let evaluated = py(&[Path::new("evaluate"), &files.dir, &cells_file]);
    let reference = py_wait(reference, "reference");

    // The table: PyTorch's accuracy, then each pattern's through both files.
    let mut table = format!(
        "{:<12} {:>22} | {}\n",
        "model",
        "PyTorch (mean; orders)",
        Pattern::ALL
            .iter()
            .rev()
            .map(|p| format!("{:>17}", p.name()))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut worst: BTreeMap<&str, f64> = BTreeMap::new();
    for model in MODELS {
        let runs: Vec<f64> = reference[model]["runs"]
            .as_array()
            .unwrap_or_else(|| panic!("no reference for {model}: {reference}"))
            .iter()
            .filter_map(points)
            .collect();
        let pytorch = runs.iter().sum::<f64>() / runs.len() as f64;
        if pytorch < 90.0 {
            failures.push(format!(
                "{model}: PyTorch's own training reaches only {pytorch:.1} % ({runs:?}): the recipe is too weak to compare with"
            ));
        }
        let mut row = format!(
            "{model:<12} {pytorch:>6.1} ({})",
            runs.iter()
                .map(|a| format!("{a:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        row = format!("{row:<35} |");
        for pattern in Pattern::ALL.iter().rev() {
            let name = format!("{model}-{}", pattern.slug());
            let cell = &evaluated[&name];
            if cell.is_null() {
                row.push_str(&format!(" {:>17}", "—"));
                continue;
            }
            for problem in cell["problems"].as_array().into_iter().flatten() {
                failures.push(format!(
                    "{model} {}: {}",
                    pattern.name(),
                    problem.as_str().unwrap_or("?")
                ));
            }
            let (pt, st) = (points(&cell["torchscript"]), points(&cell["safetensors"]));
            row.push_str(&format!(
                " {:>8} /{:>7}",
                pt.map_or("?".into(), |a| format!("{a:.1}")),
                st.map_or("?".into(), |a| format!("{a:.1}"))
            ));
            for (file, acc) in [("model.pt", pt), ("model.safetensors", st)] {
                let Some(acc) = acc else { continue };
                let off = (acc - pytorch).abs();
                let w = worst.entry(pattern.name()).or_default();
                *w = w.max(off);
                if pattern.misses(acc - pytorch) {
                    failures.push(format!(
                        "{model} {}: {file} scores {acc:.1} % in PyTorch (eval mode), PyTorch's own training {pytorch:.1} % ({runs:?})",
                        pattern.name()
                    ));
                }
            }
            failures.extend(buffer_counts(model, *pattern, &recipe, &cell["buffers"]));
        }
        table.push_str(&row);
        table.push('\n');
    }
    println!(
        "user models on {} test rows (model.pt / model.safetensors, % in PyTorch eval mode):\n{table}largest distance from PyTorch by pattern (points): {worst:?}\nPS async pushes by versions behind: {staleness:?}\nthe matrix took {:.0} s to train ({} jobs), {:.0} s in all",
        500,
        trained.as_secs_f64(),
        jobs.len(),
        started.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        let kept = keep(&files.dir);
        panic!(
            "{}\n{table}the models, data and results are kept in {}",
            failures.join("\n"),
            kept.display()
        );
    }
}

/// Copies `dir` out of the platform's folder (which goes with the
/// platform) for a post-mortem; where it went.
fn keep(dir: &Path) -> PathBuf {
    let to = std::env::temp_dir().join(format!("trainyard-user-models-{}", std::process::id()));
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let _ = std::fs::copy(entry.path(), to.join(entry.file_name()));
    }
    to
}

/// What the integer buffers must count after a job. BatchNorm's
/// `num_batches_tracked` counts one per global step where every replica
/// takes rank 0's buffers each step (ring, sync PS); the counted model's
/// `seen` counts every training row each epoch on one worker. An async PS
/// job's buffers are rank 0's, which walks half the steps and pulls while
/// it computes, so a pull often misses its own last push (measured: half
/// of rank 0's steps count): at least an eighth of the job's steps (and
/// samples), not a count that stopped early or was reset.
fn buffer_counts(model: &str, pattern: Pattern, recipe: &Recipe, buffers: &Value) -> Vec<String> {
    let epoch_rows = u64::from(recipe.epochs) * recipe.train_len();
    let mut want: Vec<(String, u64, bool)> = Vec::new();
    if model == "bn_cnn" {
        for bn in ["bn1", "bn2"] {
            let k = format!("{bn}.num_batches_tracked");
            if pattern.buffers_count_every_step() {
                want.push((k, recipe.steps(), true));
            } else {
                want.push((k, recipe.steps() / 8, false));
            }
        }
    }
    if model == "counted" {
        match pattern {
            Pattern::Ring1 => want.push(("seen".to_owned(), epoch_rows, true)),
            Pattern::PsAsync => want.push(("seen".to_owned(), epoch_rows / 8, false)),
            _ => {}
        }
    }
    want.into_iter()
        .filter(|(k, n, exact)| {
            let got = buffers[k].as_u64();
            if *exact {
                got != Some(*n)
            } else {
                got.is_none_or(|g| g < *n)
            }
        })
        .map(|(k, n, exact)| {
            format!(
                "{model} {}: the int64 buffer {k} is {}, {}{n}",
                pattern.name(),
                buffers[&k],
                if exact { "not " } else { "less than " }
            )
        })
        .collect()
}

/// The tensors of a `compare`/`exact` answer further than `tolerance`
/// (relative, by norm) from the reference, named.
fn differing(answer: &Value, tolerance: f64) -> Vec<String> {
    answer["relative"]
        .as_object()
        .unwrap_or_else(|| panic!("no relative differences in {answer}"))
        .iter()
        .filter(|(_, d)| d.as_f64().is_none_or(|d| d > tolerance))
        .map(|(k, d)| format!("{k}: {d}"))
        .collect()
}

#[test]
fn a_one_rank_job_ends_with_plain_pytorchs_weights_and_buffers() {
    let p = Platform::builder("user-exact").start();
    let files = Files::write(&p);
    let _exec = p.executor("exact");
    // BatchNorm on, no dropout: plain SGD in the executor's data order.
    let recipe = Recipe {
        seed: 11,
        eval_fraction: 0.05,
        batch: 32,
        epochs: 3,
        optimizer: "sgd",
        lr: 0.05,
        lr_of: &[],
        cosine: false,
    };
    let id = p.submit(&spec(
        "exact",
        &files.model("bn_cnn_exact"),
        &files.train,
        &recipe,
        Pattern::Ring1,
    ));
    let got = files.dir.join("exact.safetensors");
    succeeded(&p, &id, Duration::from_secs(300))
        .and_then(|()| download(&p, &id, "safetensors", &got))
        .unwrap_or_else(|e| panic!("the exactness job: {e}"));
    let r = files.json("recipe.json", &recipe.json(&["bn_cnn_exact"], 1));
    let answer = py(&[Path::new("exact"), &files.dir, &r, &got]);
    println!(
        "one rank vs PyTorch, relative differences: {}",
        answer["relative"]
    );
    assert_eq!(answer["problems"], json!([]), "{answer}");
    let far = differing(&answer, 1e-5);
    assert!(far.is_empty(), "further than 1e-5 from PyTorch: {far:?}");
    assert_eq!(answer["num_batches_tracked"], recipe.steps(), "{answer}");
}

/// The checkpoint the resume test reads and resumes from: an evaluation
/// step (every `steps / 10`) and a checkpoint step (every 26).
const RESUME_AT: u64 = 78;

#[test]
fn a_batchnorm_checkpoint_evaluates_as_the_job_did_and_resumes_to_the_same_end() {
    // Slowed a little (20 ms a step), so that the crash below lands mid-run.
    let p = Platform::builder("user-resume")
        .executor_env("TRAINYARD_SLOW_WORKER", "*:20")
        .start();
    let files = Files::write(&p);
    let execs: Vec<Proc> = (0..2).map(|i| p.executor(&format!("resume-{i}"))).collect();
    // A ring of two (each rank writes its slice of the checkpoint), a
    // fifth of the rows held out for the job's own evaluation, no dropout:
    // the run is a function of its data order, so a resumed job must end
    // exactly where the uninterrupted one did.
    let recipe = Recipe {
        seed: 13,
        eval_fraction: 0.2,
        batch: 32,
        epochs: 4,
        optimizer: "adam",
        lr: 0.005,
        lr_of: &[],
        cosine: false,
    };
    assert_eq!(recipe.steps(), 132);
    assert_eq!(RESUME_AT % (recipe.steps() / 10), 0, "an evaluation step");
    let mut first = spec(
        "bn-checkpointed",
        &files.model("bn_cnn_exact"),
        &files.train,
        &recipe,
        Pattern::Ring2,
    );
    first["checkpoint"] = json!({"every_steps": 26, "keep": 10});
    let a = p.submit(&first);
    succeeded(&p, &a, Duration::from_secs(300)).unwrap_or_else(|e| panic!("the first job {e}"));

    // What the job said at the checkpoint's step, and what the checkpoint
    // says in PyTorch.
    let said = p
        .metrics(&a, Some(10_000))
        .points
        .into_iter()
        .find(|m| u64::try_from(m.step) == Ok(RESUME_AT))
        .unwrap_or_else(|| panic!("no metric point at step {RESUME_AT}"));
    let (Some(job_acc), Some(job_loss)) = (said.eval_accuracy, said.eval_loss) else {
        panic!("the job did not evaluate at step {RESUME_AT}: {said:?}");
    };
    // Shards are uploaded in the background: the API may commit the
    // checkpoint after the job has ended.
    let ckpt = eventually(Duration::from_secs(60), || {
        p.checkpoints(&a)
            .checkpoints
            .into_iter()
            .find(|c| c.step == RESUME_AT)
    })
    .unwrap_or_else(|| {
        panic!(
            "no checkpoint of step {RESUME_AT}: {:?}",
            p.checkpoint_steps(&a)
        )
    });
    let manifest = PathBuf::from(
        ckpt.manifest_url
            .strip_prefix("file://")
            .unwrap_or_else(|| panic!("a local manifest: {}", ckpt.manifest_url)),
    );
    let r = files.json("recipe.json", &recipe.json(&["bn_cnn_exact"], 1));
    let got = py(&[Path::new("checkpoint"), &files.dir, &r, &manifest]);
    println!(
        "checkpoint of step {RESUME_AT} in PyTorch (eval mode): {got}; the job said accuracy {job_acc}, loss {job_loss}"
    );
    assert_eq!(got["problems"], json!([]), "{got}");
    let n = got["samples"].as_f64().unwrap();
    assert_eq!(n, 259.0, "{got}");
    let acc = got["accuracy"].as_f64().unwrap();
    assert!(
        (acc - job_acc).abs() < 0.5 / n,
        "PyTorch scores the checkpoint {acc}, the job said {job_acc} at step {RESUME_AT}"
    );
    let loss = got["loss"].as_f64().unwrap();
    assert!(
        (loss - job_loss).abs() <= 1e-4 * job_loss.abs().max(1e-3),
        "PyTorch's held-out loss of the checkpoint {loss}, the job's {job_loss}"
    );
    for bn in ["bn1", "bn2"] {
        assert_eq!(
            got["buffers"][format!("{bn}.num_batches_tracked")],
            RESUME_AT,
            "BatchNorm counted every step up to the checkpoint: {got}"
        );
    }

    // A job resumed from that checkpoint ends where the first one ended:
    // weights, running statistics and counts.
    let mut second = first.clone();
    second["name"] = json!("bn-resumed");
    second["resume_from"] = json!({"job_id": a, "step": RESUME_AT});
    let b = p.submit(&second);
    succeeded(&p, &b, Duration::from_secs(300)).unwrap_or_else(|e| panic!("the resumed job {e}"));
    let first_step = p.metrics(&b, None).points.first().map(|m| m.step);
    assert_eq!(first_step, i64::try_from(RESUME_AT + 1).ok());
    let (fa, fb) = (
        files.dir.join("a.safetensors"),
        files.dir.join("b.safetensors"),
    );
    download(&p, &a, "safetensors", &fa).unwrap();
    download(&p, &b, "safetensors", &fb).unwrap();
    let cmp = py(&[Path::new("compare"), &fb, &fa]);
    println!(
        "resumed vs uninterrupted, relative differences: {}",
        cmp["relative"]
    );
    let far = differing(&cmp, 1e-5);
    assert!(far.is_empty(), "the resumed job ended elsewhere: {far:?}");
    for bn in ["bn1", "bn2"] {
        assert_eq!(
            cmp["buffers"][format!("{bn}.num_batches_tracked")],
            recipe.steps(),
            "{cmp}"
        );
    }
    assert_eq!(p.result_accuracy(&b), p.result_accuracy(&a));

    // The same job again, with one rank's model process SIGKILLed once
    // mid-run (a host's OOM killer, a flaky device): its role reports a
    // crash, the job tries again (a `crash` event), the crashed rank takes
    // its peer's state, and the job ends where the uninterrupted one did.
    let pids: Vec<u32> = execs.iter().map(Proc::pid).collect();
    let before = trainyard_e2e::sandboxed_children(&pids, "model");
    let mut third = first.clone();
    third["name"] = json!("bn-crashed");
    let c = p.submit(&third);
    p.wait_steps(&c, 40, Duration::from_secs(120));
    let victim = trainyard_e2e::sandboxed_children(&pids, "model")
        .into_iter()
        .find(|pid| !before.contains(pid))
        .unwrap_or_else(|| panic!("no model process of job {c}"));
    trainyard_e2e::kill9(victim);
    succeeded(&p, &c, Duration::from_secs(300)).unwrap_or_else(|e| {
        let lines: Vec<String> = p.logs(&c).into_iter().map(|l| format!("{l:?}")).collect();
        panic!("the crashed job {e}; its log:\n{}", lines.join("\n"))
    });
    let crashes: Vec<_> = p
        .events(&c)
        .into_iter()
        .filter(|e| e.kind == trainyard_common::EventKind::Crash)
        .collect();
    assert_eq!(crashes.len(), 1, "{crashes:?}");
    assert!(crashes[0].reason.contains("SIGKILL"), "{:?}", crashes[0]);
    assert!(
        matches!(crashes[0].typed(), Ok(trainyard_common::EventData::Crash(ref x)) if x.attempt == 1),
        "{:?}",
        crashes[0]
    );
    let fc = files.dir.join("c.safetensors");
    download(&p, &c, "safetensors", &fc).unwrap();
    let cmp = py(&[Path::new("compare"), &fc, &fa]);
    println!(
        "crashed once vs uninterrupted, relative differences: {}",
        cmp["relative"]
    );
    let far = differing(&cmp, 1e-5);
    assert!(far.is_empty(), "the crashed job ended elsewhere: {far:?}");
}
