//! The confined half of a model's inspection: the executor (trusted)
//! fetched the file, screened its operators and wrote a trial batch of the
//! job's data into the workspace; here, confined, libtorch loads the
//! module, lists its tensors, checks its forward's signature and tries it
//! on the batch against the job's loss.

use crate::protocol::Inspect;
use crate::tensors::{first_line, ModelTensors};
use crate::torchscript::{Module, Schema};
use tch::{Kind, Tensor};
use trainyard_common::cluster::InspectionResult;
use trainyard_common::spec::{DatasetSpec, Loss, UncheckedJobSpec};

/// The child's side, confined: loads the module, lists its tensors, checks
/// its forward and tries it on the trial batch.
pub fn confined(task: Inspect) -> InspectionResult {
    match std::panic::catch_unwind(|| examine(&task)) {
        Ok(Ok(found)) => InspectionResult::Parameters(found.infos()),
        Ok(Err(reason)) => InspectionResult::Error(reason),
        Err(_) => InspectionResult::Error("libtorch crashed while reading the model".into()),
    }
}

fn examine(task: &Inspect) -> Result<ModelTensors, String> {
    let module = Module::load(&task.model, tch::Device::Cpu).map_err(|e| {
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
    let named = task.trial.as_ref().and_then(|t| match t.spec.dataset() {
        DatasetSpec::File(f) => f.inputs.clone(),
        _ => None,
    });
    let inputs = forward_inputs(&schema, named.as_deref(), task.trial.is_some())?;
    if !schema.returns_tensor {
        return Err(format!(
            "the module's forward must return one tensor; it is `{}`",
            schema.text
        ));
    }
    if let Some(t) = &task.trial {
        let batch = Tensor::read_safetensors(&t.batch)
            .map_err(|e| format!("reading the trial batch: {e}"))?;
        let get = |name: &str| {
            batch
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.shallow_clone())
                .ok_or_else(|| format!("the trial batch has no {name}"))
        };
        trial(
            &module,
            &t.spec,
            &get("x")?,
            &get("y")?,
            t.label_max,
            inputs,
        )?;
    }
    Ok(found)
}

/// The tensors the forward takes, checked against `dataset.inputs` (the
/// names, in order) when the job names several, or against one batch
/// tensor when it names none; without a job (`known` false) any number of
/// tensor arguments is accepted.
fn forward_inputs(schema: &Schema, named: Option<&[String]>, known: bool) -> Result<usize, String> {
    if schema.args != schema.tensor_args || schema.args == 0 {
        return Err(format!(
            "the module's forward must take tensors only (a batch, or the inputs dataset.inputs names); it is `{}`",
            schema.text
        ));
    }
    match named {
        Some(names) if names != schema.names.as_slice() => Err(format!(
            "dataset.inputs names [{}] but the module's forward takes ({}): give the forward's arguments, in order (`{}`)",
            names.join(", "),
            schema.names.join(", "),
            schema.text
        )),
        None if known && schema.args != 1 => Err(format!(
            "the module's forward takes {} tensors ({}); name the array or column for each in dataset.inputs, in that order (`{}`)",
            schema.args,
            schema.names.join(", "),
            schema.text
        )),
        _ => Ok(schema.args),
    }
}

/// A forward on the first rows of the job's data, checked against the
/// loss and the targets.
fn trial(
    module: &Module,
    spec: &UncheckedJobSpec,
    x: &Tensor,
    y: &Tensor,
    label_max: Option<i64>,
    inputs: usize,
) -> Result<(), String> {
    module
        .set_train(false)
        .map_err(|e| first_line(&e.to_string()))?;
    let out = tch::no_grad(|| module.forward_packed(x, inputs)).map_err(|e| {
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
    match spec.loss() {
        Loss::CrossEntropy => {
            let classes = *out.size().last().unwrap_or(&0);
            let labels = label_max.unwrap_or(0);
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
    crate::core::loss_of(spec, &out.to_kind(Kind::Float), y)
        .map(drop)
        .map_err(|e| {
            format!(
                "the loss cannot be computed on the model's output: {}",
                first_line(&e.to_string())
            )
        })?;
    Ok(())
}
