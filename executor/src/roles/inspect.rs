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

use crate::replica::data::{Cursor, Dataset};
use crate::replica::script::Module;
use crate::replica::tensors::{first_line, ModelTensors};
use crate::storage::Fetcher;
use tch::Kind;
use trainyard_common::cluster::{Inspection, InspectionResult};
use trainyard_common::spec::{JobSpecInput, Loss};

/// Rows of the trial batch.
pub const TRIAL_ROWS: usize = 4;

/// How long an inspection may take before the job is refused.
pub const LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Inspects the file of `ins` (through `fetcher` when it is in an object
/// store) and, when the spec came with it, tries a forward on its data.
pub fn inspect(ins: &Inspection, fetcher: &Fetcher) -> InspectionResult {
    match std::panic::catch_unwind(|| examine(ins, fetcher)) {
        Ok(Ok(found)) => InspectionResult::Parameters(found.infos()),
        Ok(Err(reason)) => InspectionResult::Error(reason),
        Err(_) => InspectionResult::Error("libtorch crashed while reading the model".into()),
    }
}

fn examine(ins: &Inspection, fetcher: &Fetcher) -> Result<ModelTensors, String> {
    let path = fetcher.materialize(&ins.url).map_err(|e| e.to_string())?;
    if !path.is_file() {
        return Err(format!("{}: no such file", ins.url));
    }
    let module = Module::load(&path, tch::Device::Cpu).map_err(|e| {
        format!(
            "model.url is not a loadable TorchScript module: {}",
            first_line(&e.to_string())
        )
    })?;
    let found = ModelTensors::of_script(&module)?;
    if found.trainable.is_empty() {
        return Err("the TorchScript module has no trainable parameters".into());
    }
    let schema = module.schema().map_err(|e| {
        format!(
            "the module has no forward method: {}",
            first_line(&e.to_string())
        )
    })?;
    if schema.args != 1 || schema.tensor_args != 1 {
        return Err(format!(
            "the module's forward must take one tensor (a batch); it is `{}`",
            schema.text
        ));
    }
    if !schema.returns_tensor {
        return Err(format!(
            "the module's forward must return one tensor; it is `{}`",
            schema.text
        ));
    }
    if let Some(spec) = &ins.spec {
        trial(&module, spec, fetcher)?;
    }
    Ok(found)
}

/// A forward on the first rows of the job's data, checked against the
/// loss and the targets.
fn trial(module: &Module, spec: &JobSpecInput, fetcher: &Fetcher) -> Result<(), String> {
    let data = Dataset::load(spec, fetcher).map_err(|e| format!("dataset: {e}"))?;
    let mut small = spec.clone();
    small.batch_size = TRIAL_ROWS.min(data.train_len()).max(1) as u32;
    let batch = data
        .stream(&small, 0, 1, Cursor::default())
        .recv()
        .map_err(|_| "dataset: no batch could be read".to_owned())?;
    let (x, y) = (batch.x, batch.y);
    module
        .set_train(false)
        .map_err(|e| first_line(&e.to_string()))?;
    let out = tch::no_grad(|| module.forward(&x)).map_err(|e| {
        format!(
            "the model cannot take a batch of the dataset (shape {:?}, {:?}): {}",
            x.size(),
            x.kind(),
            first_line(&e.to_string())
        )
    })?;
    let rows = x.size()[0];
    if out.size().first() != Some(&rows) {
        return Err(format!(
            "the model returned shape {:?} for a batch of {rows}: the first dimension must be the batch",
            out.size()
        ));
    }
    match spec.loss {
        Loss::CrossEntropy => {
            let classes = *out.size().last().unwrap_or(&0);
            let labels = data.label_max().unwrap_or(0);
            if out.dim() < 2 || classes <= labels {
                return Err(format!(
                    "the model's output {:?} does not fit the dataset's classes: labels go up to {labels}, so cross_entropy needs at least {} scores per sample in the last dimension",
                    out.size(),
                    labels + 1
                ));
            }
            if !out.is_floating_point() {
                return Err(format!(
                    "the model's output is {:?}; cross_entropy needs floating-point scores",
                    out.kind()
                ));
            }
        }
        Loss::Mse => {
            if out.numel() != y.numel() {
                return Err(format!(
                    "the model's output {:?} does not match the targets {:?} (mse compares them element by element)",
                    out.size(),
                    y.size()
                ));
            }
        }
    }
    crate::replica::loss_of(spec, &out.to_kind(Kind::Float), &y)
        .map(drop)
        .map_err(|e| {
            format!(
                "the loss cannot be computed on the model's output: {}",
                first_line(&e.to_string())
            )
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

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
        let url = format!("file://{}", modules().join(name).display());
        let mut spec = crate::replica::tests::spec();
        if let trainyard_common::spec::ModelSpec::Torchscript(t) = &mut spec.model {
            t.url = url.clone();
        }
        let ins = Inspection {
            job_id: uuid::Uuid::nil(),
            url,
            spec: Some(Box::new(spec)),
            data_policy: trainyard_common::artifact::DataPolicy::unrestricted(),
        };
        inspect(&ins, &Fetcher::local_only())
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
            two.contains("must take one tensor") && two.contains("Tensor mask"),
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
}
