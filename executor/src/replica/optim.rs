//! Optimizers over one flat parameter tensor.
//!
//! Data-parallel training combines gradients as one flat buffer (the ring
//! sums it; a parameter server owns ranges of it), so the update is applied
//! to the flat weights too: SGD, momentum, Adam and AdamW with PyTorch's
//! update rules (`torch.optim`), their state (momentum buffer, first and
//! second moments, step count) kept as flat tensors that can be exported,
//! sent to a new replica and imported bit for bit. Elementwise libtorch
//! kernels do the arithmetic, on the CPU or the GPU where the weights live.
//!
//! [`SliceOptimizer`] applies the same rules to plain `f32` slices in one
//! fused pass per element, without temporaries: the parameter-server
//! shard's optimizer, whose values arrive and leave as raw floats on the
//! wire and never need to be a tensor. The two are kept apart on purpose
//! (the ring's replicas live on the GPU, a shard's values in host memory);
//! a test holds them to the same results.

use tch::Tensor;
use trainyard_common::spec::{OptimizerKind, OptimizerSpec};

/// An optimizer's constants as its spec gives them, with the defaults both
/// optimizers share (momentum 0.9, betas (0.9, 0.999), eps 1e-8).
#[derive(Debug, Clone, Copy)]
struct Hyper {
    kind: OptimizerKind,
    momentum: f64,
    betas: [f64; 2],
    weight_decay: f64,
    eps: f64,
}

impl Hyper {
    fn of(spec: &OptimizerSpec) -> Hyper {
        Hyper {
            kind: spec.kind,
            momentum: spec.momentum.unwrap_or(0.9),
            betas: spec.betas.unwrap_or([0.9, 0.999]),
            weight_decay: spec.weight_decay,
            eps: 1e-8,
        }
    }
}

/// An optimizer and its state for `numel` parameters.
pub struct FlatOptimizer {
    h: Hyper,
    /// Updates applied so far (Adam's bias correction).
    pub t: u64,
    state: Vec<Tensor>,
    /// Work buffers reused across steps (no allocation per step).
    scratch: Vec<Tensor>,
}

impl FlatOptimizer {
    /// The optimizer of `spec` for `numel` parameters on `device`.
    pub fn new(spec: &OptimizerSpec, numel: i64, device: tch::Device) -> FlatOptimizer {
        let zeros = || Tensor::zeros([numel], (tch::Kind::Float, device));
        let state = match spec.kind {
            OptimizerKind::Sgd => vec![],
            OptimizerKind::Momentum => vec![zeros()],
            OptimizerKind::Adam | OptimizerKind::Adamw => vec![zeros(), zeros()],
        };
        FlatOptimizer {
            h: Hyper::of(spec),
            t: 0,
            state,
            scratch: Vec::new(),
        }
    }

    /// How many state tensors `kind` keeps.
    pub fn state_tensors(kind: OptimizerKind) -> usize {
        match kind {
            OptimizerKind::Sgd => 0,
            OptimizerKind::Momentum => 1,
            OptimizerKind::Adam | OptimizerKind::Adamw => 2,
        }
    }

    /// The state tensors (momentum buffer; or first and second moments).
    pub fn state(&self) -> &[Tensor] {
        &self.state
    }

    /// The state tensors, to be overwritten by an import.
    pub fn state_mut(&mut self) -> &mut [Tensor] {
        &mut self.state
    }

    /// Applies one update with gradient `g` to the weights `w` in place.
    pub fn step(&mut self, w: &mut Tensor, g: &Tensor, lr: f64) {
        self.t += 1;
        tch::no_grad(|| {
            let wd = self.h.weight_decay;
            match self.h.kind {
                OptimizerKind::Sgd => {
                    let g = if wd != 0.0 {
                        g + &*w * wd
                    } else {
                        g.shallow_clone()
                    };
                    let _ = w.g_sub_(&(g * lr));
                }
                OptimizerKind::Momentum => {
                    let g = if wd != 0.0 {
                        g + &*w * wd
                    } else {
                        g.shallow_clone()
                    };
                    let buf = &mut self.state[0];
                    if self.t == 1 {
                        buf.copy_(&g);
                    } else {
                        let _ = buf.g_mul_scalar_(self.h.momentum);
                        let _ = buf.g_add_(&g);
                    }
                    let _ = w.g_sub_(&(&*buf * lr));
                }
                OptimizerKind::Adam | OptimizerKind::Adamw => {
                    let [b1, b2] = self.h.betas;
                    let g = if self.h.kind == OptimizerKind::Adam && wd != 0.0 {
                        g + &*w * wd
                    } else {
                        g.shallow_clone()
                    };
                    if self.h.kind == OptimizerKind::Adamw && wd != 0.0 {
                        let _ = w.g_mul_scalar_(1.0 - lr * wd);
                    }
                    if self.scratch.len() != 2 || self.scratch[0].size() != g.size() {
                        self.scratch = vec![g.empty_like(), g.empty_like()];
                    }
                    let (m, v) = self.state.split_at_mut(1);
                    let (m, v) = (&mut m[0], &mut v[0]);
                    // m ← β₁m + (1−β₁)g and v ← β₂v + (1−β₂)g², in place.
                    let _ = m.lerp_(&g, 1.0 - b1);
                    let _ = g.mul_out(&self.scratch[0], &g);
                    let _ = v.lerp_(&self.scratch[0], 1.0 - b2);
                    let t = self.t as i32;
                    let bc1 = 1.0 - b1.powi(t);
                    let bc2 = 1.0 - b2.powi(t);
                    // w ← w − lr/bc₁ · m / (√v/√bc₂ + ε), folded into one
                    // addcdiv by scaling the denominator.
                    let mut denom = v.sqrt_out(&self.scratch[1]);
                    let _ = denom.g_div_scalar_(bc2.sqrt());
                    let _ = denom.g_add_scalar_(self.h.eps);
                    let _ = denom.g_mul_scalar_(-bc1 / lr);
                    let _ = w.addcdiv_(m, &denom);
                }
            }
        });
    }
}

/// [`FlatOptimizer`]'s updates over `f32` slices, fused: one pass reads the
/// gradient (and an optional second gradient summed into it), the weights
/// and the state, and writes the weights and the state. Arithmetic is
/// `f32` per element, as libtorch's CPU kernels do for float tensors.
pub struct SliceOptimizer {
    h: Hyper,
    /// Updates applied so far (Adam's bias correction).
    pub t: u64,
    state: Vec<Vec<f32>>,
}

impl SliceOptimizer {
    /// The optimizer of `spec` for `numel` parameters.
    pub fn new(spec: &OptimizerSpec, numel: usize) -> SliceOptimizer {
        SliceOptimizer {
            h: Hyper::of(spec),
            t: 0,
            state: vec![vec![0.0; numel]; FlatOptimizer::state_tensors(spec.kind)],
        }
    }

    /// The state (momentum buffer; or first and second moments).
    pub fn state(&self) -> &[Vec<f32>] {
        &self.state
    }

    /// The state, to be overwritten by an import.
    pub fn state_mut(&mut self) -> &mut [Vec<f32>] {
        &mut self.state
    }

    /// The momentum the next steps use (a `momentum` optimizer's).
    pub fn momentum(&self) -> f64 {
        self.h.momentum
    }

    /// Sets the momentum of the next steps (an async shard compensates for
    /// the momentum asynchrony adds by itself).
    pub fn set_momentum(&mut self, momentum: f64) {
        self.h.momentum = momentum;
    }

    /// One update of `w` in place with the gradient `scale · (g + extra)`
    /// (`extra`: a second gradient of the same length, e.g. the sum of the
    /// others in a synchronous step).
    pub fn step(&mut self, w: &mut [f32], g: &[f32], extra: Option<&[f32]>, scale: f32, lr: f64) {
        self.t += 1;
        let n = w.len().min(g.len());
        let c = Coefficients::new(self, lr, scale);
        let (s0, s1): (&mut [f32], &mut [f32]) = match self.state.as_mut_slice() {
            [] => (&mut [], &mut []),
            [a] => (&mut a[..n], &mut []),
            [a, b, ..] => (&mut a[..n], &mut b[..n]),
        };
        c.update(&mut w[..n], s0, s1, &g[..n], extra.map(|e| &e[..n]));
    }
}

/// One step's constants.
struct Coefficients {
    kind: OptimizerKind,
    scale: f32,
    wd: f32,
    lr: f32,
    momentum: f32,
    first: bool,
    w1: f32,
    w2: f32,
    inv_sqrt_bc2: f32,
    eps: f32,
    step: f32,
    adam_wd: f32,
    decay: f32,
}

impl Coefficients {
    fn new(o: &SliceOptimizer, lr: f64, scale: f32) -> Coefficients {
        let [b1, b2] = o.h.betas;
        let t = o.t as i32;
        let bc1 = 1.0 - b1.powi(t);
        let bc2 = 1.0 - b2.powi(t);
        let wd = o.h.weight_decay as f32;
        Coefficients {
            kind: o.h.kind,
            scale,
            wd,
            lr: lr as f32,
            momentum: o.h.momentum as f32,
            first: o.t == 1,
            w1: (1.0 - b1) as f32,
            w2: (1.0 - b2) as f32,
            inv_sqrt_bc2: (1.0 / bc2.sqrt()) as f32,
            eps: o.h.eps as f32,
            step: (-bc1 / lr) as f32,
            adam_wd: if o.h.kind == OptimizerKind::Adam {
                wd
            } else {
                0.0
            },
            decay: if o.h.kind == OptimizerKind::Adamw {
                (1.0 - lr * o.h.weight_decay) as f32
            } else {
                1.0
            },
        }
    }

    /// The update of one chunk: weights, state (empty when the kind keeps
    /// less), gradient, second gradient.
    fn update(&self, w: &mut [f32], s0: &mut [f32], s1: &mut [f32], g: &[f32], e: Option<&[f32]>) {
        // Zipped slice iterators (no indexing) let the loops vectorize.
        match e {
            Some(e) => {
                let scale = self.scale;
                self.run(w, s0, s1, g.iter().zip(e).map(|(a, b)| (a + b) * scale));
            }
            None => {
                let scale = self.scale;
                self.run(w, s0, s1, g.iter().map(|a| a * scale));
            }
        }
    }

    #[inline(always)]
    fn run(&self, w: &mut [f32], s0: &mut [f32], s1: &mut [f32], grad: impl Iterator<Item = f32>) {
        let (wd, lr) = (self.wd, self.lr);
        match self.kind {
            OptimizerKind::Sgd => {
                for (wi, g) in w.iter_mut().zip(grad) {
                    let gi = g + *wi * wd;
                    *wi -= gi * lr;
                }
            }
            OptimizerKind::Momentum => {
                let (m, first) = (self.momentum, self.first);
                for ((wi, bi), g) in w.iter_mut().zip(s0.iter_mut()).zip(grad) {
                    let gi = g + *wi * wd;
                    *bi = if first { gi } else { *bi * m + gi };
                    *wi -= *bi * lr;
                }
            }
            OptimizerKind::Adam | OptimizerKind::Adamw => {
                let c = self;
                for (((wi, mi), vi), g) in
                    w.iter_mut().zip(s0.iter_mut()).zip(s1.iter_mut()).zip(grad)
                {
                    let gi = g + *wi * c.adam_wd;
                    let wv = *wi * c.decay;
                    *mi += c.w1 * (gi - *mi);
                    *vi += c.w2 * (gi * gi - *vi);
                    let denom = (vi.sqrt() * c.inv_sqrt_bc2 + c.eps) * c.step;
                    *wi = wv + *mi / denom;
                }
            }
        }
    }
}

/// The L2 norm of `scale · (g + extra)`, accumulated in `f64`.
pub fn slice_norm(g: &[f32], extra: Option<&[f32]>, scale: f64) -> f64 {
    let sum: f64 = match extra {
        Some(e) => g
            .iter()
            .zip(e)
            .map(|(a, b)| {
                let x = f64::from(*a + *b);
                x * x
            })
            .sum(),
        None => g.iter().map(|a| f64::from(*a) * f64::from(*a)).sum(),
    };
    sum.sqrt() * scale
}

/// Scales `g` so that its L2 norm is at most `max` (PyTorch's
/// `clip_grad_norm_`); returns the norm before clipping.
pub fn clip_norm(g: &mut Tensor, max: f64) -> f64 {
    let norm = g.norm().double_value(&[]);
    let coef = max / (norm + 1e-6);
    if coef < 1.0 {
        let _ = g.g_mul_scalar_(coef);
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::{self, OptimizerConfig};

    /// lr 0.05, momentum 0.9, betas (0.9, 0.99), weight decay `wd`.
    fn test_spec(kind: OptimizerKind, wd: f64) -> OptimizerSpec {
        OptimizerSpec {
            kind,
            lr: 0.05,
            momentum: Some(0.9),
            betas: Some([0.9, 0.99]),
            weight_decay: wd,
            schedule: trainyard_common::spec::Schedule::Constant,
            grad_clip: None,
        }
    }

    fn objective(p: &Tensor) -> Tensor {
        ((p - 0.5) * (p - 0.5) + p.sin() * 0.1).sum(tch::Kind::Float)
    }

    /// The flat optimizers follow libtorch's own on a small problem.
    #[test]
    fn flat_updates_match_libtorch_optimizers() {
        for (kind, wd) in [
            (OptimizerKind::Sgd, 0.01),
            (OptimizerKind::Momentum, 0.0),
            (OptimizerKind::Adam, 0.01),
            (OptimizerKind::Adamw, 0.05),
        ] {
            let spec = test_spec(kind, wd);
            let _rng = super::super::seeded_rng();
            tch::manual_seed(1);
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let p = vs.root().randn("p", &[50], 0.0, 1.0);
            let mut w = p.detach().copy();
            let mut opt = match kind {
                OptimizerKind::Sgd => nn::Sgd {
                    momentum: 0.0,
                    dampening: 0.0,
                    wd,
                    nesterov: false,
                }
                .build(&vs, 0.05),
                OptimizerKind::Momentum => nn::Sgd {
                    momentum: 0.9,
                    dampening: 0.0,
                    wd,
                    nesterov: false,
                }
                .build(&vs, 0.05),
                OptimizerKind::Adam => nn::Adam {
                    beta1: 0.9,
                    beta2: 0.99,
                    wd,
                    eps: 1e-8,
                    amsgrad: false,
                }
                .build(&vs, 0.05),
                OptimizerKind::Adamw => nn::AdamW {
                    beta1: 0.9,
                    beta2: 0.99,
                    wd,
                    eps: 1e-8,
                    amsgrad: false,
                }
                .build(&vs, 0.05),
            }
            .unwrap();
            let mut flat = FlatOptimizer::new(&spec, 50, tch::Device::Cpu);
            for _ in 0..20 {
                let loss = objective(&p);
                opt.backward_step(&loss);
                let wg = w.detach().set_requires_grad(true);
                let l2 = objective(&wg);
                l2.backward();
                let g = wg.grad();
                flat.step(&mut w, &g, 0.05);
            }
            let diff = (&w - &p.detach()).abs().max().double_value(&[]);
            assert!(diff < 1e-4, "{kind:?}: max difference {diff}");
        }
    }

    /// The fused slice optimizer follows the flat one, step after step,
    /// for every kind, with a gradient given as two summed halves.
    #[test]
    fn slice_updates_match_the_flat_optimizer() {
        for (kind, wd) in [
            (OptimizerKind::Sgd, 0.01),
            (OptimizerKind::Momentum, 0.0),
            (OptimizerKind::Momentum, 0.02),
            (OptimizerKind::Adam, 0.01),
            (OptimizerKind::Adamw, 0.05),
        ] {
            let spec = test_spec(kind, wd);
            let n = 1000;
            let mut flat = FlatOptimizer::new(&spec, n as i64, tch::Device::Cpu);
            let mut slice = SliceOptimizer::new(&spec, n);
            let init: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
            let mut w = Tensor::from_slice(&init);
            let mut ws = init.clone();
            for step in 0..15 {
                let a: Vec<f32> = (0..n)
                    .map(|i| ((i * 7 + step) as f32 * 0.11).cos())
                    .collect();
                let b: Vec<f32> = (0..n)
                    .map(|i| ((i * 3 + step) as f32 * 0.05).sin())
                    .collect();
                let lr = 0.05 / (1.0 + step as f64);
                let g = (Tensor::from_slice(&a) + Tensor::from_slice(&b)) / 2.0;
                flat.step(&mut w, &g, lr);
                slice.step(&mut ws, &a, Some(&b), 0.5, lr);
            }
            let got = Tensor::from_slice(&ws);
            let diff = (&w - &got).abs().max().double_value(&[]);
            let scale = w.abs().max().double_value(&[]);
            assert!(
                diff <= 1e-5 * scale.max(1.0),
                "{kind:?} wd {wd}: max difference {diff}"
            );
            for (f, s) in flat.state().iter().zip(slice.state()) {
                let d = (f - Tensor::from_slice(s)).abs().max().double_value(&[]);
                assert!(d < 1e-5, "{kind:?}: state differs by {d}");
            }
            assert_eq!(flat.t, slice.t);
        }
    }

    #[test]
    fn slice_norm_is_the_norm_of_the_scaled_sum() {
        let n = slice_norm(&[1.0, 2.0], Some(&[2.0, 2.0]), 0.5);
        assert!((n - 2.5).abs() < 1e-12);
        assert!((slice_norm(&[3.0, 4.0], None, 1.0) - 5.0).abs() < 1e-12);
    }

    #[test]
    fn clipping_bounds_the_norm() {
        let mut g = Tensor::from_slice(&[3.0f32, 4.0]);
        assert!((clip_norm(&mut g, 1.0) - 5.0).abs() < 1e-6);
        assert!((g.norm().double_value(&[]) - 1.0).abs() < 1e-4);
        let mut small = Tensor::from_slice(&[0.3f32, 0.4]);
        clip_norm(&mut small, 1.0);
        assert!((small.norm().double_value(&[]) - 0.5).abs() < 1e-6);
    }
}
