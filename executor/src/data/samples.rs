//! What whole datasets ([`super::dataset`]) and sharded ones
//! ([`super::Sharded`]) both serve: the data, the cursor, one worker's
//! batch, the split of a step among the ranks, the check that data fits the
//! model, and the error.
//!
//! It imports neither of them, so that both can build on it one way.

use tch::{Kind, Tensor};
use trainyard_common::spec::{Loss, ModelSpec, UncheckedJobSpec};

/// Why data could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The URL could not be read.
    #[error("cannot read dataset {url}: {reason}")]
    Unreadable {
        /// The dataset URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The contents do not fit the model or the loss.
    #[error("dataset does not fit the model: {0}")]
    Shape(String),
}

/// Inputs and targets, all on the CPU.
pub enum Data {
    /// `x` `[n, features…]` (float32, or integers: see `input_kind`), `y`
    /// `[n]` int64 (classes) or `[n, targets]` float.
    Tensors {
        /// Inputs.
        x: Tensor,
        /// Targets.
        y: Tensor,
    },
    /// A token stream (bytes) for language models.
    Text(Tensor),
}

/// Where training stands in the data: the epoch and how many samples of its
/// permutation the steps so far have consumed (all workers together).
/// Cursors order by epoch, then offset: the earlier is less.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    /// Epoch, from 0.
    pub epoch: u64,
    /// Samples of the epoch consumed.
    pub offset: u64,
}

/// One worker's share of one step.
pub struct Batch {
    /// Inputs (undefined when `samples` is 0).
    pub x: Tensor,
    /// Targets (undefined when `samples` is 0).
    pub y: Tensor,
    /// Samples in this batch (0 at the ragged end of an epoch).
    pub samples: usize,
    /// The cursor after this step.
    pub next: Cursor,
    /// The wrapping sum of [`super::order::id_mix`] over the batch's
    /// sample ids: the epoch's accounting.
    pub id_hash: u64,
}

/// The positions in the epoch's order that worker `rank` of `world` trains
/// on at the step that starts at `cursor`, and the cursor after the step.
///
/// A step consumes `world × batch` consecutive samples of the epoch's order
/// (fewer at its end); rank `r` takes the `r`-th run of `batch`. The cursor
/// is global, so after a membership change the remaining samples of the
/// epoch are split among the new workers and none is lost or repeated.
pub fn slice(
    len: usize,
    batch: usize,
    rank: u32,
    world: u32,
    cursor: Cursor,
) -> (std::ops::Range<usize>, Cursor) {
    let at = (cursor.offset as usize).min(len);
    let start = (at + rank as usize * batch).min(len);
    let end = (start + batch).min(len);
    let after = at + world.max(1) as usize * batch;
    let next = if after >= len {
        Cursor {
            epoch: cursor.epoch + 1,
            offset: 0,
        }
    } else {
        Cursor {
            epoch: cursor.epoch,
            offset: after as u64,
        }
    };
    (start..end, next)
}

/// The dtype features are kept in: floats as float32 (the parameters'
/// dtype); integers and booleans as they are when the batch converts them
/// ([`super::pixels`]: images, `normalize`), else as int64 (token ids)
/// and booleans (masks) for a TorchScript model, which takes what the
/// file holds, and as float32 for a built-in model, which takes floats.
fn input_kind(spec: &UncheckedJobSpec, x: Tensor) -> Tensor {
    if x.is_floating_point() {
        return x.to_kind(Kind::Float);
    }
    if super::pixels::Pixels::of(spec).to_float {
        return x;
    }
    match (spec.model(), x.kind()) {
        (ModelSpec::Torchscript(_), Kind::Bool) => x,
        (ModelSpec::Torchscript(_), _) => x.to_kind(Kind::Int64),
        _ => x.to_kind(Kind::Float),
    }
}

/// Checks that the data fits the model and the loss; converts kinds.
pub(super) fn check(spec: &UncheckedJobSpec, data: Data) -> Result<Data, DataError> {
    match data {
        Data::Text(t) => match &spec.model() {
            ModelSpec::Transformer(m)
                if m.vocab >= 256 || t.max().int64_value(&[]) < i64::from(m.vocab) =>
            {
                Ok(Data::Text(t))
            }
            ModelSpec::Transformer(m) => Err(DataError::Shape(format!(
                "text has byte values ≥ the model's vocab ({})",
                m.vocab
            ))),
            _ => Err(DataError::Shape("text data trains a transformer".into())),
        },
        Data::Tensors { x, y } => {
            let (xs, ys) = (x.size(), y.size());
            if xs.is_empty() || ys.is_empty() || xs[0] != ys[0] {
                return Err(DataError::Shape(format!(
                    "x has shape {xs:?} and y {ys:?}: they need the same number of samples"
                )));
            }
            // The features the model gets: after the batch's crops.
            let features: i64 = super::pixels::Pixels::of(spec).shape_after(&xs)[1..]
                .iter()
                .product();
            let want = match &spec.model() {
                ModelSpec::Mlp(m) => Some(i64::from(m.inputs)),
                ModelSpec::Cnn(c) => Some(i64::from(c.channels * c.height * c.width)),
                ModelSpec::Transformer(_) => {
                    return Err(DataError::Shape(
                        "a transformer trains on text, not x/y tensors".into(),
                    ))
                }
                ModelSpec::Torchscript(_) => None,
            };
            if let Some(w) = want.filter(|&w| w != features) {
                return Err(DataError::Shape(format!(
                    "x has {features} features per sample (shape {xs:?}) but the model takes {w}"
                )));
            }
            let x = input_kind(spec, x);
            let y = match spec.loss() {
                Loss::CrossEntropy => {
                    let y = y.to_kind(Kind::Int64).flatten(0, -1);
                    if y.size()[0] != xs[0] {
                        return Err(DataError::Shape(format!(
                            "cross_entropy needs one class id per sample; y has shape {ys:?}"
                        )));
                    }
                    let classes = match &spec.model() {
                        ModelSpec::Mlp(m) => Some(i64::from(m.outputs)),
                        ModelSpec::Cnn(c) => Some(i64::from(c.classes)),
                        _ => None,
                    };
                    let (lo, hi) = (y.min().int64_value(&[]), y.max().int64_value(&[]));
                    if lo < 0 || classes.is_some_and(|k| hi >= k) {
                        return Err(DataError::Shape(format!(
                            "class ids span {lo}..={hi}, outside 0..{}",
                            classes.unwrap_or(0)
                        )));
                    }
                    y
                }
                Loss::Mse => {
                    let y = y.to_kind(Kind::Float);
                    if ys.len() == 1 {
                        y.unsqueeze(1)
                    } else {
                        y
                    }
                }
            };
            Ok(Data::Tensors { x, y })
        }
    }
}
