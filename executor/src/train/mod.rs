//! The training runtime: one worker's loop on libtorch.
//!
//! [`run`] loads the data ([`data`]), builds the model ([`model`]) in a
//! `VarStore` on the assigned device, and trains: seeded initialisation,
//! the spec's optimizer with its learning-rate schedule and gradient
//! clipping, cross-entropy or MSE. It reports each step's loss, throughput
//! and the time split between waiting for data and computing, evaluates on
//! the held-out split, and returns the final weights. A single worker
//! (world size 1) trains the whole job; more workers need a data plane (PS
//! or ring) to combine gradients, which plugs in between backward and step.

pub mod data;
pub mod model;
pub mod rng;

use data::{DataError, Dataset};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tch::nn::{self, OptimizerConfig};
use tch::{Kind, Tensor};
use trainyard_common::spec::{JobSpecInput, Loss, ModelSpec, OptimizerKind, Schedule};

/// One step's figures: the wire type of the reports, so what the loop
/// measures is exactly what the API stores.
pub use trainyard_common::cluster::MetricPoint as StepStats;

/// What a finished training returns.
pub struct Outcome {
    /// Steps run.
    pub steps: u64,
    /// Loss of the last step.
    pub final_loss: f64,
    /// Held-out accuracy (classification).
    pub eval_accuracy: Option<f64>,
    /// Held-out loss.
    pub eval_loss: Option<f64>,
    /// The trained tensors by name.
    pub weights: Vec<(String, Tensor)>,
}

/// Why training stopped early.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The data could not be loaded or does not fit.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The model kind is not supported by this runtime yet.
    #[error("{0}")]
    Unsupported(String),
    /// libtorch failed (shapes, memory, device).
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// The loss became NaN or infinite.
    #[error(
        "the loss diverged (not finite) at step {0}; lower optimizer.lr or set optimizer.grad_clip"
    )]
    Diverged(u64),
    /// Stopped on request.
    #[error("stopped")]
    Stopped,
}

/// Evaluations during a run (plus one at the end).
pub const EVALUATIONS: u64 = 10;

/// The learning rate at `step` (1-based) of `total`.
pub fn learning_rate(spec: &JobSpecInput, step: u64, total: u64) -> f64 {
    let lr = spec.optimizer.lr;
    match spec.optimizer.schedule {
        Schedule::Constant => lr,
        Schedule::WarmupCosine { warmup_steps } => {
            if step <= warmup_steps {
                lr * step as f64 / warmup_steps.max(1) as f64
            } else {
                let span = total.saturating_sub(warmup_steps).max(1) as f64;
                let t = (step - warmup_steps) as f64 / span;
                0.5 * lr * (1.0 + (std::f64::consts::PI * t.min(1.0)).cos())
            }
        }
    }
}

/// Total steps of the job for one of `world` workers holding `train_len` samples in all.
pub fn total_steps(spec: &JobSpecInput, train_len: usize, world: u32) -> u64 {
    match (spec.steps, spec.epochs) {
        (Some(s), _) => s,
        (None, Some(e)) => {
            let per_worker = train_len.div_ceil(world.max(1) as usize);
            u64::from(e) * per_worker.div_ceil(spec.batch_size as usize).max(1) as u64
        }
        (None, None) => 1,
    }
}

fn loss_of(spec: &JobSpecInput, out: &Tensor, y: &Tensor) -> Result<Tensor, tch::TchError> {
    match spec.loss {
        Loss::CrossEntropy => {
            let classes = *out.size().last().unwrap_or(&1);
            out.f_reshape([-1, classes])?
                .f_log_softmax(-1, Kind::Float)?
                .f_nll_loss(
                    &y.f_reshape([-1])?,
                    None::<Tensor>,
                    tch::Reduction::Mean,
                    -100,
                )
        }
        Loss::Mse => {
            if out.numel() != y.numel() {
                return Err(tch::TchError::Shape(format!(
                    "output {:?} and targets {:?} differ in size",
                    out.size(),
                    y.size()
                )));
            }
            out.f_mse_loss(&y.f_reshape(out.size())?, tch::Reduction::Mean)
        }
    }
}

fn evaluate(
    spec: &JobSpecInput,
    net: &dyn model::Net,
    batch: &(Tensor, Tensor),
    device: tch::Device,
) -> (f64, Option<f64>) {
    tch::no_grad(|| {
        let (x, y) = (batch.0.to_device(device), batch.1.to_device(device));
        let Ok(out) = net.try_forward(&x, false) else {
            return (f64::NAN, None);
        };
        let Ok(loss) = loss_of(spec, &out, &y) else {
            return (f64::NAN, None);
        };
        let loss = loss.double_value(&[]);
        let acc = (spec.loss == Loss::CrossEntropy
            && !matches!(spec.model, ModelSpec::Transformer(_)))
        .then(|| {
            out.argmax(-1, false)
                .eq_tensor(&y)
                .to_kind(Kind::Float)
                .mean(Kind::Float)
                .double_value(&[])
        });
        (loss, acc)
    })
}

/// Trains `spec` as worker `rank` of `world` on `device`, calling `on_step`
/// after each step, until done or `stop` is set.
pub fn run(
    spec: &JobSpecInput,
    device: tch::Device,
    rank: u32,
    world: u32,
    stop: &AtomicBool,
    on_step: &mut dyn FnMut(&StepStats),
) -> Result<Outcome, TrainError> {
    if world != 1 {
        return Err(TrainError::Unsupported(format!(
            "{world} workers need the PS or ring data plane, which this executor does not have yet; run with workers 1"
        )));
    }
    let dataset = Dataset::load(spec)?;
    let total = total_steps(spec, dataset.train_len(), world);
    let eval = dataset.eval_batch(spec);
    let batches = dataset.into_batches(spec, rank, world, 0);

    tch::manual_seed(spec.seed as i64);
    let vs = nn::VarStore::new(device);
    let net: Box<dyn model::Net> = match &spec.model {
        ModelSpec::Torchscript(t) => {
            let path = data::local_path(&t.url).map_err(TrainError::Unsupported)?;
            Box::new(model::Script::load(&vs.root(), &path).map_err(|e| {
                TrainError::Unsupported(format!(
                    "model.url is not a loadable TorchScript module: {e}"
                ))
            })?)
        }
        other => model::build(&vs.root(), other)
            .ok_or_else(|| TrainError::Unsupported("unknown model kind".into()))?,
    };
    let o = &spec.optimizer;
    let [b1, b2] = o.betas.unwrap_or([0.9, 0.999]);
    let mut opt = match o.kind {
        OptimizerKind::Sgd => nn::Sgd {
            momentum: 0.0,
            dampening: 0.0,
            wd: o.weight_decay,
            nesterov: false,
        }
        .build(&vs, o.lr)?,
        OptimizerKind::Momentum => nn::Sgd {
            momentum: o.momentum.unwrap_or(0.9),
            dampening: 0.0,
            wd: o.weight_decay,
            nesterov: false,
        }
        .build(&vs, o.lr)?,
        OptimizerKind::Adam => nn::Adam {
            beta1: b1,
            beta2: b2,
            wd: o.weight_decay,
            eps: 1e-8,
            amsgrad: false,
        }
        .build(&vs, o.lr)?,
        OptimizerKind::Adamw => nn::AdamW {
            beta1: b1,
            beta2: b2,
            wd: o.weight_decay,
            eps: 1e-8,
            amsgrad: false,
        }
        .build(&vs, o.lr)?,
    };
    let eval_every = (total / EVALUATIONS).max(1);
    let mut last_loss = f64::NAN;
    let (mut eval_loss, mut eval_acc) = (None, None);
    for step in 1..=total {
        if stop.load(Ordering::Relaxed) {
            return Err(TrainError::Stopped);
        }
        let waited = Instant::now();
        let Ok((x, y)) = batches.recv() else {
            return Err(TrainError::Unsupported("the data loader stopped".into()));
        };
        let data_seconds = waited.elapsed().as_secs_f64();
        let computed = Instant::now();
        let n = x.size()[0];
        let (x, y) = (x.to_device(device), y.to_device(device));
        let lr = learning_rate(spec, step, total);
        opt.set_lr(lr);
        let out = net.try_forward(&x, true).map_err(|e| {
            TrainError::Unsupported(format!(
                "the model cannot take a batch of shape {:?}: {e}",
                x.size()
            ))
        })?;
        if out.size().first() != Some(&n) {
            return Err(TrainError::Unsupported(format!(
                "the model returned shape {:?} for a batch of {n}",
                out.size()
            )));
        }
        let loss = loss_of(spec, &out, &y).map_err(|e| {
            TrainError::Unsupported(format!(
                "the model's output {:?} does not fit the targets {:?}: {e}",
                out.size(),
                y.size()
            ))
        })?;
        match o.grad_clip {
            Some(c) => opt.backward_step_clip_norm(&loss, c),
            None => opt.backward_step(&loss),
        }
        last_loss = loss.double_value(&[]);
        if !last_loss.is_finite() {
            return Err(TrainError::Diverged(step));
        }
        let compute_seconds = computed.elapsed().as_secs_f64();
        let mut stats = StepStats {
            step,
            loss: last_loss,
            lr,
            samples_per_sec: n as f64 / (data_seconds + compute_seconds).max(1e-9),
            data_seconds,
            compute_seconds,
            comm_seconds: 0.0,
            eval_accuracy: None,
            eval_loss: None,
        };
        if let Some(batch) = eval
            .as_ref()
            .filter(|_| step % eval_every == 0 || step == total)
        {
            let (l, a) = evaluate(spec, net.as_ref(), batch, device);
            (eval_loss, eval_acc) = (Some(l), a);
            (stats.eval_loss, stats.eval_accuracy) = (Some(l), a);
        }
        on_step(&stats);
    }
    let mut weights: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(k, v)| (k, v.to_device(tch::Device::Cpu)))
        .collect();
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Outcome {
        steps: total,
        final_loss: last_loss,
        eval_accuracy: eval_acc,
        eval_loss,
        weights,
    })
}

#[cfg(test)]
mod tests;
