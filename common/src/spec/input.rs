//! The job spec's wire types: [`UncheckedJobSpec`] and everything it nests, as
//! users write them in JSON (unknown fields rejected at every level), with
//! their defaults and the values derived from them (shard and replica
//! counts, consistency mode; the memory estimate is in [`crate::model`],
//! beside the arithmetic). Nothing here is validated; that is
//! [`JobSpec::parse`](super::JobSpec::parse)'s job.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

// Not yet checked: decoding one proves only its shape. `JobSpec::parse`
// (or `from_json`, `from_stored`) makes the checked `JobSpec`, the name
// the OpenAPI document gives this type (on the wire there is one spec).
/// A training job as the user writes it. Optional fields have the defaults
/// shown; unknown fields anywhere are an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = JobSpec)]
pub struct UncheckedJobSpec {
    /// A human name (1–128 characters, no control characters).
    #[schema(example = "digits-mlp")]
    pub name: String,
    /// The model to train. A job names a model (with `dataset`, `loss`,
    /// `optimizer` and `batch_size`) or a `script`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSpec>,
    /// The data to train on (a model job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<DatasetSpec>,
    /// The loss (a model job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<Loss>,
    /// The optimizer and its learning-rate schedule (a model job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<OptimizerSpec>,
    /// Samples per worker per step (1–65536; a model job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u32>,
    /// A script job: the user's own PyTorch training script, run by every
    /// rank under torchrun's contract (instead of `model`, `dataset`,
    /// `loss`, `optimizer` and `batch_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<super::script::ScriptSpec>,
    /// A script job's inputs (at most 64 artifacts or allowed URLs),
    /// materialized read-only in each rank's sandbox at
    /// `TRAINYARD_INPUT_DIR`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// Passes over the training split (1–100000). Exactly one of `epochs`
    /// and `steps` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<u32>,
    /// Optimizer steps (1–100000000). Exactly one of `epochs` and `steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// How workers combine gradients; `auto` picks by the memory arithmetic.
    #[serde(default)]
    pub strategy: Strategy,
    /// How many workers: the job starts with `min` and grows to `max`.
    #[serde(default)]
    pub workers: WorkerRange,
    /// Parameter-server shards (1–256, default 1); only for `parameter_server`
    /// and `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter_servers: Option<u32>,
    /// Hot standbys per PS shard (0–1, default 0); only for
    /// `parameter_server` and `auto`. A standby runs on another executor,
    /// receives every update its shard applies (a sync shard publishes a
    /// version only once its standby has it) and takes over the shard when
    /// the shard's executor is lost: no update is lost. It costs one more
    /// executor's RAM per shard and one more copy of each update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// Update consistency of the PS pattern (default `sync`); only for
    /// `parameter_server` and `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<Consistency>,
    /// Gradients on the wire: `none` (fp32, the default) or `bf16` (half
    /// the bytes; sums still accumulate in fp32).
    #[serde(default)]
    pub compression: Compression,
    /// When checkpoints are written and how many are kept.
    #[serde(default)]
    pub checkpoint: CheckpointPolicy,
    /// Start from another job's committed checkpoint (the same model; any
    /// number of workers or PS shards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<ResumeFrom>,
    /// What each worker needs.
    #[serde(default)]
    pub resources: Resources,
    /// Fraction of the dataset held out for evaluation (0–0.5, default 0.1).
    #[serde(default = "default_eval_fraction")]
    pub eval_fraction: f64,
    /// Seed of initialisation, data split and shuffling.
    #[serde(default)]
    pub seed: u64,
    /// Queue priority (−1000–1000, default 0): higher is placed first.
    #[serde(default)]
    pub priority: i32,
    /// When a live role counts as stuck, and a rank as a straggler.
    #[serde(default)]
    pub watchdog: Watchdog,
    /// When the loss counts as diverged, and what then happens.
    #[serde(default)]
    pub divergence: Divergence,
    /// How an `async` or `bounded` PS shard applies a gradient computed on
    /// older values than its own (default: the staleness-aware rules
    /// below); only for `parameter_server` and `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_updates: Option<StaleUpdates>,
    /// When an `async` or `bounded` PS job ends (default `all`); only for
    /// `parameter_server` and `auto`, with such a consistency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Until>,
    /// Experiment trackers the job is logged to (MLflow); see
    /// [`Tracking`](super::Tracking).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<super::Tracking>,
}

/// When a job's loss counts as diverged: a step whose loss is not finite,
/// or `window_steps` steps in a row (rank 0's) whose loss is above
/// `factor` × the loss's early value (the smallest of the job's first five
/// steps). A diverged job gets a `diverged` event; with `action: fail` (the
/// default) it fails with that reason, with `warn` it goes on. A loss that
/// is not finite always fails the job: the weights it produced are not
/// finite either.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Divergence {
    /// What a divergence does (default `fail`).
    #[serde(default)]
    pub action: DivergenceAction,
    /// How many times its early value the loss must stay above (1.5–1e6,
    /// default 3).
    #[serde(default = "default_divergence_factor")]
    pub factor: f64,
    /// Steps in a row the loss must stay above it (1–100000, default 50).
    #[serde(default = "default_divergence_window")]
    pub window_steps: u32,
}

fn default_divergence_factor() -> f64 {
    3.0
}

fn default_divergence_window() -> u32 {
    50
}

impl Default for Divergence {
    fn default() -> Self {
        Divergence {
            action: DivergenceAction::Fail,
            factor: default_divergence_factor(),
            window_steps: default_divergence_window(),
        }
    }
}

/// What a diverged loss does to its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceAction {
    /// The job fails with the `diverged` reason.
    #[default]
    Fail,
    /// A `diverged` event and a warning in the log; training goes on.
    Warn,
}

/// How an `async` or `bounded` PS shard applies a gradient that is `s`
/// versions stale (the shard applied `s` updates since the values it was
/// computed on). See docs/users/parameter-server.md for what each rule
/// does and costs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StaleUpdates {
    /// The learning rate of a stale update (default `share`).
    #[serde(default)]
    pub lr: StaleLr,
    /// The momentum (optimizer `momentum`) under asynchrony (default
    /// `as_given`).
    #[serde(default)]
    pub momentum: AsyncMomentum,
    /// Delay compensation's λ (DC-ASGD, Zheng et al. 2017; 0–10, default
    /// 0: off): the gradient `g` becomes `g + λ·g⊙g⊙(w − w')`, `w'` the
    /// values it was computed on.
    #[serde(default)]
    pub delay_compensation: f64,
    /// The final model's buffers (BatchNorm's running statistics; default
    /// `recompute`).
    #[serde(default)]
    pub buffers: AsyncBuffers,
}

/// The buffers (BatchNorm's running statistics) an `async` or `bounded`
/// job's final model holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AsyncBuffers {
    /// Recomputed on the final weights by worker rank 0 (forwards in
    /// training mode over up to 50 of its training batches, as PyTorch's
    /// `update_bn` does), so that they go with the weights they are
    /// saved with.
    #[default]
    Recompute,
    /// Worker rank 0's last pushed values, gathered by its forwards on
    /// the (staler) weights it had pulled.
    AsPushed,
}

impl Default for StaleUpdates {
    fn default() -> Self {
        StaleUpdates {
            lr: StaleLr::Share,
            momentum: AsyncMomentum::AsGiven,
            delay_compensation: 0.0,
            buffers: AsyncBuffers::Recompute,
        }
    }
}

/// The learning rate of an update `s` versions stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StaleLr {
    /// `lr / M` for `M` workers: `M` pushes, one from each worker, move
    /// the values as far as one sync step over their batches together, so
    /// every sample weighs what it weighs in the sync job of the same spec
    /// (and the straggler's pushes no more than the others'); `lr / √M`
    /// for Adam and AdamW, whose step follows the gradient's
    /// signal-to-noise ratio (the square-root scaling rule).
    #[default]
    Share,
    /// The schedule's `lr`, whatever the staleness: each push is a full
    /// step of one worker's batch, so the values move `M` times as far
    /// per sample as in the sync job.
    Plain,
    /// `lr / (1 + s)` (staleness-aware async SGD, Zhang et al. 2016): a
    /// straggler's gradient, many versions old, takes a small step. With
    /// `M` workers a push is typically about `M` versions stale, so every
    /// step shrinks about `M + 1` times: measured, it under-trains with 4
    /// workers (docs/users/parameter-server.md).
    Scale,
}

/// When an `async` or `bounded` PS job ends. Each worker walks a share of
/// the data of its own (a sync job's workers walk one stream together, so
/// there it does not arise). See docs/users/parameter-server.md for what
/// each costs, measured with a straggler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Until {
    /// Once every worker has walked its share: every sample is trained
    /// for every epoch, and the job takes as long as its slowest worker.
    #[default]
    All,
    /// Once the first worker has walked its share: a slower worker's rest
    /// of the epoch is not trained, and the job ends with its fastest.
    First,
}

/// The momentum of a `momentum` optimizer under asynchrony.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AsyncMomentum {
    /// The spec's momentum as it is.
    #[default]
    AsGiven,
    /// The spec's momentum less what asynchrony adds by itself
    /// (Mitliagkas et al. 2016, "Asynchrony begets momentum": `1 − 1/(1 + s̄)`
    /// for a mean staleness `s̄`), at least 0. It cuts the push's
    /// effective rate `lr/(1 − μ)` several times: a full-rate push (`lr:
    /// plain`) is then tamer, and most recipes under-train
    /// (docs/users/parameter-server.md).
    Compensate,
}

/// How the platform judges a role that is alive but not progressing.
///
/// A training role (a ring rank or a PS worker) that has been in its own
/// work (waiting for data or computing, not waiting on peers) for longer
/// than `max(stuck_factor × its median step time, stuck_floor_seconds)` is
/// declared stuck: the job leaves its executor (other jobs keep it) and
/// the rank is placed elsewhere. In sync modes a rank whose own work per
/// step is at least `straggler_factor` times the median of the other
/// ranks', over its last `window_steps` steps, is a straggler: shown in the
/// metrics, and left out at the next generation when `exclude_stragglers`
/// is set and the job, still at or above `workers.min`, trains faster
/// without it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Watchdog {
    /// Median step times without a step before a role is stuck (2–10000,
    /// default 20).
    #[serde(default = "default_stuck_factor")]
    pub stuck_factor: f64,
    /// Least time without a step before a role is stuck (1–86400 s,
    /// default 60).
    #[serde(default = "default_stuck_floor")]
    pub stuck_floor_seconds: f64,
    /// How many times slower than the others' median a straggler's own
    /// work is (1.1–1000, default 2).
    #[serde(default = "default_straggler_factor")]
    pub straggler_factor: f64,
    /// Recent steps the step-time figures are over (5–10000, default 50).
    #[serde(default = "default_window_steps")]
    pub window_steps: u32,
    /// Leave a persistent straggler out at the next generation (default
    /// false: only show it).
    #[serde(default)]
    pub exclude_stragglers: bool,
}

fn default_stuck_factor() -> f64 {
    20.0
}

fn default_stuck_floor() -> f64 {
    60.0
}

fn default_straggler_factor() -> f64 {
    2.0
}

fn default_window_steps() -> u32 {
    50
}

impl Default for Watchdog {
    fn default() -> Self {
        Watchdog {
            stuck_factor: default_stuck_factor(),
            stuck_floor_seconds: default_stuck_floor(),
            straggler_factor: default_straggler_factor(),
            window_steps: default_window_steps(),
            exclude_stragglers: false,
        }
    }
}

impl Watchdog {
    /// Seconds in its own work without a step after which a role whose
    /// median step takes `median_step_s` is stuck.
    pub fn stuck_after(&self, median_step_s: f64) -> f64 {
        (self.stuck_factor * median_step_s.max(0.0)).max(self.stuck_floor_seconds)
    }
}

fn default_eval_fraction() -> f64 {
    0.1
}

/// A built-in model sized by its fields, or a TorchScript file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSpec {
    /// Fully connected layers with ReLU between them.
    #[schema(title = "MlpModel")]
    Mlp(MlpSpec),
    /// 3×3 convolutions, each followed by ReLU and 2×2 max-pooling, then two
    /// linear layers.
    #[schema(title = "CnnModel")]
    Cnn(CnnSpec),
    /// A character-level decoder-only transformer language model.
    #[schema(title = "TransformerModel")]
    Transformer(TransformerSpec),
    /// A TorchScript module (`torch.jit.script(model).save(...)`) at a URL.
    #[schema(title = "TorchscriptModel")]
    Torchscript(TorchscriptSpec),
}

/// Sizes of an MLP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MlpSpec {
    /// Input features.
    #[schema(example = 64)]
    pub inputs: u32,
    /// Widths of the hidden layers (at most 32).
    #[serde(default)]
    #[schema(example = json!([128, 64]))]
    pub hidden: Vec<u32>,
    /// Outputs (classes, or regression targets).
    #[schema(example = 10)]
    pub outputs: u32,
}

/// Sizes of a small CNN for image tensors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CnnSpec {
    /// Image channels.
    pub channels: u32,
    /// Image height.
    pub height: u32,
    /// Image width.
    pub width: u32,
    /// Output channels of each convolution (1–8 of them).
    pub conv_channels: Vec<u32>,
    /// Width of the hidden linear layer.
    pub hidden: u32,
    /// Classes.
    pub classes: u32,
}

/// Sizes of a transformer language model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransformerSpec {
    /// Vocabulary size (256 for bytes).
    pub vocab: u32,
    /// Context length in tokens.
    pub context: u32,
    /// Transformer blocks.
    pub layers: u32,
    /// Attention heads; `width` must be a multiple.
    pub heads: u32,
    /// Model width.
    pub width: u32,
}

/// A TorchScript model file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TorchscriptSpec {
    /// Object-store URL of the `.pt` file.
    #[schema(example = "s3://models/net.pt")]
    pub url: String,
}

/// A built-in generator or a file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
// A spec is parsed once per job and cloned rarely; boxing the file variant
// would only make every match on it noisier.
#[allow(clippy::large_enum_variant)]
pub enum DatasetSpec {
    /// Gaussian clusters, one per class.
    #[schema(title = "ClassificationDataset")]
    Classification(ClassificationData),
    /// A noisy random linear map.
    #[schema(title = "RegressionDataset")]
    Regression(RegressionData),
    /// Generated text for language models.
    #[schema(title = "TextDataset")]
    Text(TextData),
    /// A file at an object-store URL.
    #[schema(title = "FileDataset")]
    File(FileData),
}

/// A generated classification set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClassificationData {
    /// Samples.
    pub samples: u64,
    /// Features per sample.
    pub features: u32,
    /// Classes.
    pub classes: u32,
}

/// A generated regression set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegressionData {
    /// Samples.
    pub samples: u64,
    /// Features per sample.
    pub features: u32,
    /// Targets per sample (default 1).
    #[serde(default = "one")]
    pub targets: u32,
}

fn one() -> u32 {
    1
}

/// Generated text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TextData {
    /// Characters of text.
    pub characters: u64,
}

/// A dataset file, or a sharded dataset: a glob over many objects or a
/// manifest listing them, streamed shard by shard within a memory budget
/// (see docs/users/datasets.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FileData {
    /// Object-store URL of one file, a glob whose last segment may hold
    /// `*` (`s3://bucket/train/part-*.parquet`), or a manifest (`.json`:
    /// `{"shards": [{"url", "samples", "sha256"?}]}`).
    #[schema(example = "file:///data/digits.npz")]
    pub url: String,
    /// File format of the file or of every shard; taken from the URL's
    /// extension when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<FileFormat>,
    /// Held-out data (a file, glob or manifest, like `url`); without it
    /// `eval_fraction` of the samples (of the shards, for a sharded
    /// dataset, chosen by the seed) is held out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_url: Option<String>,
    /// Parquet: the feature columns, numeric, or one fixed-size-list
    /// column (default `["x"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_columns: Option<Vec<String>>,
    /// Parquet: the label column (default `y`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub y_column: Option<String>,
    /// An integer column (Parquet) or array (npz) of sample ids, used in
    /// the per-epoch accounting of a sharded dataset (default: the sample's
    /// position in the sorted shard list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_column: Option<String>,
    /// Sharded datasets: samples of the in-memory shuffle buffer (1 to
    /// 2^24, default 8192).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle_buffer: Option<u64>,
    /// Sharded datasets: MiB the loaded data may use on each worker (16 to
    /// 1 TiB; default the executor's `--data-memory-mb`, 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Makes the features floats: uint8 values (pixels) are divided by
    /// 255, then each channel (dimension 1) has `mean` subtracted and is
    /// divided by `std`, as torchvision's `ToTensor` and `Normalize` do.
    /// Without it, integer features stay integers (int64) for a TorchScript
    /// model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<Normalize>,
    /// Images: the transforms, in order (resize and center crops first,
    /// then the seeded random ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transforms: Option<Vec<Transform>>,
    /// A TorchScript model whose `forward` takes several tensors
    /// (`forward(self, ids, mask)`): the arrays (npz, safetensors) or
    /// columns (Parquet) to pass, in the order of its arguments, named as
    /// the arguments are (inspection checks them against the signature).
    /// Each input has the same shape per sample; they are passed as
    /// float32 when one is floating-point, as booleans when all are, else
    /// as int64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Vec<String>>,
    /// Images: 3 (RGB, the default) or 1 (grayscale) channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<u32>,
}

/// Per-channel normalization: `(x - mean) / std`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Normalize {
    /// One mean per channel (or one for all).
    #[schema(example = json!([0.485, 0.456, 0.406]))]
    pub mean: Vec<f64>,
    /// One standard deviation per channel (or one for all), each > 0.
    #[schema(example = json!([0.229, 0.224, 0.225]))]
    pub std: Vec<f64>,
}

/// An image transform, as torchvision names it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Transform {
    /// The shorter side to this many pixels, keeping the aspect
    /// (bilinear, with antialiasing when shrinking).
    #[schema(title = "ResizeTransform")]
    Resize(u32),
    /// The central square of this side.
    #[schema(title = "CenterCropTransform")]
    CenterCrop(u32),
    /// A square of this side at a seeded random place, per sample and
    /// epoch.
    #[schema(title = "RandomCropTransform")]
    RandomCrop(u32),
    /// A left-right flip with this probability, seeded per sample and
    /// epoch.
    #[schema(title = "HorizontalFlipTransform")]
    HorizontalFlip(f64),
}

impl Transform {
    /// Whether it draws from the seed (applied at every epoch anew).
    pub fn is_random(&self) -> bool {
        matches!(
            self,
            Transform::RandomCrop(_) | Transform::HorizontalFlip(_)
        )
    }
}

impl FileData {
    /// One file at `url`, format from its extension.
    pub fn at(url: impl Into<String>) -> FileData {
        FileData {
            url: url.into(),
            format: None,
            eval_url: None,
            x_columns: None,
            y_column: None,
            id_column: None,
            shuffle_buffer: None,
            memory_mb: None,
            normalize: None,
            transforms: None,
            inputs: None,
            channels: None,
        }
    }

    /// Whether the data is read shard by shard (a glob, a manifest,
    /// Parquet or images) rather than loaded whole.
    pub fn is_sharded(&self) -> bool {
        is_glob(&self.url)
            || is_manifest(&self.url)
            || self.format_or_guess().is_some_and(FileFormat::is_streamed)
    }

    /// The format given, else the one the URL's extension names.
    pub fn format_or_guess(&self) -> Option<FileFormat> {
        self.format.or_else(|| file_format_from_url(&self.url))
    }

    /// Image channels (3 unless given).
    pub fn image_channels(&self) -> u32 {
        self.channels.unwrap_or(3)
    }
}

/// Whether a data URL is a glob (its last segment holds `*`).
pub fn is_glob(url: &str) -> bool {
    url.rsplit('/').next().is_some_and(|s| s.contains('*'))
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters (none included) and everything else for itself.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, rest) = parts.split_first().expect("split yields one part");
    let Some(mut left) = name.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return left.is_empty();
    };
    for part in middle {
        match left.find(part) {
            Some(i) => left = &left[i + part.len()..],
            None => return false,
        }
    }
    left.len() >= last.len() && left.ends_with(last)
}

/// Whether a data URL names a manifest of shards (`.json`).
pub fn is_manifest(url: &str) -> bool {
    !is_glob(url) && url.to_ascii_lowercase().ends_with(".json")
}

/// Dataset file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileFormat {
    /// NumPy `.npz` with arrays `x` and `y`.
    Npz,
    /// `.safetensors` with tensors `x` and `y`.
    Safetensors,
    /// Plain text, for the language model.
    Text,
    /// Apache Parquet (any codec) with the columns `x_columns` and
    /// `y_column` name.
    Parquet,
    /// A folder of images (JPEG, PNG) with one subfolder per class, as
    /// torchvision's `ImageFolder` lays them out; the URL ends in `/`.
    ImageFolder,
    /// WebDataset tar shards: `key.jpg` (or `.jpeg`, `.png`) beside
    /// `key.cls`, the class id in ASCII.
    Webdataset,
}

impl FileFormat {
    /// Whether it is always read shard by shard.
    pub fn is_streamed(self) -> bool {
        matches!(
            self,
            FileFormat::Parquet | FileFormat::ImageFolder | FileFormat::Webdataset
        )
    }

    /// Whether its samples are images.
    pub fn is_image(self) -> bool {
        matches!(self, FileFormat::ImageFolder | FileFormat::Webdataset)
    }
}

/// Training loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Cross-entropy over class logits (classification, language models).
    CrossEntropy,
    /// Mean squared error (regression).
    Mse,
}

/// Optimizer kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    /// Plain SGD.
    Sgd,
    /// SGD with momentum.
    Momentum,
    /// Adam (weight decay added to the gradient).
    Adam,
    /// AdamW (decoupled weight decay).
    Adamw,
}

/// Optimizer settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OptimizerSpec {
    /// The algorithm.
    pub kind: OptimizerKind,
    /// Peak learning rate (0 < lr ≤ 10).
    #[schema(example = 0.001)]
    pub lr: f64,
    /// Weight decay (0–1, default 0).
    #[serde(default)]
    pub weight_decay: f64,
    /// Momentum (0–1, default 0.9); only for `momentum`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f64>,
    /// Adam's β₁ and β₂ (each in [0, 1), default [0.9, 0.999]); only for
    /// `adam` and `adamw`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub betas: Option<[f64; 2]>,
    /// Learning-rate schedule (default constant).
    #[serde(default)]
    pub schedule: Schedule,
    /// Clip the global gradient norm to this value (> 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_clip: Option<f64>,
}

/// Learning-rate schedule.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Schedule {
    /// The same rate throughout.
    #[default]
    #[schema(title = "ConstantSchedule")]
    Constant,
    /// Linear warm-up to `lr`, then cosine decay to zero at the last step.
    #[schema(title = "WarmupCosineSchedule")]
    WarmupCosine {
        /// Steps of linear warm-up.
        warmup_steps: u64,
    },
}

/// How workers combine their gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Sharded parameter servers hold weights and optimizer state.
    ParameterServer,
    /// Every worker holds the model; gradients are summed around a ring.
    Allreduce,
    /// `allreduce` when a replica with its optimizer state fits a worker's
    /// memory, otherwise `parameter_server`.
    #[default]
    Auto,
}

/// Bounds of the worker count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerRange {
    /// Workers needed to start (1–1024).
    pub min: u32,
    /// Workers the job grows to (min–1024).
    pub max: u32,
}

impl Default for WorkerRange {
    fn default() -> Self {
        WorkerRange { min: 1, max: 1 }
    }
}

/// How gradients travel between workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// fp32, exact.
    #[default]
    None,
    /// bfloat16 (round to nearest even) on the wire, fp32 accumulation.
    Bf16,
}

/// Update consistency of the parameter-server pattern. Its OpenAPI schema
/// is `ConsistencySchema`'s (see there why).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Consistency {
    /// Each shard averages one gradient from every worker per version.
    Sync,
    /// Gradients are applied as they arrive.
    Async,
    /// Accepted iff `current_version − gradient_version ≤ staleness`.
    Bounded {
        /// Largest accepted version lag (0–10000).
        staleness: u32,
    },
}

// The schema `Consistency` publishes: the same wire format, with the
// `bounded` mode's settings a named schema of their own. utoipa inlines a
// struct variant's fields into the union, and client generators then name
// (or, like openapi-python-client, fail to name) a model for them; a named
// payload and a title per variant give every variant a model of its own.
// Only its schema and, in tests, its serialization (checked equal to
// `Consistency`'s) are used. Its doc comment is the published description.
/// Update consistency of the parameter-server pattern.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // Built only by the wire-format test.
pub(crate) enum ConsistencySchema {
    /// Each shard averages one gradient from every worker per version.
    #[schema(title = "SyncConsistency")]
    Sync,
    /// Gradients are applied as they arrive.
    #[schema(title = "AsyncConsistency")]
    Async,
    /// Accepted iff `current_version − gradient_version ≤ staleness`.
    #[schema(title = "BoundedConsistency")]
    Bounded(StalenessBound),
}

/// The `bounded` consistency mode's settings.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StalenessBound {
    /// Largest accepted version lag (0–10000).
    pub staleness: u32,
}

impl utoipa::PartialSchema for Consistency {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <ConsistencySchema as utoipa::PartialSchema>::schema()
    }
}

impl ToSchema for Consistency {
    fn name() -> std::borrow::Cow<'static, str> {
        "Consistency".into()
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        <ConsistencySchema as ToSchema>::schemas(schemas)
    }
}

#[cfg(test)]
mod consistency_schema_tests {
    use super::*;
    use serde_json::json;

    /// The published form of each mode; exhaustive, so a new mode does not
    /// compile until the schema has it too.
    fn published(c: Consistency) -> ConsistencySchema {
        match c {
            Consistency::Sync => ConsistencySchema::Sync,
            Consistency::Async => ConsistencySchema::Async,
            Consistency::Bounded { staleness } => {
                ConsistencySchema::Bounded(StalenessBound { staleness })
            }
        }
    }

    /// The schema-only type serializes exactly as the wire type does, and
    /// the wire type refuses the unknown fields the schema refuses.
    #[test]
    fn the_published_schema_has_the_wire_format() {
        for c in [
            Consistency::Sync,
            Consistency::Async,
            Consistency::Bounded { staleness: 7 },
        ] {
            let wire = serde_json::to_value(c).unwrap();
            assert_eq!(serde_json::to_value(published(c)).unwrap(), wire, "{c:?}");
            assert_eq!(serde_json::from_value::<Consistency>(wire).unwrap(), c);
        }
        assert_eq!(
            serde_json::to_value(Consistency::Bounded { staleness: 3 }).unwrap(),
            json!({"bounded": {"staleness": 3}})
        );
        let extra = json!({"bounded": {"staleness": 3, "lag": 1}});
        assert!(serde_json::from_value::<Consistency>(extra).is_err());
    }
}

/// Which checkpoint a new job starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeFrom {
    /// The job whose checkpoint it is.
    pub job_id: uuid::Uuid,
    /// Its step (default: that job's newest committed checkpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

/// Checkpoint policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointPolicy {
    /// Checkpoint every N steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_steps: Option<u64>,
    /// Checkpoint every T seconds (at most a week).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_seconds: Option<u64>,
    /// Newest checkpoints kept (1–1000, default 3).
    #[serde(default = "default_keep")]
    pub keep: u32,
    /// Write a checkpoint when training ends (default true).
    #[serde(default = "yes")]
    pub at_end: bool,
}

fn default_keep() -> u32 {
    3
}

fn yes() -> bool {
    true
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy {
            every_steps: None,
            every_seconds: None,
            keep: default_keep(),
            at_end: true,
        }
    }
}

/// Where a worker trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// CPU.
    #[default]
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
}

/// What each worker needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Device kind.
    #[serde(default)]
    pub device: Device,
    /// Memory per worker and per PS shard, in MiB (16 MiB–4 TiB, default 1024).
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u64,
}

fn default_memory_mb() -> u64 {
    1024
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            device: Device::Cpu,
            memory_mb: default_memory_mb(),
        }
    }
}

impl UncheckedJobSpec {
    /// Parameter-server shards (1 unless given).
    pub fn parameter_server_count(&self) -> u32 {
        self.parameter_servers.unwrap_or(1)
    }

    /// Hot standbys per PS shard (0 unless given).
    pub fn ps_replicas(&self) -> u32 {
        self.replicas.unwrap_or(0)
    }

    /// The consistency mode (sync unless given).
    pub fn consistency_mode(&self) -> Consistency {
        self.consistency.unwrap_or(Consistency::Sync)
    }

    /// When an out-of-sync PS job ends (`all` unless given).
    pub fn until_mode(&self) -> Until {
        self.until.unwrap_or_default()
    }

    /// Whether the PS shards wait for every worker's gradient (sync).
    pub fn is_sync(&self) -> bool {
        self.consistency_mode() == Consistency::Sync
    }

    pub(super) fn memory_bytes(&self) -> u64 {
        self.resources.memory_mb.saturating_mul(1 << 20)
    }
}

/// The format a dataset URL's extension names, if any (a URL that ends in
/// `/` names an image folder).
pub fn file_format_from_url(url: &str) -> Option<FileFormat> {
    if url.ends_with('/') {
        return Some(FileFormat::ImageFolder);
    }
    let ext = url
        .rsplit('/')
        .next()?
        .rsplit_once('.')?
        .1
        .to_ascii_lowercase();
    match ext.as_str() {
        "npz" => Some(FileFormat::Npz),
        "safetensors" => Some(FileFormat::Safetensors),
        "txt" | "text" => Some(FileFormat::Text),
        "parquet" | "pq" => Some(FileFormat::Parquet),
        "tar" => Some(FileFormat::Webdataset),
        _ => None,
    }
}
