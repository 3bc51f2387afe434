//! One forward and backward of a model, shared by the executor's
//! built-in models (in the executor's process) and a user's TorchScript
//! module (in its confined process, [`crate::serve`]), so that a step is
//! one code path wherever it runs: the loss, the gradient flattened after
//! the trainable parameters, and rank 0's buffers riding with it.

use tch::{Kind, Tensor};
use trainyard_common::spec::{Loss, UncheckedJobSpec};

/// Why a step failed.
#[derive(Debug)]
pub enum StepError {
    /// The model does not fit the batch, its output or the loss.
    Model(String),
    /// libtorch failed (shapes, memory, device).
    Torch(tch::TchError),
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepError::Model(m) => f.write_str(m),
            StepError::Torch(e) => write!(f, "libtorch: {e}"),
        }
    }
}

impl std::error::Error for StepError {}

impl From<tch::TchError> for StepError {
    fn from(e: tch::TchError) -> StepError {
        StepError::Torch(e)
    }
}

/// The job's loss of the model's output `out` against the targets `y`.
pub fn loss_of(spec: &UncheckedJobSpec, out: &Tensor, y: &Tensor) -> Result<Tensor, tch::TchError> {
    match spec.loss() {
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

/// What one forward and backward needs: the executor's replica and a
/// user's module in its own process ([`crate::serve`]) take a step alike.
pub struct Core<'a> {
    /// The job's spec (its loss).
    pub spec: &'a UncheckedJobSpec,
    /// The model.
    pub net: &'a dyn crate::model::Net,
    /// Its tensors.
    pub tensors: &'a crate::tensors::ModelTensors,
    /// The flat vector (the trainable parameters are views of it).
    pub weights: &'a Tensor,
    /// Trainable elements: the flat vector's first ones.
    pub trainable: usize,
    /// All flat elements (trainable, then buffers).
    pub numel: usize,
    /// Where the model computes.
    pub device: tch::Device,
}

impl Core<'_> {
    /// Forward and backward on `samples` rows `x`, `y`: the loss summed
    /// over them, and into `grad` (kept across steps) the gradient summed
    /// over them, flat, followed by the buffers when `state` (rank 0's
    /// ride with the gradient) or zeros.
    pub fn forward_backward(
        &self,
        x: &Tensor,
        y: &Tensor,
        samples: usize,
        state: bool,
        grad: &mut Tensor,
    ) -> Result<f64, StepError> {
        let (n, p) = (self.numel, self.trainable);
        let mut loss_sum = 0.0;
        let mut parts: Vec<Tensor> = Vec::new();
        if samples > 0 {
            let (x, y) = (x.to_device(self.device), y.to_device(self.device));
            for (_, v) in &self.tensors.trainable {
                let mut g = v.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            let out = self.net.try_forward(&x, true).map_err(|e| {
                StepError::Model(format!(
                    "the model cannot take a batch of shape {:?}: {}",
                    x.size(),
                    crate::tensors::first_line(&e.to_string())
                ))
            })?;
            if out.size().first() != Some(&(samples as i64)) {
                return Err(StepError::Model(format!(
                    "the model returned shape {:?} for a batch of {}",
                    out.size(),
                    samples
                )));
            }
            let loss = loss_of(self.spec, &out, &y).map_err(|e| {
                StepError::Model(format!(
                    "the model's output {:?} does not fit the targets {:?}: {}",
                    out.size(),
                    y.size(),
                    crate::tensors::first_line(&e.to_string())
                ))
            })?;
            // Sums over ranks of (mean loss × samples) give the global mean.
            (&loss * samples as f64).f_backward()?;
            loss_sum = loss.f_double_value(&[])? * samples as f64;
            // The forward in training mode moved the buffers (BatchNorm's
            // running statistics): the flat vector follows.
            self.buffers_to_flat();
            parts.extend(self.tensors.trainable.iter().map(|(_, v)| {
                let g = v.grad();
                if g.defined() {
                    g.reshape([-1])
                } else {
                    Tensor::zeros([v.numel() as i64], (Kind::Float, self.device))
                }
            }));
        } else {
            parts.push(Tensor::zeros([p as i64], (Kind::Float, self.device)));
        }
        if n > p {
            // Rank 0's buffers ride with the gradient (the others add
            // zeros), so every replica leaves the step with rank 0's
            // buffers, as PyTorch DDP broadcasts them before each forward.
            parts.push(if state {
                self.weights.narrow(0, p as i64, (n - p) as i64)
            } else {
                Tensor::zeros([(n - p) as i64], (Kind::Float, self.device))
            });
        }
        if !grad.defined() || grad.numel() != n {
            *grad = Tensor::empty([n as i64], (Kind::Float, self.device));
        }
        let _ = Tensor::f_cat_out(grad, &parts, 0)?;
        Ok(loss_sum)
    }

    /// Copies the model's buffers into the flat vector (after a training
    /// forward changed them).
    pub fn buffers_to_flat(&self) {
        if self.numel > self.trainable {
            let values = self.tensors.read_buffers(self.device);
            tch::no_grad(|| {
                self.weights
                    .narrow(0, self.trainable as i64, values.numel() as i64)
                    .copy_(&values)
            });
        }
    }

    /// Copies the flat vector's buffer part into the model's buffers
    /// (after anything wrote the flat vector).
    pub fn buffers_from_flat(&self) {
        if self.numel > self.trainable {
            let tail = self.weights.narrow(
                0,
                self.trainable as i64,
                (self.numel - self.trainable) as i64,
            );
            self.tensors.write_buffers(&tail);
        }
    }
}

/// Holds libtorch's process-wide generator while it is seeded and drawn
/// from: two replicas built at once (two roles of one executor, tests in
/// one process) would otherwise draw each other's numbers, and ranks that
/// must start equal would not.
pub fn seeded_rng() -> std::sync::MutexGuard<'static, ()> {
    static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}
