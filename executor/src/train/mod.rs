//! The training runtime: one data-parallel replica's loop on libtorch.
//!
//! A [`Replica`] holds what a worker trains: the data ([`data`]), the model
//! ([`model`]) in a `VarStore` on its device, a flat copy of the weights
//! and the optimizer state over it ([`optim`]), the global step and the
//! data cursor. [`train`] runs its loop on a ring ([`trainyard_dataplane`];
//! a ring of one for a single worker): forward and backward on this rank's
//! share of the global batch, gradients flattened and summed over the ring
//! together with the sample count and the loss, the mean gradient clipped
//! and applied identically on every replica, so all replicas hold the same
//! bits. A step changes the replica only after its all-reduce completed, so
//! a broken ring leaves it at its last completed step; [`join`] brings the
//! members of a new ring to the most advanced state (a broadcast from the
//! member that has it) before training resumes. Each step reports its
//! loss, throughput and the split between data, compute and communication.

pub mod data;
pub mod model;
pub mod optim;
pub mod rng;

use data::{Batch, Cursor, DataError, Dataset};
use optim::FlatOptimizer;
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tch::nn;
use tch::{Kind, Tensor};
use trainyard_common::spec::{Compression, JobSpecInput, Loss, ModelSpec, Schedule};
use trainyard_dataplane::{Ring, RingError, Wire};

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
    /// SHA-256 of the weights (names and bytes): equal on every replica.
    pub weights_sha256: String,
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
    /// The ring lost a member or timed out: the replica is intact at its
    /// last completed step and waits for a new ring.
    #[error("{0}")]
    Ring(#[from] RingError),
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

/// A data-parallel replica: model, flat weights, optimizer state, progress.
pub struct Replica {
    spec: JobSpecInput,
    device: tch::Device,
    dataset: Dataset,
    eval: Option<(Tensor, Tensor)>,
    _vs: nn::VarStore,
    net: Box<dyn model::Net>,
    vars: Vec<(String, Tensor)>,
    numel: usize,
    weights: Tensor,
    /// Created on the first update (a PS worker never needs one).
    opt: Option<FlatOptimizer>,
    buf: Vec<f32>,
    grad: Tensor,
    /// Global steps completed.
    pub step: u64,
    /// Where the next step starts in the data.
    pub cursor: Cursor,
    last_loss: f64,
    eval_loss: Option<f64>,
    eval_accuracy: Option<f64>,
    /// This rank asks for a checkpoint at the coming step (summed over the
    /// ring with the gradient).
    vote: bool,
}

/// Words of metadata at the end of an exported state: step, optimizer
/// steps, epoch, offset and the last loss (f64 bits), two words each.
const META_WORDS: usize = 10;

fn u64_words(v: u64) -> [f32; 2] {
    [f32::from_bits(v as u32), f32::from_bits((v >> 32) as u32)]
}

fn words_u64(w: &[f32]) -> u64 {
    u64::from(w[0].to_bits()) | (u64::from(w[1].to_bits()) << 32)
}

impl Replica {
    /// Loads the data and builds the model of `spec` on `device` with the
    /// job's seeded initialisation.
    pub fn new(spec: &JobSpecInput, device: tch::Device) -> Result<Replica, TrainError> {
        let dataset = Dataset::load(spec)?;
        let eval = dataset.eval_batch(spec);
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
        let mut vars: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        if vars.is_empty() {
            return Err(TrainError::Unsupported(
                "the model has no trainable parameters".into(),
            ));
        }
        let numel: usize = vars.iter().map(|(_, t)| t.numel()).sum();
        let weights = tch::no_grad(|| {
            Tensor::cat(
                &vars
                    .iter()
                    .map(|(_, t)| t.detach().reshape([-1]))
                    .collect::<Vec<_>>(),
                0,
            )
        });
        let mut replica = Replica {
            opt: None,
            spec: spec.clone(),
            device,
            dataset,
            eval,
            _vs: vs,
            net,
            vars,
            numel,
            weights,
            buf: Vec::new(),
            grad: Tensor::new(),
            step: 0,
            cursor: Cursor::default(),
            last_loss: f64::NAN,
            eval_loss: None,
            eval_accuracy: None,
            vote: false,
        };
        replica.bind();
        Ok(replica)
    }

    /// Trainable parameters.
    pub fn numel(&self) -> usize {
        self.numel
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
                let (len, b) = (self.dataset.train_len(), self.spec.batch_size as usize);
                let e = u64::from(e);
                if self.cursor.epoch >= e {
                    return self.step;
                }
                self.step
                    + data::steps_left_in_epoch(len, b, world, self.cursor.offset)
                    + (e - self.cursor.epoch - 1) * data::steps_left_in_epoch(len, b, world, 0)
            }
            (None, None) => 1,
        }
    }

    /// Length of [`Replica::export`].
    pub fn state_len(&self) -> usize {
        self.numel * (1 + FlatOptimizer::state_tensors(self.spec.optimizer.kind)) + META_WORDS
    }

    fn optimizer(&mut self) -> &mut FlatOptimizer {
        let (spec, n, device) = (&self.spec.optimizer, self.numel as i64, self.device);
        self.opt
            .get_or_insert_with(|| FlatOptimizer::new(spec, n, device))
    }

    /// Weights, optimizer state, step and cursor as one flat buffer.
    pub fn export(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.state_len()];
        let n = self.numel;
        let cpu = |t: &Tensor, dst: &mut [f32]| t.to_device(tch::Device::Cpu).copy_data(dst, n);
        cpu(&self.weights, &mut out[..n]);
        if let Some(opt) = &self.opt {
            for (i, t) in opt.state().iter().enumerate() {
                cpu(t, &mut out[(i + 1) * n..(i + 2) * n]);
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
            self.last_loss.to_bits(),
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
            return Err(TrainError::Unsupported(format!(
                "a peer sent a state of {} values, this replica has {}",
                state.len(),
                self.state_len()
            )));
        }
        let n = self.numel;
        let device = self.device;
        let load = |t: &mut Tensor, src: &[f32]| {
            tch::no_grad(|| t.copy_(&Tensor::from_slice(src).to_device(device)))
        };
        load(&mut self.weights, &state[..n]);
        let opt = self.optimizer();
        for (i, t) in opt.state_mut().iter_mut().enumerate() {
            load(t, &state[(i + 1) * n..(i + 2) * n]);
        }
        let meta = &state[state.len() - META_WORDS..];
        opt.t = words_u64(&meta[2..4]);
        self.step = words_u64(&meta[0..2]);
        self.cursor = Cursor {
            epoch: words_u64(&meta[4..6]),
            offset: words_u64(&meta[6..8]),
        };
        self.last_loss = f64::from_bits(words_u64(&meta[8..10]));
        Ok(())
    }

    /// Flat elements `[start, end)` of the weights and of each optimizer
    /// state tensor (zeros before the first update), on the CPU.
    pub fn snapshot(&self, start: usize, end: usize) -> Vec<Vec<f32>> {
        let len = end - start;
        let mut out = vec![self.read_range(start, len)];
        let states = FlatOptimizer::state_tensors(self.spec.optimizer.kind);
        for i in 0..states {
            let mut v = vec![0f32; len];
            if let Some(t) = self.opt.as_ref().and_then(|o| o.state().get(i)) {
                t.narrow(0, start as i64, len as i64)
                    .to_device(tch::Device::Cpu)
                    .copy_data(&mut v, len);
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
    pub fn restore(&mut self, l: &crate::checkpoint::Loaded) -> Result<(), TrainError> {
        if l.tensors.first().map(Vec::len) != Some(self.numel) {
            return Err(TrainError::Unsupported(
                "the checkpoint does not hold this model's weights".into(),
            ));
        }
        let device = self.device;
        let load = |t: &mut Tensor, src: &[f32]| {
            tch::no_grad(|| t.copy_(&Tensor::from_slice(src).to_device(device)))
        };
        load(&mut self.weights, &l.tensors[0]);
        let opt = self.optimizer();
        if l.tensors.len() == 1 + opt.state().len() {
            for (t, src) in opt.state_mut().iter_mut().zip(&l.tensors[1..]) {
                load(t, src);
            }
            opt.t = l.optimizer_t;
        }
        self.step = l.step;
        self.cursor = Cursor {
            epoch: l.cursor.epoch,
            offset: l.cursor.offset,
        };
        Ok(())
    }

    /// Makes the model's tensors views of the flat weights, so that an
    /// update of the weights is an update of the model, with no copy.
    fn bind(&mut self) {
        let mut at = 0i64;
        for (_, v) in &mut self.vars {
            let n = v.numel() as i64;
            let view = self.weights.narrow(0, at, n).view(v.size().as_slice());
            v.set_data(&view);
            at += n;
        }
    }

    /// The weights by name, on the CPU.
    pub fn weights(&self) -> Vec<(String, Tensor)> {
        self.vars
            .iter()
            .map(|(k, v)| (k.clone(), v.detach().to_device(tch::Device::Cpu)))
            .collect()
    }

    /// SHA-256 over the names and the bytes of the weights.
    pub fn weights_sha256(&self) -> String {
        let mut h = Sha256::new();
        let mut flat = vec![0f32; self.numel];
        self.weights
            .to_device(tch::Device::Cpu)
            .copy_data(&mut flat, self.numel);
        for (k, _) in &self.vars {
            h.update(k.as_bytes());
        }
        for x in &flat {
            h.update(x.to_le_bytes());
        }
        hex::encode(h.finalize())
    }

    /// One step of a ring of one on the batch `(x, y)` (the benchmark's
    /// entry): forward, backward, gradients flattened, the optimizer on the
    /// flat weights, the model's tensors updated. Returns the loss.
    pub fn step_on(&mut self, x: &Tensor, y: &Tensor, lr: f64) -> Result<f64, TrainError> {
        let b = Batch {
            x: x.shallow_clone(),
            y: y.shallow_clone(),
            samples: x.size().first().copied().unwrap_or(0).max(0) as usize,
            next: self.cursor,
        };
        let f = self.step(b, &mut Ring::solo(), lr, &AtomicBool::new(false))?;
        Ok(f.loss)
    }

    /// The spec this replica trains.
    pub fn spec(&self) -> &JobSpecInput {
        &self.spec
    }

    /// Each trainable tensor's name, offset in the flat weights and length.
    pub fn layout(&self) -> Vec<(String, usize, usize)> {
        let mut at = 0;
        self.vars
            .iter()
            .map(|(k, v)| {
                let n = v.numel();
                at += n;
                (k.clone(), at - n, n)
            })
            .collect()
    }

    /// Overwrites the flat weights from `offset` with `values`.
    pub fn load_range(&mut self, offset: usize, values: &[f32]) {
        let src = Tensor::from_slice(values).to_device(self.device);
        tch::no_grad(|| {
            self.weights
                .narrow(0, offset as i64, values.len() as i64)
                .copy_(&src)
        });
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

    /// Held-out loss and accuracy of the current weights; kept for the outcome.
    pub fn evaluate_now(&mut self) -> (Option<f64>, Option<f64>) {
        if let Some(batch) = self.eval.as_ref() {
            let (l, a) = evaluate(&self.spec, self.net.as_ref(), batch, self.device);
            (self.eval_loss, self.eval_accuracy) = (Some(l), a);
        }
        (self.eval_loss, self.eval_accuracy)
    }

    /// The loss of the last step.
    pub fn last_loss(&self) -> f64 {
        self.last_loss
    }

    /// Records the loss of the last step (for the outcome).
    pub fn set_last_loss(&mut self, loss: f64) {
        self.last_loss = loss;
    }

    /// Forward and backward on `b`: loss × samples and the flat gradient
    /// summed over the samples (in a buffer reused across steps).
    fn forward_backward(&mut self, b: &Batch) -> Result<(f64, Option<Tensor>), TrainError> {
        let n = self.numel;
        let mut loss_sum = 0.0;
        let mut flat = None;
        if b.samples > 0 {
            let (x, y) = (b.x.to_device(self.device), b.y.to_device(self.device));
            for (_, v) in &self.vars {
                let mut g = v.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            let out = self.net.try_forward(&x, true).map_err(|e| {
                TrainError::Unsupported(format!(
                    "the model cannot take a batch of shape {:?}: {e}",
                    x.size()
                ))
            })?;
            if out.size().first() != Some(&(b.samples as i64)) {
                return Err(TrainError::Unsupported(format!(
                    "the model returned shape {:?} for a batch of {}",
                    out.size(),
                    b.samples
                )));
            }
            let loss = loss_of(&self.spec, &out, &y).map_err(|e| {
                TrainError::Unsupported(format!(
                    "the model's output {:?} does not fit the targets {:?}: {e}",
                    out.size(),
                    y.size()
                ))
            })?;
            // Sums over ranks of (mean loss × samples) give the global mean.
            (&loss * b.samples as f64).backward();
            loss_sum = loss.double_value(&[]) * b.samples as f64;
            let grads: Vec<Tensor> = self
                .vars
                .iter()
                .map(|(_, v)| {
                    let g = v.grad();
                    if g.defined() {
                        g.reshape([-1])
                    } else {
                        Tensor::zeros([v.numel() as i64], (Kind::Float, self.device))
                    }
                })
                .collect();
            // Into a buffer kept across steps.
            if !self.grad.defined() || self.grad.numel() != n {
                self.grad = Tensor::empty([n as i64], (Kind::Float, self.device));
            }
            flat = Some(Tensor::cat_out(&self.grad, &grads, 0));
        }
        Ok((loss_sum, flat))
    }

    /// One step on this rank's share `b`, summed over `ring`.
    fn step(
        &mut self,
        b: Batch,
        ring: &mut Ring,
        lr: f64,
        stop: &AtomicBool,
    ) -> Result<StepFigures, TrainError> {
        let computed = Instant::now();
        let n = self.numel;
        let (loss_sum, flat) = self.forward_backward(&b)?;
        let compute = computed.elapsed().as_secs_f64();
        let comm_started = Instant::now();
        let sent_before = ring.stats().bytes_sent.load(Ordering::Relaxed);
        let (total, loss_sum, flat) = if ring.world() == 1 {
            // Alone: the gradient stays where it is, on its device.
            (b.samples as f32, loss_sum, flat)
        } else {
            self.buf.resize(n + 3, 0.0);
            match &flat {
                Some(f) => f
                    .to_device(tch::Device::Cpu)
                    .copy_data(&mut self.buf[..n], n),
                None => self.buf[..n].fill(0.0),
            }
            self.buf[n] = b.samples as f32;
            self.buf[n + 1] = loss_sum as f32;
            self.buf[n + 2] = f32::from(u8::from(self.vote));
            match self.spec.compression {
                Compression::None => ring.allreduce(&mut self.buf, stop)?,
                Compression::Bf16 => {
                    // The gradient in bf16; the sample count and loss stay exact.
                    let (grad, counts) = self.buf.split_at_mut(n);
                    ring.allreduce_wire(grad, Wire::Bf16, stop)?;
                    ring.allreduce(counts, stop)?;
                }
            }
            let summed = Tensor::from_slice(&self.buf[..n]).to_device(self.device);
            (self.buf[n], f64::from(self.buf[n + 1]), Some(summed))
        };
        let votes = if ring.world() == 1 {
            f32::from(u8::from(self.vote))
        } else {
            self.buf[n + 2]
        };
        let comm = comm_started.elapsed().as_secs_f64();
        let comm_bytes = ring.stats().bytes_sent.load(Ordering::Relaxed) - sent_before;
        let applied = Instant::now();
        let loss = loss_sum / f64::from(total.max(1.0));
        if !loss.is_finite() {
            return Err(TrainError::Diverged(self.step + 1));
        }
        if let Some(mut g) = flat.filter(|_| total > 0.0) {
            let _ = g.g_div_scalar_(f64::from(total));
            if let Some(c) = self.spec.optimizer.grad_clip {
                optim::clip_norm(&mut g, c);
            }
            // The model's tensors are views of `weights`: updated in place.
            let mut w = self.weights.shallow_clone();
            self.optimizer().step(&mut w, &g, lr);
        }
        self.step += 1;
        self.cursor = b.next;
        self.last_loss = loss;
        let compute = compute + applied.elapsed().as_secs_f64();
        Ok(StepFigures {
            loss,
            samples: total as usize,
            compute,
            comm,
            comm_bytes,
            votes,
        })
    }
}

/// What one step measured.
struct StepFigures {
    loss: f64,
    samples: usize,
    compute: f64,
    comm: f64,
    comm_bytes: u64,
    /// Ranks that asked for a checkpoint at this step.
    votes: f32,
}

/// Loads a committed checkpoint into a new replica.
pub type Resume<'a> = &'a dyn Fn(&mut Replica) -> Result<(), String>;

/// Brings the members of a (new) ring to one state: the members share
/// whether they hold a replica and at which step, and the most advanced one
/// (the lowest rank among equals; rank 0 if nobody has one) broadcasts its
/// weights, optimizer state, step and cursor to all when any member lacks
/// them or lags. The replica is created in `slot` if it is empty and
/// stays there whatever happens; returns the rank that sent the state, if
/// one did.
pub fn join(
    ring: &mut Ring,
    slot: &mut Option<Replica>,
    spec: &JobSpecInput,
    device: tch::Device,
    stop: &AtomicBool,
    resume: Option<Resume<'_>>,
) -> Result<Option<u32>, TrainError> {
    let have = slot.as_ref().map_or([0, 0], |r| [1, r.step]);
    let mut all = ring.allgather_u64(&have, stop)?;
    // Nobody holds the job's state (a new job, or its whole fleet was
    // lost): every rank loads the committed checkpoint itself; a rank whose
    // load failed then receives the state like a new member.
    if let Some(load) = resume.filter(|_| slot.is_none() && all.iter().all(|a| a[0] == 0)) {
        let mut r = Replica::new(spec, device)?;
        if let Err(e) = load(&mut r) {
            tracing::warn!(error = %e, "could not load the checkpoint; taking the state from a peer");
            r = Replica::new(spec, device)?;
        }
        let have = [u64::from(r.step > 0), r.step];
        *slot = Some(r);
        all = ring.allgather_u64(&have, stop)?;
    }
    let source = (0..all.len())
        .filter(|&i| all[i][0] == 1)
        .max_by_key(|&i| (all[i][1], std::cmp::Reverse(i)))
        .unwrap_or(0);
    let best = all[source][1];
    let needed = all.iter().any(|a| a[0] == 0 || a[1] != best);
    if slot.is_none() {
        *slot = Some(Replica::new(spec, device)?);
    }
    let Some(replica) = slot.as_mut() else {
        return Err(TrainError::Unsupported("no replica".into()));
    };
    if !needed {
        return Ok(None);
    }
    let source = source as u32;
    let mut state = if ring.rank() == source {
        replica.export()
    } else {
        vec![0f32; replica.state_len()]
    };
    ring.broadcast(&mut state, source, stop)?;
    if ring.rank() != source {
        replica.import(&state)?;
    }
    Ok(Some(source))
}

/// Trains `replica` on `ring` until the job's steps or epochs are done,
/// calling `on_step` after each step (with the held-out figures on rank 0,
/// which alone evaluates).
pub fn train(
    replica: &mut Replica,
    ring: &mut Ring,
    stop: &AtomicBool,
    on_step: &mut dyn FnMut(&StepStats),
) -> Result<Outcome, TrainError> {
    train_with(replica, ring, stop, on_step, None)
}

/// [`train`], writing checkpoints as `ckpt`'s policy says: each rank
/// writes its slice of the flat weights and optimizer state.
pub fn train_with(
    replica: &mut Replica,
    ring: &mut Ring,
    stop: &AtomicBool,
    on_step: &mut dyn FnMut(&StepStats),
    mut ckpt: Option<&mut crate::checkpoint::Checkpointing>,
) -> Result<Outcome, TrainError> {
    let (rank, world) = (ring.rank(), ring.world());
    let spec = replica.spec.clone();
    let total = replica.total_steps(world);
    let eval_every = (total / EVALUATIONS).max(1);
    let batches = replica.dataset.stream(&spec, rank, world, replica.cursor);
    let mut evaluated_at = None;
    while !replica.finished() {
        if stop.load(Ordering::Relaxed) {
            return Err(TrainError::Stopped);
        }
        let waited = Instant::now();
        let Ok(b) = batches.recv() else {
            return Err(TrainError::Unsupported("the data loader stopped".into()));
        };
        let data_seconds = waited.elapsed().as_secs_f64();
        let lr = learning_rate(&spec, replica.step + 1, total);
        replica.vote = ckpt.as_ref().is_some_and(|c| c.policy.vote());
        let f = replica.step(b, ring, lr, stop)?;
        if let Some(c) = ckpt.as_deref_mut() {
            if c.policy
                .due(replica.step, f.votes > 0.0, replica.finished())
            {
                write_slice(replica, c, rank, world);
            }
        }
        let mut stats = StepStats {
            step: replica.step,
            loss: f.loss,
            lr,
            samples_per_sec: f.samples as f64 / (data_seconds + f.compute + f.comm).max(1e-9),
            data_seconds,
            compute_seconds: f.compute,
            comm_seconds: f.comm,
            comm_bytes: f.comm_bytes,
            staleness: None,
            rejected: 0,
            eval_accuracy: None,
            eval_loss: None,
        };
        if rank == 0 && (replica.step % eval_every == 0 || replica.finished()) {
            (stats.eval_loss, stats.eval_accuracy) = replica.evaluate_now();
            evaluated_at = Some(replica.step);
        }
        on_step(&stats);
    }
    if rank == 0 && evaluated_at != Some(replica.step) {
        replica.evaluate_now();
    }
    Ok(Outcome {
        steps: replica.step,
        final_loss: replica.last_loss,
        eval_accuracy: replica.eval_accuracy,
        eval_loss: replica.eval_loss,
        weights: replica.weights(),
        weights_sha256: replica.weights_sha256(),
    })
}

/// Hands this rank's slice of the replica's state to the uploader.
pub fn write_slice(
    replica: &Replica,
    c: &mut crate::checkpoint::Checkpointing,
    rank: u32,
    world: u32,
) {
    use trainyard_common::checkpoint::{flat_to_ranges, ring_slice, CursorState};
    let (a, b) = ring_slice(replica.numel, rank, world);
    let snap = crate::checkpoint::Snapshot {
        step: replica.step,
        generation: c.generation,
        shard: rank,
        shards: world,
        ranges: flat_to_ranges(&replica.layout(), a, b),
        tensors: replica.snapshot(a, b),
        numel: replica.numel as u64,
        optimizer_t: replica.optimizer_t(),
        cursor: CursorState {
            epoch: replica.cursor.epoch,
            offset: replica.cursor.offset,
        },
    };
    c.policy.written(replica.step);
    c.uploader.submit(snap);
}

/// Trains `spec` alone (a ring of one) on `device`, calling `on_step` after
/// each step, until done or `stop` is set.
pub fn run(
    spec: &JobSpecInput,
    device: tch::Device,
    stop: &AtomicBool,
    on_step: &mut dyn FnMut(&StepStats),
) -> Result<Outcome, TrainError> {
    let mut replica = Replica::new(spec, device)?;
    train(&mut replica, &mut Ring::solo(), stop, on_step)
}

#[cfg(test)]
mod tests;
