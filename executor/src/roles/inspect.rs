//! Inspection of a user's TorchScript model before the job is planned:
//! only libtorch can read the file, so the API asks an executor to list
//! its tensors — parameters, buffers and frozen parameters under their
//! `state_dict()` names, with shapes and dtypes — which the scheduler
//! shards and sizes memory from.
//!
//! With the job's spec at hand it also tries what training will do: the
//! forward takes one tensor, a batch of the job's own data goes through it
//! (evaluation mode, no gradients), and the output fits the loss and the
//! labels. A model that cannot train on that data fails the job here, in
//! `inspecting`, with a reason that names the mismatch, instead of in
//! every worker once the cluster is up.
//!
//! The model is a stranger's code, so the work is split at the sandbox
//! ([`crate::sandbox`]). This process (trusted) fetches the file, screens
//! its code for operators that touch files or processes
//! ([`super::screen`]), reads the trial batch from the dataset with the
//! executor's own decoders, and puts both into a workspace. A child
//! process, confined to that workspace, loads the module with libtorch and
//! runs the forward ([`confined`]). A crash, a memory bomb or an endless
//! forward ends the child alone, and the job is refused with the signal or
//! limit that ended it.

use crate::data::{Cursor, Dataset};
use crate::sandbox::{Sandbox, SandboxError};
use crate::storage::{Fetcher, StorageError};
use tch::Tensor;
use trainyard_common::cluster::{Inspection, InspectionResult};
use trainyard_common::spec::UncheckedJobSpec;
use trainyard_confined::protocol::{Inspect, Kind as Child, Trial};
use trainyard_sandbox::Limits;
use trainyard_shutdown::Shutdown;

/// Rows of the trial batch.
pub const TRIAL_ROWS: usize = 4;

/// How long an inspection may take before the job is refused: the
/// context's default, named here too where inspections are run.
pub use crate::context::INSPECTION_LIMIT as LIMIT;

/// Inspects the file of `ins` (through `fetcher` when it is in an object
/// store) and, when the spec came with it, tries a forward on its data,
/// the model's code confined by `sandbox` for at most `timeout`, or until
/// `cancel` is set (the child is then killed).
pub fn inspect(
    ins: &Inspection,
    fetcher: &Fetcher,
    sandbox: &Sandbox,
    timeout: std::time::Duration,
    cancel: &Shutdown,
) -> InspectionResult {
    match prepare_and_run(ins, fetcher, sandbox, timeout, cancel, true) {
        Ok(found) => found,
        Err(e) => InspectionResult::Error(e.to_string()),
    }
}

/// Why an inspection found nothing: its text is the job's reason.
#[derive(Debug, thiserror::Error)]
pub enum InspectionError {
    /// The model's file could not be fetched.
    #[error(transparent)]
    Fetch(#[from] StorageError),
    /// The URL names no file.
    #[error("{0}: no such file")]
    NoFile(String),
    /// Its code calls what a model may not.
    #[error(transparent)]
    Screened(#[from] super::screen::ScreenError),
    /// The job's data gave no trial batch.
    #[error("dataset: {0}")]
    Dataset(String),
    /// The data loader stopped before the trial batch.
    #[error("{0}")]
    Loader(String),
    /// The trial batch could not be written for the child.
    #[error("writing the trial batch: {0}")]
    Trial(#[from] tch::TchError),
    /// The sandbox refused, or its workspace could not be made.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The confined child ended without an answer.
    #[error("inspection of the model failed: {0}")]
    Child(SandboxError),
}

fn prepare_and_run(
    ins: &Inspection,
    fetcher: &Fetcher,
    sandbox: &Sandbox,
    timeout: std::time::Duration,
    cancel: &Shutdown,
    screen: bool,
) -> Result<InspectionResult, InspectionError> {
    if let Some(why) = sandbox.refusal() {
        return Err(SandboxError::Refused(why).into());
    }
    let fetched = fetcher.materialize(&ins.url)?;
    if !fetched.is_file() {
        return Err(InspectionError::NoFile(ins.url.clone()));
    }
    // Off only in the tests that show the sandbox holds without it.
    if screen {
        super::screen::refused(&fetched)?;
    }
    let ws = sandbox.workspace(&format!("inspect-{}", ins.job_id))?;
    let model = ws.input("model.pt", &fetched)?;
    drop(fetched);
    let trial = match &ins.spec {
        Some(spec) => {
            let (x, y, label_max) = trial_batch(spec, fetcher)?;
            let batch = ws.inputs().join("trial.safetensors");
            Tensor::write_safetensors(&[("x", &x), ("y", &y)], &batch)?;
            Some(Trial {
                spec: Box::new(UncheckedJobSpec::clone(spec)),
                batch,
                label_max,
            })
        }
        None => None,
    };
    let memory = ins
        .spec
        .as_ref()
        .map_or(1024, |s| s.resources.memory_mb)
        .saturating_add(crate::sandbox::RUNTIME_MB);
    let limits = Limits {
        memory_mb: memory,
        ..Limits::default()
    };
    sandbox
        .run(
            Child::Inspection,
            &ws,
            &Inspect { model, trial },
            limits,
            timeout,
            &|| cancel.is_triggered(),
        )
        .map_err(InspectionError::Child)
}

/// The first rows of the job's data, read by the executor's own decoders,
/// and the dataset's largest label.
fn trial_batch(
    spec: &UncheckedJobSpec,
    fetcher: &Fetcher,
) -> Result<(Tensor, Tensor, Option<i64>), InspectionError> {
    let data = Dataset::load(spec, fetcher).map_err(|e| InspectionError::Dataset(e.to_string()))?;
    let mut small = spec.clone();
    small.batch_size = Some(TRIAL_ROWS.min(data.train_len()).max(1) as u32);
    let batch = data
        .stream(&small, 0, 1, Cursor::default())
        .recv()
        .map_err(|_| InspectionError::Loader(data.loader_failure()))?;
    if batch.samples == 0 {
        return Err(InspectionError::Dataset(
            "the training set holds no sample".into(),
        ));
    }
    Ok((batch.x, batch.y, data.label_max()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    /// `tests/python/misfits.py`'s modules, written once per test binary.
    fn modules() -> PathBuf {
        static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        DIR.get_or_init(|| {
            let dir =
                std::env::temp_dir().join(format!("trainyard-inspect-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            crate::replica::tests::python(include_str!("../../../tests/python/misfits.py"), &dir);
            dir
        })
        .clone()
    }

    fn inspect_named(name: &str) -> InspectionResult {
        inspect_file(&modules().join(name), 1024, LIMIT, true)
    }

    fn inspect_file(
        path: &Path,
        memory_mb: u64,
        limit: Duration,
        screen: bool,
    ) -> InspectionResult {
        let url = format!("file://{}", path.display());
        let mut spec = crate::replica::tests::spec();
        spec.resources.memory_mb = memory_mb;
        if let Some(trainyard_common::spec::ModelSpec::Torchscript(t)) = &mut spec.model {
            t.url = url.clone();
        }
        let ins = Inspection {
            job_id: uuid::Uuid::nil(),
            url,
            spec: Some(Box::new(
                trainyard_common::JobSpec::parse(spec).expect("a valid spec"),
            )),
            data_policy: trainyard_common::artifact::DataPolicy::unrestricted(),
        };
        let sandbox = crate::sandbox::Sandbox::for_tests();
        let cancel = Shutdown::new();
        prepare_and_run(
            &ins,
            &Fetcher::local_only(),
            &sandbox,
            limit,
            &cancel,
            screen,
        )
        .unwrap_or_else(|e| InspectionResult::Error(e.to_string()))
    }

    fn refusal(name: &str) -> String {
        match inspect_named(name) {
            InspectionResult::Error(e) => e,
            other => panic!("{name} was accepted: {other:?}"),
        }
    }

    #[test]
    fn each_mismatch_is_refused_with_its_reason() {
        assert!(refusal("junk.pt").contains("not a loadable TorchScript module"));
        let two = refusal("two.pt");
        assert!(
            two.contains("takes 2 tensors (x, mask)")
                && two.contains("dataset.inputs")
                && two.contains("Tensor mask"),
            "{two}"
        );
        let few = refusal("few.pt");
        assert!(
            few.contains("labels go up to 9") && few.contains("at least 10"),
            "{few}"
        );
        let wide = refusal("wide.pt");
        assert!(
            wide.contains("cannot take a batch of the dataset") && wide.contains("64"),
            "{wide}"
        );
    }

    /// `two.pt` (`forward(self, x, mask)`) over an npz holding `x` and
    /// `mask`, with `dataset.inputs` as given.
    fn inspect_two(inputs: Option<&[&str]>) -> InspectionResult {
        let dir = modules();
        let data = dir.join("two-inputs.npz");
        let x = Tensor::rand([40, 64], (tch::Kind::Float, tch::Device::Cpu));
        let mask = Tensor::ones([40, 64], (tch::Kind::Int64, tch::Device::Cpu));
        let y = Tensor::arange(40, (tch::Kind::Int64, tch::Device::Cpu)).remainder(10);
        Tensor::write_npz(&[("x", &x), ("mask", &mask), ("y", &y)], &data).unwrap();
        let model = dir.join("two.pt");
        let url = format!("file://{}", model.display());
        let mut spec = crate::replica::tests::spec();
        if let Some(trainyard_common::spec::ModelSpec::Torchscript(t)) = &mut spec.model {
            t.url = url.clone();
        }
        let mut f = trainyard_common::spec::FileData::at(format!("file://{}", data.display()));
        f.inputs = inputs.map(|i| i.iter().map(|s| s.to_string()).collect());
        spec.dataset = Some(trainyard_common::spec::DatasetSpec::File(f));
        let ins = Inspection {
            job_id: uuid::Uuid::nil(),
            url,
            spec: Some(Box::new(
                trainyard_common::JobSpec::parse(spec).expect("a valid spec"),
            )),
            data_policy: trainyard_common::artifact::DataPolicy::unrestricted(),
        };
        prepare_and_run(
            &ins,
            &Fetcher::local_only(),
            &crate::sandbox::Sandbox::for_tests(),
            LIMIT,
            &Shutdown::new(),
            true,
        )
        .unwrap_or_else(|e| InspectionResult::Error(e.to_string()))
    }

    #[test]
    fn a_forward_of_two_tensors_takes_the_inputs_named_for_its_arguments() {
        assert!(
            matches!(
                inspect_two(Some(&["x", "mask"])),
                InspectionResult::Parameters(_)
            ),
            "{:?}",
            inspect_two(Some(&["x", "mask"]))
        );
        let swapped = refused(inspect_two(Some(&["mask", "x"])));
        assert!(
            swapped.contains("dataset.inputs names [mask, x]")
                && swapped.contains("takes (x, mask)"),
            "{swapped}"
        );
        let none = refused(inspect_two(None));
        assert!(
            none.contains("name the array or column for each in dataset.inputs"),
            "{none}"
        );
    }

    #[test]
    fn a_good_module_lists_parameters_then_buffers() {
        let InspectionResult::Parameters(p) = inspect_named("good.pt") else {
            panic!("refused");
        };
        let names: Vec<&str> = p.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "bn.bias",
                "bn.weight",
                "fc.bias",
                "fc.weight",
                "bn.num_batches_tracked",
                "bn.running_mean",
                "bn.running_var"
            ]
        );
        assert_eq!(p[4].dtype, "int64");
    }

    /// `tests/python/attacks.py`'s modules, aimed at a secret of this test
    /// binary's (standing for the join token and other users' data), at
    /// `/etc/passwd`, and at a victim file to overwrite.
    struct Attacks {
        dir: PathBuf,
        secret: &'static str,
        victim: PathBuf,
    }

    fn attacks() -> &'static Attacks {
        static A: std::sync::OnceLock<Attacks> = std::sync::OnceLock::new();
        A.get_or_init(|| {
            let dir =
                std::env::temp_dir().join(format!("trainyard-attacks-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let secret = "join-token-7f3a9c1e-not-for-models";
            let secret_file = dir.join("token");
            std::fs::write(&secret_file, secret).unwrap();
            let victim = dir.join("victim");
            std::fs::write(&victim, "the host's own bytes").unwrap();
            std::fs::write(
                dir.join("targets.json"),
                serde_json::json!({
                    "read": [secret_file, "/etc/passwd"],
                    "write": victim,
                })
                .to_string(),
            )
            .unwrap();
            crate::replica::tests::python(include_str!("../../../tests/python/attacks.py"), &dir);
            Attacks {
                dir,
                secret,
                victim,
            }
        })
    }

    fn refused(r: InspectionResult) -> String {
        match r {
            InspectionResult::Error(e) => e,
            other => panic!("accepted: {other:?}"),
        }
    }

    #[test]
    fn operators_that_touch_files_are_refused_at_the_screen() {
        let a = attacks();
        for name in ["read-0.pt", "read-1.pt", "read-eval.pt", "write.pt"] {
            let why = refused(inspect_file(&a.dir.join(name), 1024, LIMIT, true));
            assert!(
                why.contains("aten::from_file") && why.contains("`forward`"),
                "{name}: {why}"
            );
        }
    }

    #[test]
    fn the_sandbox_stops_a_read_and_a_write_the_screen_let_through() {
        let a = attacks();
        // read-eval.pt reads the secret in the trial's own forward.
        let why = refused(inspect_file(
            &a.dir.join("read-eval.pt"),
            1024,
            LIMIT,
            false,
        ));
        assert!(why.contains("cannot take a batch"), "{why}");
        assert!(!why.contains(a.secret), "the secret leaked: {why}");
        let why = refused(inspect_file(&a.dir.join("write.pt"), 1024, LIMIT, false));
        assert!(why.contains("cannot take a batch"), "{why}");
        assert_eq!(
            std::fs::read_to_string(&a.victim).unwrap(),
            "the host's own bytes"
        );
    }

    #[test]
    fn a_memory_bomb_ends_its_inspection_with_the_limit_named() {
        let why = refused(inspect_file(
            &attacks().dir.join("hog.pt"),
            256,
            LIMIT,
            true,
        ));
        assert!(
            why.contains("exceeded its 1280 MiB memory") && why.contains("256 MiB asked"),
            "{why}"
        );
    }

    #[test]
    fn an_endless_forward_is_killed_at_the_limit() {
        let started = std::time::Instant::now();
        let why = refused(inspect_file(
            &attacks().dir.join("spin.pt"),
            1024,
            Duration::from_secs(8),
            true,
        ));
        assert!(why.contains("did not finish within 8 s"), "{why}");
        assert!(started.elapsed() < Duration::from_secs(60));
    }

    #[test]
    fn broken_archives_fail_their_inspection_alone() {
        for name in ["truncated.pt", "fuzzed.pt"] {
            let why = refused(inspect_file(&attacks().dir.join(name), 1024, LIMIT, true));
            assert!(
                why.contains("not a loadable TorchScript module")
                    || why.contains("TorchScript archive")
                    || why.contains("inspection of the model failed"),
                "{name}: {why}"
            );
        }
        // And this process, which stands for the executor, goes on.
        assert!(matches!(
            inspect_named("good.pt"),
            InspectionResult::Parameters(_)
        ));
    }
}
