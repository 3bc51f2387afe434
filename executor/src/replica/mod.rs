//! One data-parallel replica on libtorch, and nothing about how replicas
//! talk to each other.
//!
//! A [`Replica`] holds what a worker trains: the data ([`crate::data`]), the model
//! ([`model`]; a user's TorchScript module through [`torchscript`]) on its
//! device, a flat vector of its trainable parameters (the model's
//! parameters are views of it) followed by its buffers ([`tensors`]), the
//! optimizer state over the parameters ([`optim`]), the global step and
//! the data cursor. It computes a
//! gradient on a batch ([`Replica::forward_backward`]), applies a summed
//! gradient ([`Replica::apply_summed`]), evaluates on the held-out set,
//! and exports, imports, snapshots and restores its state. [`progress`] is
//! what every training loop shares: the learning-rate schedule, the
//! evaluation cadence, the step figures and the progress line.
//!
//! The patterns are built on it: [`crate::ring`] sums the gradients of
//! several replicas around a ring, [`crate::ps`] pushes them to parameter
//! servers and pulls the weights back.

#[cfg(test)]
mod confined;
pub mod optim;
pub mod process;
pub mod progress;
#[cfg(test)]
pub(crate) mod tests;

use crate::data::{Batch, Cursor, DataError, Dataset};
use crate::storage::checkpoint::Loaded;
use crate::storage::{Fetcher, StorageError};
use optim::FlatOptimizer;
use sha2::{Digest, Sha256};
use tch::nn;
use tch::Tensor;
use trainyard_common::spec::{ModelSpec, UncheckedJobSpec};
// The model, its tensors and a step are the confined crate's: a user's
// module takes its steps there, in its own process, and a built-in model
// here, through the same code.
pub use trainyard_confined::core::{loss_of, seeded_rng, Core};
pub use trainyard_confined::{model, shm, tensors, torchscript};

pub use progress::StepStats;

impl From<trainyard_confined::core::StepError> for TrainError {
    fn from(e: trainyard_confined::core::StepError) -> TrainError {
        match e {
            trainyard_confined::core::StepError::Model(m) => TrainError::Model(m),
            trainyard_confined::core::StepError::Torch(e) => TrainError::Torch(e),
        }
    }
}

/// What a finished training returns.
pub struct Outcome {
    /// Steps run.
    pub steps: u64,
    /// Loss of the last step.
    pub final_loss: Option<f64>,
    /// Held-out accuracy (classification).
    pub eval_accuracy: Option<f64>,
    /// Held-out loss.
    pub eval_loss: Option<f64>,
    /// The trained tensors by their `state_dict()` names and dtypes.
    pub weights: Vec<(String, Tensor)>,
    /// SHA-256 of the weights (names and bytes): equal on every replica.
    pub weights_sha256: String,
}

/// Why a replica cannot train.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The data could not be loaded or does not fit.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The model cannot be built, or does not fit the data or the loss.
    #[error("{0}")]
    Model(String),
    /// The process running the user's module died (a signal, a resource
    /// limit, no answer in time): reported as a crash, which the job
    /// retries a bounded number of times.
    #[error("{0}")]
    Crashed(String),
    /// A state handed to this replica (a peer's, a checkpoint's) is not
    /// this model's.
    #[error("{0}")]
    State(String),
    /// The model file could not be fetched.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// libtorch failed (shapes, memory, device).
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// The loss became NaN or infinite (at this step): reported as a
    /// divergence, which fails the job whatever its `divergence.action`.
    #[error(
        "the loss diverged: it is not finite at step {0}; lower optimizer.lr or set optimizer.grad_clip"
    )]
    Diverged(u64),
}

/// A data-parallel replica: model, flat weights, optimizer state, progress.
pub struct Replica {
    spec: UncheckedJobSpec,
    device: tch::Device,
    dataset: Dataset,
    eval: Option<(Tensor, Tensor)>,
    _vs: nn::VarStore,
    net: Box<dyn model::Net>,
    tensors: tensors::ModelTensors,
    /// Trainable elements: the flat vector's first ones.
    trainable: usize,
    /// All flat elements (trainable, then buffers).
    numel: usize,
    weights: Tensor,
    /// Created on the first update (a PS worker never needs one).
    opt: Option<FlatOptimizer>,
    grad: Tensor,
    /// Global steps completed.
    pub step: u64,
    /// Where the next step starts in the data.
    pub cursor: Cursor,
    /// The loss of the last step this replica (or the one it took its
    /// state from) ran; `None` before any.
    last_loss: Option<f64>,
    eval_loss: Option<f64>,
    eval_accuracy: Option<f64>,
    /// Gradients carry the buffers (rank 0), not zeros.
    carries_state: bool,
    /// Samples and the id hash consumed so far in the cursor's epoch.
    account: (u64, u64),
    /// Where in its step the role that trains this replica is (what its
    /// executor's heartbeat reports).
    pub progress: crate::signals::StepProgress,
    /// A user's module's process (its mapping backs `weights` and `grad`,
    /// so it is dropped last).
    process: Option<process::Process>,
}

/// Words of metadata at the end of an exported state: step, optimizer
/// steps, epoch, offset, the last loss (f64 bits) and the epoch's
/// accounting (samples, id hash), two words each.
const META_WORDS: usize = 14;

fn u64_words(v: u64) -> [f32; 2] {
    [f32::from_bits(v as u32), f32::from_bits((v >> 32) as u32)]
}

fn words_u64(w: &[f32]) -> u64 {
    u64::from(w[0].to_bits()) | (u64::from(w[1].to_bits()) << 32)
}

impl Replica {
    /// Loads the data and builds the model of `spec` on `device` with the
    /// job's seeded initialisation; files at object-store URLs come
    /// through `fetcher`.
    pub fn new(
        spec: &UncheckedJobSpec,
        device: tch::Device,
        fetcher: &Fetcher,
        host: &process::Host,
    ) -> Result<Replica, TrainError> {
        let dataset = Dataset::load(spec, fetcher)?;
        let eval = dataset.eval_batch(spec);
        let _seeded = seeded_rng();
        tch::manual_seed(spec.seed as i64);
        let vs = nn::VarStore::new(device);
        // A user's module lives in a confined process of its own; the
        // executor's side of the replica is on the CPU over shared memory.
        let (net, tensors, weights, grad, process, device): (Box<dyn model::Net>, _, _, _, _, _) =
            match &spec.model() {
                ModelSpec::Torchscript(t) => {
                    let path = fetcher.materialize(&t.url)?;
                    let s = process::Conversation::start(host, &path, spec, device)?;
                    let net = Box::new(process::Remote(s.process.clone()));
                    (
                        net,
                        s.tensors,
                        Some(s.weights),
                        s.grad,
                        Some(s.process),
                        tch::Device::Cpu,
                    )
                }
                other => {
                    let net = model::build(&vs.root(), other)
                        .ok_or_else(|| TrainError::Model("unknown model kind".into()))?;
                    let tensors = tensors::ModelTensors::of_varstore(&vs);
                    (net, tensors, None, Tensor::new(), None, device)
                }
            };
        if tensors.trainable.is_empty() {
            return Err(TrainError::Model(
                "the model has no trainable parameters".into(),
            ));
        }
        let trainable = tensors.trainable_len();
        let numel = trainable + tensors.buffer_len();
        let weights = weights.unwrap_or_else(|| {
            tch::no_grad(|| {
                let mut parts: Vec<Tensor> = tensors
                    .trainable
                    .iter()
                    .map(|(_, t)| t.detach().reshape([-1]))
                    .collect();
                parts.push(tensors.read_buffers(device));
                Tensor::cat(&parts, 0)
            })
        });
        let mut replica = Replica {
            opt: None,
            spec: spec.clone(),
            device,
            dataset,
            eval,
            _vs: vs,
            net,
            tensors,
            trainable,
            numel,
            weights,
            grad,
            step: 0,
            cursor: Cursor::default(),
            last_loss: None,
            eval_loss: None,
            eval_accuracy: None,
            carries_state: true,
            account: (0, 0),
            progress: Default::default(),
            process,
        };
        replica.bind();
        // The module's process wrote its buffers into the flat vector.
        replica.buffers_from_flat();
        Ok(replica)
    }

    /// Whether the replica can still train: false once its module's
    /// process was killed (a stop, a deadline, a limit) or ended.
    pub fn usable(&self) -> bool {
        self.process
            .as_ref()
            .is_none_or(|p| process::lock(p).alive())
    }

    /// Follows `stop`, the stop signal of the role now training the replica:
    /// a user's module still busy [`process::STOP_GRACE`] after it is set
    /// is killed.
    pub fn watch(&mut self, stop: trainyard_shutdown::Shutdown) {
        if let Some(p) = &self.process {
            process::lock(p).watch(stop);
        }
    }

    /// Elements of the flat vector the patterns sum, shard and checkpoint:
    /// the trainable parameters, then the buffers (each element an f32;
    /// see [`Replica::layout`]).
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// The trainable parameters' elements: the first `trainable_len()` of
    /// the flat vector. The rest are buffers, which no optimizer changes:
    /// a summed "gradient" carries rank 0's buffers there (the others send
    /// zeros), and they are taken as they are.
    pub fn trainable_len(&self) -> usize {
        self.trainable
    }

    /// Whether this replica's gradients carry its buffers (rank 0) or
    /// zeros in their place (every other rank); a lone replica carries them.
    pub fn set_carries_state(&mut self, carries: bool) {
        self.carries_state = carries;
    }

    /// Takes up the place `cursor` in the data as a worker of `world` that
    /// walked there from the start (an async or bounded worker resuming
    /// its rank's share): its step count is the steps that walk took, so
    /// that the learning-rate schedule and a `steps` job's end go on from
    /// there.
    pub fn resume_at(&mut self, cursor: Cursor, world: u32) {
        let (len, b) = (self.dataset.train_len(), self.spec.batch_size() as usize);
        self.cursor = cursor;
        self.step = crate::data::steps_before(len, b, world, cursor);
        self.account = (0, 0);
    }

    /// Whether the job's steps or epochs are done.
    pub fn finished(&self) -> bool {
        match (self.spec.steps, self.spec.epochs) {
            (Some(s), _) => self.step >= s,
            (None, Some(e)) => self.cursor.epoch >= u64::from(e),
            (None, None) => self.step >= 1,
        }
    }

    /// Total global steps of the job if the remaining ones run on `world`
    /// workers (the learning-rate schedule and progress follow it).
    pub fn total_steps(&self, world: u32) -> u64 {
        match (self.spec.steps, self.spec.epochs) {
            (Some(s), _) => s,
            (None, Some(e)) => {
                let (len, b) = (self.dataset.train_len(), self.spec.batch_size() as usize);
                let e = u64::from(e);
                if self.cursor.epoch >= e {
                    return self.step;
                }
                self.step
                    + crate::data::steps_left_in_epoch(len, b, world, self.cursor.offset)
                    + (e - self.cursor.epoch - 1)
                        * crate::data::steps_left_in_epoch(len, b, world, 0)
            }
            (None, None) => 1,
        }
    }

    /// A copy of the flat vector's buffer part (BatchNorm's running
    /// statistics), taken before a step whose exchange may fail: a forward
    /// in training mode moves the buffers before the ring has summed
    /// anything, and [`Replica::restore_buffers`] puts them back, so that a
    /// broken ring leaves the replica at its last completed step, buffers
    /// included. `None` for a model without buffers.
    pub fn save_buffers(&self) -> Option<Tensor> {
        let (n, p) = (self.numel, self.trainable);
        (n > p).then(|| tch::no_grad(|| self.weights.narrow(0, p as i64, (n - p) as i64).copy()))
    }

    /// Puts back the buffers [`Replica::save_buffers`] copied (the model's
    /// own, or its process's through the shared vector, which it reads
    /// before each step).
    pub fn restore_buffers(&mut self, saved: &Tensor) {
        let (n, p) = (self.numel, self.trainable);
        tch::no_grad(|| {
            self.weights
                .narrow(0, p as i64, (n - p) as i64)
                .copy_(saved)
        });
        self.buffers_from_flat();
    }

    /// Length of [`Replica::export`]: the flat vector, the optimizer state
    /// over the trainable part, the metadata.
    pub fn state_len(&self) -> usize {
        self.numel
            + self.trainable * FlatOptimizer::state_tensors(self.spec.optimizer().kind)
            + META_WORDS
    }

    fn optimizer(&mut self) -> &mut FlatOptimizer {
        let (spec, n, device) = (&self.spec.optimizer(), self.trainable as i64, self.device);
        self.opt
            .get_or_insert_with(|| FlatOptimizer::new(spec, n, device))
    }

    /// Weights, optimizer state, step and cursor as one flat buffer.
    pub fn export(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.state_len()];
        let (n, p) = (self.numel, self.trainable);
        let cpu = |t: &Tensor, dst: &mut [f32]| {
            let len = dst.len();
            t.to_device(tch::Device::Cpu).copy_data(dst, len)
        };
        cpu(&self.weights, &mut out[..n]);
        if let Some(opt) = &self.opt {
            for (i, t) in opt.state().iter().enumerate() {
                cpu(t, &mut out[n + i * p..n + (i + 1) * p]);
            }
        }
        let meta = &mut out[self.state_len() - META_WORDS..];
        let t = self.opt.as_ref().map_or(0, |o| o.t);
        // The last step's loss travels too: a replica that joins after the
        // last step reports the job's final loss, not "unknown".
        for (i, v) in [
            self.step,
            t,
            self.cursor.epoch,
            self.cursor.offset,
            // NaN stands for "none" in the flat state only.
            self.last_loss.unwrap_or(f64::NAN).to_bits(),
            self.account.0,
            self.account.1,
        ]
        .into_iter()
        .enumerate()
        {
            meta[i * 2..i * 2 + 2].copy_from_slice(&u64_words(v));
        }
        out
    }

    /// Takes over a state [`Replica::export`] produced.
    pub fn import(&mut self, state: &[f32]) -> Result<(), TrainError> {
        if state.len() != self.state_len() {
            return Err(TrainError::State(format!(
                "a peer sent a state of {} values, this replica has {}",
                state.len(),
                self.state_len()
            )));
        }
        let (n, p) = (self.numel, self.trainable);
        let device = self.device;
        let load = |t: &mut Tensor, src: &[f32]| {
            tch::no_grad(|| t.copy_(&Tensor::from_slice(src).to_device(device)))
        };
        load(&mut self.weights, &state[..n]);
        self.buffers_from_flat();
        let opt = self.optimizer();
        for (i, t) in opt.state_mut().iter_mut().enumerate() {
            load(t, &state[n + i * p..n + (i + 1) * p]);
        }
        let meta = &state[state.len() - META_WORDS..];
        opt.t = words_u64(&meta[2..4]);
        self.step = words_u64(&meta[0..2]);
        self.cursor = Cursor {
            epoch: words_u64(&meta[4..6]),
            offset: words_u64(&meta[6..8]),
        };
        self.last_loss = Some(f64::from_bits(words_u64(&meta[8..10]))).filter(|l| !l.is_nan());
        self.account = (words_u64(&meta[10..12]), words_u64(&meta[12..14]));
        Ok(())
    }

    /// Flat elements `[start, end)` of the weights and of each optimizer
    /// state tensor (zeros before the first update), on the CPU.
    pub fn snapshot(&self, start: usize, end: usize) -> Vec<Vec<f32>> {
        let len = end - start;
        let mut out = vec![self.read_range(start, len)];
        let states = FlatOptimizer::state_tensors(self.spec.optimizer().kind);
        for i in 0..states {
            // Over the buffers the optimizer keeps nothing: zeros.
            let mut v = vec![0f32; len];
            let held = end.min(self.trainable).saturating_sub(start);
            if let Some(t) = self.opt.as_ref().and_then(|o| o.state().get(i)) {
                if held > 0 {
                    t.narrow(0, start as i64, held as i64)
                        .to_device(tch::Device::Cpu)
                        .copy_data(&mut v[..held], held);
                }
            }
            out.push(v);
        }
        out
    }

    /// The optimizer's update count.
    pub fn optimizer_t(&self) -> u64 {
        self.opt.as_ref().map_or(0, |o| o.t)
    }

    /// Takes over a whole checkpoint: weights, the optimizer state when it
    /// was kept for this optimizer, the step and the data cursor.
    pub fn restore(&mut self, l: &Loaded) -> Result<(), TrainError> {
        if l.tensors.first().map(Vec::len) != Some(self.numel) {
            return Err(TrainError::State(
                "the checkpoint does not hold this model's weights".into(),
            ));
        }
        let device = self.device;
        let load = |t: &mut Tensor, src: &[f32]| {
            tch::no_grad(|| t.copy_(&Tensor::from_slice(src).to_device(device)))
        };
        load(&mut self.weights, &l.tensors[0]);
        self.buffers_from_flat();
        let p = self.trainable;
        let opt = self.optimizer();
        if l.tensors.len() == 1 + opt.state().len() {
            for (t, src) in opt.state_mut().iter_mut().zip(&l.tensors[1..]) {
                load(t, &src[..p.min(src.len())]);
            }
            opt.t = l.optimizer_t;
        }
        self.step = l.step;
        self.cursor = Cursor {
            epoch: l.cursor.epoch,
            offset: l.cursor.offset,
        };
        // A checkpoint keeps no accounting: it restarts with the resumed
        // epoch (complete again from the epoch after).
        self.account = (0, 0);
        Ok(())
    }

    /// Makes the model's tensors views of the flat weights, so that an
    /// update of the weights is an update of the model, with no copy.
    fn bind(&mut self) {
        let mut at = 0i64;
        for (_, v) in &mut self.tensors.trainable {
            let n = v.numel() as i64;
            let view = self.weights.narrow(0, at, n).view(v.size().as_slice());
            v.set_data(&view);
            at += n;
        }
    }

    /// The model's `state_dict()`: every tensor by its PyTorch name, in
    /// its own dtype, on the CPU.
    pub fn weights(&self) -> Vec<(String, Tensor)> {
        let all = self.tensors.state_dict();
        if self.process.is_none() {
            return all;
        }
        // Over a module's shared memory they would be views of a mapping
        // that ends with the replica: the caller gets copies.
        all.into_iter().map(|(k, t)| (k, t.copy())).collect()
    }

    /// The model's tensors as inspection reports them.
    pub fn tensor_infos(&self) -> Vec<trainyard_common::model::ParamInfo> {
        self.tensors.infos()
    }

    /// The module with its trained tensors, serialized as `torch.jit.save`
    /// writes it (TorchScript models only).
    pub fn torchscript(&self) -> Result<Option<Vec<u8>>, TrainError> {
        match &self.process {
            Some(p) => process::lock(p).save().map(Some),
            None => Ok(None),
        }
    }

    fn core(&self) -> Core<'_> {
        Core {
            spec: &self.spec,
            net: self.net.as_ref(),
            tensors: &self.tensors,
            weights: &self.weights,
            trainable: self.trainable,
            numel: self.numel,
            device: self.device,
        }
    }

    /// Copies the flat vector's buffer part into the model's buffers (after
    /// anything wrote the flat vector).
    fn buffers_from_flat(&self) {
        self.core().buffers_from_flat();
    }

    /// SHA-256 over the names and the bytes of the weights.
    pub fn weights_sha256(&self) -> String {
        let mut h = Sha256::new();
        let mut flat = vec![0f32; self.numel];
        self.weights
            .to_device(tch::Device::Cpu)
            .copy_data(&mut flat, self.numel);
        for (k, ..) in self.tensors.layout() {
            h.update(k.as_bytes());
        }
        for x in &flat {
            h.update(x.to_le_bytes());
        }
        hex::encode(h.finalize())
    }

    /// The spec this replica trains.
    pub fn spec(&self) -> &UncheckedJobSpec {
        &self.spec
    }

    /// The spec, to change (tests stop a run half-way).
    #[cfg(test)]
    pub(crate) fn spec_mut(&mut self) -> &mut UncheckedJobSpec {
        &mut self.spec
    }

    /// Each tensor of the flat vector — the trainable parameters, then
    /// the buffers — by name, with its offset and length.
    pub fn layout(&self) -> Vec<(String, usize, usize)> {
        self.tensors.layout()
    }

    /// The pieces of named tensors that flat elements `[start, end)` are,
    /// buffers marked as such.
    pub fn ranges(&self, start: usize, end: usize) -> Vec<trainyard_common::checkpoint::Range> {
        let layout = self.layout();
        let mut out = trainyard_common::checkpoint::flat_to_ranges(&layout, start, end);
        for r in &mut out {
            r.buffer = layout
                .iter()
                .any(|(k, off, _)| *k == r.param && *off >= self.trainable);
        }
        out
    }

    /// Overwrites the flat weights from `offset` with `values`.
    pub fn load_range(&mut self, offset: usize, values: &[f32]) {
        let src = Tensor::from_slice(values).to_device(self.device);
        tch::no_grad(|| {
            self.weights
                .narrow(0, offset as i64, values.len() as i64)
                .copy_(&src)
        });
        if offset + values.len() > self.trainable {
            self.buffers_from_flat();
        }
    }

    /// The flat weights from `offset`, `len` of them, on the CPU.
    pub fn read_range(&self, offset: usize, len: usize) -> Vec<f32> {
        let mut out = vec![0f32; len];
        self.weights
            .narrow(0, offset as i64, len as i64)
            .to_device(tch::Device::Cpu)
            .copy_data(&mut out, len);
        out
    }

    /// Why this replica's data loader stopped (see [`Dataset::loader_failure`]).
    pub fn loader_failure(&self) -> String {
        self.dataset.loader_failure()
    }

    /// A sharded dataset's loader figures (`None` for data in memory).
    pub fn data_stats(&self) -> Option<std::sync::Arc<crate::data::DataStats>> {
        self.dataset.stats()
    }

    /// A background loader of this rank's batches from `cursor`.
    pub fn batches(
        &self,
        rank: u32,
        world: u32,
        cursor: Cursor,
    ) -> std::sync::mpsc::Receiver<Batch> {
        self.dataset.stream(&self.spec, rank, world, cursor)
    }

    /// Forward and backward on `b`: the loss summed over its samples and
    /// the gradient summed over them, flat, on the CPU (zeros for an empty
    /// batch).
    pub fn gradient(&mut self, b: &Batch) -> Result<(f64, Vec<f32>), TrainError> {
        let (loss_sum, flat) = self.forward_backward(b)?;
        let mut out = vec![0f32; self.numel];
        if let Some(f) = flat {
            f.to_device(tch::Device::Cpu)
                .copy_data(&mut out, self.numel);
        }
        Ok((loss_sum, out))
    }

    /// Recomputes the buffers (BatchNorm's running statistics) on the
    /// current weights: forwards in training mode over up to `batches` of
    /// rank `rank`'s training batches from the start of the data, as
    /// PyTorch's `torch.optim.swa_utils.update_bn` does. Asynchronous
    /// training ends with buffers that rank 0's forwards gathered on older
    /// weights than the final ones; these go with the final weights.
    /// Returns the batches used (0 for a model without buffers).
    pub fn recalibrate_buffers(
        &mut self,
        rank: u32,
        world: u32,
        batches: usize,
    ) -> Result<usize, TrainError> {
        if self.numel == self.trainable {
            return Ok(0);
        }
        let stream = self.batches(rank, world, Cursor::default());
        let mut used = 0;
        while used < batches {
            let Ok(b) = stream.recv() else { break };
            if b.samples == 0 {
                break;
            }
            self.forward_backward(&b)?;
            used += 1;
        }
        Ok(used)
    }

    /// Held-out loss and accuracy of the current weights; kept for the outcome.
    pub fn evaluate_now(&mut self) -> (Option<f64>, Option<f64>) {
        let (spec, net, device) = (&self.spec, self.net.as_ref(), self.device);
        let mut eval = |b: &(Tensor, Tensor)| progress::evaluate(spec, net, b, device);
        match self.dataset.evaluate_shards(&mut eval) {
            Some(Ok((l, a))) => {
                (self.eval_loss, self.eval_accuracy) = (Some(l), a);
                return (self.eval_loss, self.eval_accuracy);
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "held-out shards could not be read");
                return (self.eval_loss, self.eval_accuracy);
            }
            None => {}
        }
        if let Some(batch) = self.eval.as_ref() {
            let (l, a) = progress::evaluate(&self.spec, self.net.as_ref(), batch, self.device);
            (self.eval_loss, self.eval_accuracy) = (Some(l), a);
        }
        (self.eval_loss, self.eval_accuracy)
    }

    /// The loss of the last step.
    pub fn last_loss(&self) -> Option<f64> {
        self.last_loss
    }

    /// Records the loss of the last step (for the outcome).
    pub fn set_last_loss(&mut self, loss: f64) {
        self.last_loss = Some(loss);
    }

    /// Forward and backward on `b`: loss × samples and the flat gradient
    /// summed over the samples (in a buffer reused across steps, on the
    /// replica's device; `None` for an empty batch). A user's module takes
    /// the step in its process; its gradient arrives in shared memory.
    pub fn forward_backward(&mut self, b: &Batch) -> Result<(f64, Option<Tensor>), TrainError> {
        let state = self.numel > self.trainable && self.carries_state;
        if b.samples == 0 && !state {
            return Ok((0.0, None));
        }
        if let Some(p) = &self.process {
            let loss_sum = process::lock(p).step(b, state)?;
            // The step moved the buffers in the shared flat vector: the
            // mirror follows (its state_dict is what is saved).
            self.buffers_from_flat();
            return Ok((loss_sum, Some(self.grad.shallow_clone())));
        }
        let mut grad = std::mem::take(&mut self.grad);
        let stepped = self
            .core()
            .forward_backward(&b.x, &b.y, b.samples, state, &mut grad);
        self.grad = grad;
        let loss_sum = stepped?;
        Ok((loss_sum, Some(self.grad.shallow_clone())))
    }

    /// Ends a step on a gradient summed over `total` samples (by a ring,
    /// or alone) whose mean loss was `loss`: the mean gradient, clipped as
    /// the spec says, is applied at learning rate `lr`, and the replica
    /// moves to the next step with the data cursor at `next`. A loss that
    /// is not finite changes nothing and is an error.
    pub fn apply_summed(
        &mut self,
        summed: Option<Tensor>,
        total: f32,
        loss: f64,
        lr: f64,
        next: Cursor,
    ) -> Result<(), TrainError> {
        progress::check_finite(loss, self.step + 1)?;
        if let Some(g) = summed.filter(|_| total > 0.0) {
            let (n, p) = (self.numel as i64, self.trainable as i64);
            if n > p {
                // The buffers' part is rank 0's values, taken as they are.
                tch::no_grad(|| {
                    self.weights
                        .narrow(0, p, n - p)
                        .copy_(&g.narrow(0, p, n - p))
                });
                self.buffers_from_flat();
            }
            let mut g = g.narrow(0, 0, p);
            let _ = g.g_div_scalar_(f64::from(total));
            if let Some(c) = self.spec.optimizer().grad_clip {
                optim::clip_norm(&mut g, c);
            }
            // The model's parameters are views of `weights`: updated in place.
            let mut w = self.weights.narrow(0, 0, p);
            self.optimizer().step(&mut w, &g, lr);
        }
        self.step += 1;
        self.cursor = next;
        self.last_loss = Some(loss);
        Ok(())
    }

    /// Adds a completed step's `samples` and id hash (summed over the
    /// ranks) that started in `epoch` to the epoch's accounting; when the
    /// step ended the epoch, returns the epoch's total and starts the next.
    pub fn account(
        &mut self,
        epoch: u64,
        samples: u64,
        id_hash: u64,
    ) -> Option<trainyard_common::cluster::EpochAccount> {
        self.account.0 += samples;
        self.account.1 = self.account.1.wrapping_add(id_hash);
        if self.cursor.epoch == epoch {
            return None;
        }
        let (samples, id_hash) = std::mem::take(&mut self.account);
        Some(trainyard_common::cluster::EpochAccount {
            epoch,
            samples,
            id_hash,
        })
    }

    /// The device the replica computes on.
    pub fn device(&self) -> tch::Device {
        self.device
    }

    /// The finished replica's figures and weights.
    pub fn outcome(&self) -> Outcome {
        Outcome {
            steps: self.step,
            final_loss: self.last_loss,
            eval_accuracy: self.eval_accuracy,
            eval_loss: self.eval_loss,
            weights: self.weights(),
            weights_sha256: self.weights_sha256(),
        }
    }
}
