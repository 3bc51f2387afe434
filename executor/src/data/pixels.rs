//! What happens to a batch's features as the batch is assembled: the
//! seeded random image transforms (random crop, horizontal flip), drawn
//! per sample and epoch from the sample's id so that a job is reproducible
//! whatever the workers, and the conversion of pixels to floats (uint8 ÷
//! 255, then the spec's per-channel `normalize`). Decoded data stays in
//! its compact dtype in the loader's caches; only batches are floats.
//!
//! Images keep their own sizes until the batch's crops (torchvision's
//! `Resize(n)` keeps the aspect; its `RandomCrop` then cuts one size), so
//! a batch of images is assembled from a list here. Held-out batches get
//! the deterministic counterparts: a random crop becomes a center crop,
//! and nothing is flipped, as torchvision's evaluation transforms do.

use super::rng::Rng;

/// Why an image could not be transformed as the spec's transforms say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    /// A resize past the largest side an image may have.
    #[error("resizing {w}×{h} to {nw}×{nh} exceeds {max} pixels a side")]
    TooLarge {
        /// Its width.
        w: u32,
        /// Its height.
        h: u32,
        /// The width asked.
        nw: u32,
        /// The height asked.
        nh: u32,
        /// The most a side may have.
        max: u32,
    },
    /// A center crop larger than the decoded image.
    #[error("is {w}×{h}, smaller than center_crop {side}")]
    SmallerThanCenterCrop {
        /// Its width.
        w: u32,
        /// Its height.
        h: u32,
        /// The crop's side.
        side: u32,
    },
    /// A random transform where only fixed ones run (decoding).
    #[error("random transforms run per batch, not at decoding")]
    RandomAtDecoding,
    /// A batch's crop larger than an image.
    #[error("an image is {w}×{h} where the transforms crop {side}×{side}; resize it to at least {side} first")]
    SmallerThanCrop {
        /// Its width.
        w: i64,
        /// Its height.
        h: i64,
        /// The crop's side.
        side: i64,
    },
    /// Images of more than one size after the transforms.
    #[error("images of sizes {first:?} and {other:?} (channels, height, width) after the transforms; every sample needs one size: end the transforms with a center_crop or random_crop (e.g. [{{\"resize\": 36}}, {{\"random_crop\": 32}}])")]
    MixedSizes {
        /// The first sample's size.
        first: Vec<i64>,
        /// Another's.
        other: Vec<i64>,
    },
}
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

    /// A batch's features `x` (`[n, …]`) as the model takes them: floats
    /// (uint8 ÷ 255) normalized per channel, when the dataset asks.
    pub fn finish(&self, x: Tensor) -> Tensor {
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

    /// A batch of images (each `[c, h, w]`, uint8, sample `i` with id
    /// `ids[i]`) as the model takes them: `train` draws the random
    /// transforms of `epoch` per sample; held-out batches get their
    /// deterministic counterparts (a random crop becomes a center crop, no
    /// flip), as torchvision's evaluation transforms do. The images must
    /// have one size by then; the error says what to add otherwise.
    pub fn finish_images(
        &self,
        samples: &[Tensor],
        ids: &[u64],
        epoch: u64,
        train: bool,
    ) -> Result<Tensor, TransformError> {
        let mut out = Vec::with_capacity(samples.len());
        for (s, &id) in samples.iter().zip(ids) {
            let mut rng = Rng::new(self.seed ^ 0xA11_6E57, epoch.wrapping_mul(0x9E37_79B9) ^ id);
            let mut s = s.shallow_clone();
            for t in &self.random {
                s = match *t {
                    Transform::RandomCrop(side) | Transform::CenterCrop(side) => {
                        let (h, w, side) = (s.size()[1], s.size()[2], i64::from(side));
                        if side > h || side > w {
                            return Err(TransformError::SmallerThanCrop { w, h, side });
                        }
                        let (top, left) = if train && matches!(t, Transform::RandomCrop(_)) {
                            (
                                rng.below((h - side + 1) as u64) as i64,
                                rng.below((w - side + 1) as u64) as i64,
                            )
                        } else {
                            let mid = |d: i64| ((d - side) as f64 / 2.0).round_ties_even() as i64;
                            (mid(h), mid(w))
                        };
                        s.narrow(1, top, side).narrow(2, left, side)
                    }
                    Transform::HorizontalFlip(p) => {
                        if train && rng.unit() < p {
                            s.flip([2])
                        } else {
                            s
                        }
                    }
                    // Refused after a random transform by the spec's check.
                    Transform::Resize(_) => s,
                };
            }
            out.push(s);
        }
        if let Some(first) = out.first() {
            if let Some(other) = out.iter().find(|o| o.size() != first.size()) {
                return Err(TransformError::MixedSizes {
                    first: first.size(),
                    other: other.size(),
                });
            }
        }
        Ok(self.finish(Tensor::stack(&out, 0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pixels(transforms: serde_json::Value, normalize: Option<serde_json::Value>) -> Pixels {
        let mut dataset = json!({"kind": "file", "url": "file:///d/", "transforms": transforms});
        if let Some(n) = normalize {
            dataset["normalize"] = n;
        }
        let s: trainyard_common::JobSpec = serde_json::from_value(json!({
            "name": "p", "model": {"kind": "torchscript", "url": "file:///m.pt"},
            "dataset": dataset, "loss": "cross_entropy",
            "optimizer": {"kind": "sgd", "lr": 0.1}, "batch_size": 4, "steps": 1, "seed": 7
        }))
        .unwrap();
        Pixels::of(&s.into())
    }

    /// `n` images `[1, 2, 3]` whose left column is 0 and right column 200.
    fn samples(n: i64) -> Vec<Tensor> {
        let row = Tensor::from_slice(&[0u8, 100, 200]);
        (0..n)
            .map(|_| row.view([1, 1, 3]).expand([1, 2, 3], false).contiguous())
            .collect()
    }

    #[test]
    fn flips_come_at_their_probability_per_sample_and_epoch() {
        let p = pixels(json!([{"horizontal_flip": 0.05}]), None);
        let n = 4000;
        let ids: Vec<u64> = (0..n as u64).collect();
        let flipped = |epoch: u64| -> Vec<bool> {
            let x = p.finish_images(&samples(n), &ids, epoch, true).unwrap();
            (0..n)
                .map(|i| x.get(i).double_value(&[0, 0, 0]) > 0.5)
                .collect()
        };
        let (e0, e1) = (flipped(0), flipped(1));
        for e in [&e0, &e1] {
            let share = e.iter().filter(|&&f| f).count() as f64 / n as f64;
            assert!((0.035..0.065).contains(&share), "{share}");
        }
        assert_ne!(e0, e1, "each epoch draws anew");
        assert_eq!(e0, flipped(0), "the same epoch draws the same");
        // Held-out batches are never flipped; pixels become [0, 1].
        let x = p.finish_images(&samples(n), &ids, 0, false).unwrap();
        assert!(x.select(3, 0).max().double_value(&[]) == 0.0);
        assert!((x.max().double_value(&[]) - 200.0 / 255.0).abs() < 1e-6);
    }

    #[test]
    fn random_crops_stay_inside_and_normalize_goes_per_channel() {
        let p = pixels(
            json!([{"random_crop": 2}]),
            Some(json!({"mean": [0.5, 0.0, 1.0], "std": [0.5, 1.0, 2.0]})),
        );
        // Images of three sizes, all at least the crop.
        let x: Vec<Tensor> = (0..64)
            .map(|i| Tensor::full([3, 2 + i % 3, 5], 255, (Kind::Uint8, tch::Device::Cpu)))
            .collect();
        let ids: Vec<u64> = (0..64).collect();
        let out = p.finish_images(&x, &ids, 3, true).unwrap();
        assert_eq!(out.size(), vec![64, 3, 2, 2]);
        let held_out = p.finish_images(&x, &ids, 3, false).unwrap();
        assert_eq!(
            held_out.size(),
            vec![64, 3, 2, 2],
            "a center crop in evaluation"
        );
        let small = [Tensor::zeros([3, 1, 5], (Kind::Uint8, tch::Device::Cpu))];
        let e = p
            .finish_images(&small, &[0], 0, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("resize it to at least 2"), "{e}");
        // (1 - mean) / std per channel.
        for (c, want) in [(0, 1.0), (1, 1.0), (2, 0.0)] {
            let v = out.select(1, c);
            assert!((v.max().double_value(&[]) - want).abs() < 1e-6);
            assert!((v.min().double_value(&[]) - want).abs() < 1e-6);
        }
        assert_eq!(p.shape_after(&[64, 3, 5, 5]), vec![64, 3, 2, 2]);
    }
}
