//! What happens to a batch's features as the batch is assembled: the
//! seeded random image transforms (random crop, horizontal flip), drawn
//! per sample and epoch from the sample's id so that a job is reproducible
//! whatever the workers, and the conversion of pixels to floats (uint8 ÷
//! 255, then the spec's per-channel `normalize`). Decoded data stays in
//! its compact dtype in the loader's caches; only batches are floats.
//!
//! Held-out batches get the conversion without the random transforms
//! (torchvision's evaluation transforms are the deterministic ones).

use super::rng::Rng;
use tch::{Kind, Tensor};
use trainyard_common::spec::{DatasetSpec, Transform, UncheckedJobSpec};

/// The batch-time steps of a dataset.
#[derive(Debug)]
pub struct Pixels {
    /// Features become floats here (integer ones are kept until then).
    pub to_float: bool,
    mean: Option<Vec<f64>>,
    std: Option<Vec<f64>>,
    random: Vec<Transform>,
    seed: u64,
}

impl Pixels {
    /// The steps `spec`'s dataset asks for.
    pub fn of(spec: &UncheckedJobSpec) -> Pixels {
        let DatasetSpec::File(f) = spec.dataset() else {
            return Pixels::none(spec.seed);
        };
        let images = f.format_or_guess().is_some_and(|f| f.is_image());
        Pixels {
            to_float: images || f.normalize.is_some(),
            mean: f.normalize.as_ref().map(|n| n.mean.clone()),
            std: f.normalize.as_ref().map(|n| n.std.clone()),
            random: f
                .transforms
                .iter()
                .flatten()
                .skip_while(|t| !t.is_random())
                .copied()
                .collect(),
            seed: spec.seed,
        }
    }

    fn none(seed: u64) -> Pixels {
        Pixels {
            to_float: false,
            mean: None,
            std: None,
            random: Vec::new(),
            seed,
        }
    }

    /// Whether batches need [`Pixels::finish`].
    pub fn active(&self) -> bool {
        self.to_float || !self.random.is_empty()
    }

    /// The shape of features of shape `dims` (`[n, c, h, w]` for images)
    /// once the batch's crops have run.
    pub fn shape_after(&self, dims: &[i64]) -> Vec<i64> {
        let mut out = dims.to_vec();
        if out.len() == 4 {
            for t in &self.random {
                if let Transform::RandomCrop(s) | Transform::CenterCrop(s) = *t {
                    let s = i64::from(s);
                    out[2] = out[2].min(s);
                    out[3] = out[3].min(s);
                }
            }
        }
        out
    }

    /// A batch's features `x` (`[n, …]`, sample `i` with id `ids[i]`) as
    /// the model takes them; `train` draws the random transforms of
    /// `epoch`.
    pub fn finish(&self, x: Tensor, ids: &[u64], epoch: u64, train: bool) -> Tensor {
        let mut x = x;
        if train && !self.random.is_empty() && x.dim() == 4 {
            x = self.augment(&x, ids, epoch);
        }
        if !self.to_float {
            return x;
        }
        let scaled = x.kind() == Kind::Uint8;
        let mut x = x.to_kind(Kind::Float);
        if scaled {
            x /= 255.0;
        }
        if let (Some(mean), Some(std)) = (&self.mean, &self.std) {
            let shape = |v: &[f64]| -> Tensor {
                let t = Tensor::from_slice(&v.iter().map(|&a| a as f32).collect::<Vec<_>>());
                // One value per channel, the dimension after the batch.
                let mut dims = vec![1i64; x.dim().max(2)];
                dims[1] = v.len() as i64;
                t.reshape(dims.as_slice())
            };
            let (m, s) = if mean.len() == 1 {
                (Tensor::from(mean[0] as f32), Tensor::from(std[0] as f32))
            } else {
                (shape(mean), shape(std))
            };
            x = (x - m) / s;
        }
        x
    }

    /// Random crops and flips of `x` (`[n, c, h, w]`), per sample.
    fn augment(&self, x: &Tensor, ids: &[u64], epoch: u64) -> Tensor {
        let n = x.size()[0] as usize;
        let mut out = Vec::with_capacity(n);
        for (i, &id) in ids.iter().enumerate().take(n) {
            let mut rng = Rng::new(self.seed ^ 0xA11_6E57, epoch.wrapping_mul(0x9E37_79B9) ^ id);
            let mut s = x.get(i as i64);
            for t in &self.random {
                s = match *t {
                    Transform::RandomCrop(side) => {
                        let (h, w) = (s.size()[1], s.size()[2]);
                        let side = i64::from(side);
                        if side > h || side > w {
                            // Checked when the unit was decoded; a smaller
                            // image keeps its size and is caught there.
                            s
                        } else {
                            let top = rng.below((h - side + 1) as u64) as i64;
                            let left = rng.below((w - side + 1) as u64) as i64;
                            s.narrow(1, top, side).narrow(2, left, side)
                        }
                    }
                    Transform::HorizontalFlip(p) => {
                        if rng.unit() < p {
                            s.flip([2])
                        } else {
                            s
                        }
                    }
                    Transform::CenterCrop(side) => {
                        let (h, w, side) = (s.size()[1], s.size()[2], i64::from(side));
                        if side > h || side > w {
                            s
                        } else {
                            let mid = |d: i64| ((d - side) as f64 / 2.0).round_ties_even() as i64;
                            s.narrow(1, mid(h), side).narrow(2, mid(w), side)
                        }
                    }
                    // Refused after a random transform by the spec's check.
                    Transform::Resize(_) => s,
                };
            }
            out.push(s);
        }
        Tensor::stack(&out, 0)
    }
}
