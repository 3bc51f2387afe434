//! The job spec: what a user submits, and its validation.
//!
//! [`JobSpecInput`] is the wire form (JSON, unknown fields rejected at every
//! level). [`JobSpec::parse`] checks every bound and every cross-field rule
//! and reports *all* violations at once, each naming its field by a path such
//! as `optimizer.lr` or `model.hidden[2]`. A [`JobSpec`] can be made in no
//! other way (deserializing one runs the same checks), so code that holds a
//! `JobSpec` never re-checks it. Limits are the named constants below.

use crate::model::{self, MemoryEstimate};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Deref;
use utoipa::ToSchema;

/// Longest job name.
pub const MAX_NAME_CHARS: usize = 128;
/// Longest object-store URL.
pub const MAX_URL_CHARS: usize = 2048;
/// Most hidden layers of an MLP.
pub const MAX_MLP_LAYERS: usize = 32;
/// Widest layer (inputs, outputs, hidden widths, classes).
pub const MAX_WIDTH: u32 = 1 << 20;
/// Most convolutions of the CNN.
pub const MAX_CNN_CONVS: usize = 8;
/// Largest image side.
pub const MAX_IMAGE_SIDE: u32 = 4096;
/// Most image channels.
pub const MAX_IMAGE_CHANNELS: u32 = 64;
/// Most transformer layers.
pub const MAX_TRANSFORMER_LAYERS: u32 = 96;
/// Most attention heads.
pub const MAX_HEADS: u32 = 128;
/// Largest transformer width.
pub const MAX_TRANSFORMER_WIDTH: u32 = 16_384;
/// Longest context.
pub const MAX_CONTEXT: u32 = 32_768;
/// Largest vocabulary.
pub const MAX_VOCAB: u32 = 1 << 18;
/// Most samples of a generated dataset.
pub const MAX_SAMPLES: u64 = 100_000_000;
/// Largest batch.
pub const MAX_BATCH: u32 = 1 << 16;
/// Most epochs.
pub const MAX_EPOCHS: u32 = 100_000;
/// Most steps.
pub const MAX_STEPS: u64 = 100_000_000;
/// Most workers of one job.
pub const MAX_WORKERS: u32 = 1024;
/// Most parameter-server shards of one job.
pub const MAX_PARAMETER_SERVERS: u32 = 256;
/// Most hot standbys of one parameter-server shard (`replicas`).
pub const MAX_PS_REPLICAS: u32 = 1;
/// Largest bounded staleness.
pub const MAX_STALENESS: u32 = 10_000;
/// Largest learning rate.
pub const MAX_LR: f64 = 10.0;
/// Longest checkpoint interval in seconds (a week).
pub const MAX_CHECKPOINT_SECONDS: u64 = 7 * 24 * 3600;
/// Most checkpoints kept.
pub const MAX_CHECKPOINTS_KEPT: u32 = 1000;
/// Smallest memory a role may ask for, in MiB.
pub const MIN_MEMORY_MB: u64 = 16;
/// Largest memory a role may ask for, in MiB (4 TiB).
pub const MAX_MEMORY_MB: u64 = 4 << 20;
/// Largest |priority|.
pub const MAX_PRIORITY: i32 = 1000;
/// Largest held-out fraction.
pub const MAX_EVAL_FRACTION: f64 = 0.5;
/// Object-store URL schemes a job may name.
pub const URL_SCHEMES: [&str; 7] = ["file", "s3", "gs", "az", "abfs", "http", "https"];

/// One broken rule of a job spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Violation {
    /// Path of the offending field, e.g. `optimizer.lr` or `model.hidden[2]`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Why a JSON document is not a job spec.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The bytes are not JSON.
    #[error("malformed JSON: {0}")]
    Syntax(String),
    /// JSON of the wrong shape: a missing or unknown field, or a wrong type.
    #[error("{}", .0[0])]
    Shape(Vec<Violation>),
    /// Well-formed, but some bounds or rules are broken.
    #[error("{} violation(s), first: {}", .0.len(), .0[0])]
    Invalid(Vec<Violation>),
}

impl SpecError {
    /// The violations, for the shape and rule errors.
    pub fn violations(&self) -> &[Violation] {
        match self {
            SpecError::Syntax(_) => &[],
            SpecError::Shape(v) | SpecError::Invalid(v) => v,
        }
    }
}

/// A training job as the user writes it. Optional fields have the defaults
/// shown; unknown fields anywhere are an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = JobSpec)]
pub struct JobSpecInput {
    /// A human name (1–128 characters, no control characters).
    #[schema(example = "digits-mlp")]
    pub name: String,
    /// The model to train.
    pub model: ModelSpec,
    /// The data to train on.
    pub dataset: DatasetSpec,
    /// The loss.
    pub loss: Loss,
    /// The optimizer and its learning-rate schedule.
    pub optimizer: OptimizerSpec,
    /// Samples per worker per step (1–65536).
    pub batch_size: u32,
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
}

fn default_eval_fraction() -> f64 {
    0.1
}

/// A built-in model sized by its fields, or a TorchScript file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSpec {
    /// Fully connected layers with ReLU between them.
    Mlp(MlpSpec),
    /// 3×3 convolutions, each followed by ReLU and 2×2 max-pooling, then two
    /// linear layers.
    Cnn(CnnSpec),
    /// A character-level decoder-only transformer language model.
    Transformer(TransformerSpec),
    /// A TorchScript module (`torch.jit.script(model).save(...)`) at a URL.
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DatasetSpec {
    /// Gaussian clusters, one per class.
    Classification(ClassificationData),
    /// A noisy random linear map.
    Regression(RegressionData),
    /// Generated text for language models.
    Text(TextData),
    /// A file at an object-store URL.
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

/// A dataset file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FileData {
    /// Object-store URL.
    #[schema(example = "file:///data/digits.npz")]
    pub url: String,
    /// File format; taken from the URL's extension when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<FileFormat>,
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
    Constant,
    /// Linear warm-up to `lr`, then cosine decay to zero at the last step.
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

/// Update consistency of the parameter-server pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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

/// A job spec that passed every check. Read it through `Deref`; make one
/// with [`JobSpec::parse`] or [`JobSpec::from_json`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "JobSpecInput", into = "JobSpecInput")]
pub struct JobSpec(JobSpecInput);

impl Deref for JobSpec {
    type Target = JobSpecInput;
    fn deref(&self) -> &JobSpecInput {
        &self.0
    }
}

impl From<JobSpec> for JobSpecInput {
    fn from(s: JobSpec) -> Self {
        s.0
    }
}

impl TryFrom<JobSpecInput> for JobSpec {
    type Error = InvalidSpec;
    fn try_from(input: JobSpecInput) -> Result<Self, InvalidSpec> {
        JobSpec::parse(input).map_err(InvalidSpec)
    }
}

/// The violations of a spec that failed [`JobSpec::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSpec(pub Vec<Violation>);

impl fmt::Display for InvalidSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&all.join("; "))
    }
}

impl JobSpec {
    /// Checks every rule and returns the spec, or all its violations.
    pub fn parse(input: JobSpecInput) -> Result<JobSpec, Vec<Violation>> {
        let mut v = Checker::default();
        check(&input, &mut v);
        if v.0.is_empty() {
            Ok(JobSpec(input))
        } else {
            Err(v.0)
        }
    }

    /// Parses JSON bytes: a syntax error, the first shape error (with its
    /// field path), or all rule violations.
    pub fn from_json(bytes: &[u8]) -> Result<JobSpec, SpecError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let input: JobSpecInput = match serde_path_to_error::deserialize(de) {
            Ok(input) => input,
            Err(e) => {
                let path = e.path().to_string();
                let inner = e.into_inner();
                // A shape error can come before a syntax error later in the
                // document (`[1, 2` fails on the 1); bad JSON is a 400 first.
                if let Err(syntax) = serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                    return Err(SpecError::Syntax(syntax.to_string()));
                }
                return Err(match inner.classify() {
                    serde_json::error::Category::Data => SpecError::Shape(vec![Violation {
                        field: if path == "." { String::new() } else { path },
                        message: strip_position(&inner.to_string()),
                    }]),
                    _ => SpecError::Syntax(inner.to_string()),
                });
            }
        };
        JobSpec::parse(input).map_err(SpecError::Invalid)
    }
}

impl JobSpecInput {
    /// The memory each role needs, for built-in models.
    pub fn estimate(&self) -> Option<MemoryEstimate> {
        let params = model::parameter_count(&self.model)?;
        Some(
            MemoryEstimate::new(params, self.optimizer.kind, self.is_sync())
                .with_ps_replicas(self.ps_replicas()),
        )
    }

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

    fn is_sync(&self) -> bool {
        self.consistency_mode() == Consistency::Sync
    }

    fn memory_bytes(&self) -> u64 {
        self.resources.memory_mb.saturating_mul(1 << 20)
    }
}

/// serde_json appends " at line L column C" to data errors; the field path
/// says more to a user than a column does.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

#[derive(Default)]
struct Checker(Vec<Violation>);

impl Checker {
    fn fail(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Violation {
            field: field.into(),
            message: message.into(),
        });
    }

    fn range<T: PartialOrd + fmt::Display + Copy>(&mut self, field: &str, value: T, lo: T, hi: T) {
        if value < lo || value > hi {
            self.fail(field, format!("must be between {lo} and {hi}, got {value}"));
        }
    }

    fn url(&mut self, field: &str, url: &str) {
        if url.chars().count() > MAX_URL_CHARS {
            return self.fail(field, format!("must be at most {MAX_URL_CHARS} characters"));
        }
        if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return self.fail(field, "must not contain whitespace or control characters");
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            return self.fail(
                field,
                format!(
                    "must be a URL such as file:///path or s3://bucket/key (schemes: {})",
                    URL_SCHEMES.join(", ")
                ),
            );
        };
        if !URL_SCHEMES.contains(&scheme) {
            return self.fail(
                field,
                format!(
                    "unsupported scheme {scheme:?}; expected one of {}",
                    URL_SCHEMES.join(", ")
                ),
            );
        }
        if scheme == "file" && !rest.starts_with('/') {
            return self.fail(field, "a file URL needs an absolute path: file:///path");
        }
        let path = if scheme == "file" {
            rest
        } else {
            rest.split_once('/').map_or("", |(_, p)| p)
        };
        if rest.is_empty() || path.is_empty() || path.ends_with('/') {
            self.fail(field, "must name an object, not a bucket or a folder");
        }
    }
}

fn check(s: &JobSpecInput, v: &mut Checker) {
    let name_len = s.name.chars().count();
    if s.name.trim().is_empty() {
        v.fail("name", "must not be empty");
    } else if name_len > MAX_NAME_CHARS {
        v.fail(
            "name",
            format!("must be at most {MAX_NAME_CHARS} characters, got {name_len}"),
        );
    } else if s.name.chars().any(char::is_control) {
        v.fail("name", "must not contain control characters");
    }

    let before = v.0.len();
    check_model(&s.model, v);
    let model_ok = v.0.len() == before;
    let dataset_ok = check_dataset(&s.dataset, v);
    if model_ok && dataset_ok {
        check_model_fits_data(s, v);
    }

    // Optimizer.
    let o = &s.optimizer;
    if !(o.lr > 0.0 && o.lr <= MAX_LR) {
        v.fail(
            "optimizer.lr",
            format!("must be greater than 0 and at most {MAX_LR}, got {}", o.lr),
        );
    }
    if !(0.0..=1.0).contains(&o.weight_decay) {
        v.fail(
            "optimizer.weight_decay",
            format!("must be between 0 and 1, got {}", o.weight_decay),
        );
    }
    match (o.kind, o.momentum) {
        (OptimizerKind::Momentum, Some(m)) if !(0.0..1.0).contains(&m) => {
            v.fail("optimizer.momentum", format!("must be in [0, 1), got {m}"))
        }
        (OptimizerKind::Momentum, _) | (_, None) => {}
        (_, Some(_)) => v.fail("optimizer.momentum", "applies only to kind \"momentum\""),
    }
    match (o.kind, o.betas) {
        (OptimizerKind::Adam | OptimizerKind::Adamw, Some(b)) => {
            for (i, beta) in b.iter().enumerate() {
                if !(0.0..1.0).contains(beta) {
                    v.fail(
                        format!("optimizer.betas[{i}]"),
                        format!("must be in [0, 1), got {beta}"),
                    );
                }
            }
        }
        (_, None) => {}
        (_, Some(_)) => v.fail(
            "optimizer.betas",
            "applies only to kinds \"adam\" and \"adamw\"",
        ),
    }
    if let Some(c) = o.grad_clip {
        if !(c > 0.0 && c <= 1e6) {
            v.fail(
                "optimizer.grad_clip",
                format!("must be greater than 0 and at most 1000000, got {c}"),
            );
        }
    }
    if let Schedule::WarmupCosine { warmup_steps } = o.schedule {
        v.range(
            "optimizer.schedule.warmup_steps",
            warmup_steps,
            0,
            MAX_STEPS,
        );
        if let Some(steps) = s.steps {
            if warmup_steps >= steps {
                v.fail(
                    "optimizer.schedule.warmup_steps",
                    format!("must be less than steps ({steps}), got {warmup_steps}"),
                );
            }
        }
    }

    v.range("batch_size", s.batch_size, 1, MAX_BATCH);
    match (s.epochs, s.steps) {
        (None, None) => v.fail("epochs", "give exactly one of epochs and steps"),
        (Some(_), Some(_)) => v.fail("steps", "give exactly one of epochs and steps, not both"),
        (Some(e), None) => v.range("epochs", e, 1, MAX_EPOCHS),
        (None, Some(n)) => v.range("steps", n, 1, MAX_STEPS),
    }

    v.range("workers.min", s.workers.min, 1, MAX_WORKERS);
    v.range("workers.max", s.workers.max, 1, MAX_WORKERS);
    if s.workers.max < s.workers.min {
        v.fail(
            "workers.max",
            format!(
                "must be at least workers.min ({}), got {}",
                s.workers.min, s.workers.max
            ),
        );
    }
    if s.strategy == Strategy::Allreduce {
        if s.parameter_servers.is_some() {
            v.fail(
                "parameter_servers",
                "applies only to strategies parameter_server and auto",
            );
        }
        if s.consistency.is_some() {
            v.fail(
                "consistency",
                "applies only to strategies parameter_server and auto",
            );
        }
        if s.replicas.is_some() {
            v.fail(
                "replicas",
                "applies only to strategies parameter_server and auto",
            );
        }
    }
    if let Some(n) = s.replicas {
        v.range("replicas", n, 0, MAX_PS_REPLICAS);
    }
    if let Some(n) = s.parameter_servers {
        v.range("parameter_servers", n, 1, MAX_PARAMETER_SERVERS);
    }
    if let Some(Consistency::Bounded { staleness }) = s.consistency {
        v.range("consistency.bounded.staleness", staleness, 0, MAX_STALENESS);
    }

    v.range("priority", s.priority, -MAX_PRIORITY, MAX_PRIORITY);

    let c = &s.checkpoint;
    if let Some(n) = c.every_steps {
        v.range("checkpoint.every_steps", n, 1, MAX_STEPS);
    }
    if let Some(t) = c.every_seconds {
        v.range("checkpoint.every_seconds", t, 1, MAX_CHECKPOINT_SECONDS);
    }
    v.range("checkpoint.keep", c.keep, 1, MAX_CHECKPOINTS_KEPT);

    v.range(
        "resources.memory_mb",
        s.resources.memory_mb,
        MIN_MEMORY_MB,
        MAX_MEMORY_MB,
    );
    if !(0.0..=MAX_EVAL_FRACTION).contains(&s.eval_fraction) {
        v.fail(
            "eval_fraction",
            format!(
                "must be between 0 and {MAX_EVAL_FRACTION}, got {}",
                s.eval_fraction
            ),
        );
    }

    if v.0.is_empty() {
        check_memory(s, v);
    }
}

fn check_model(m: &ModelSpec, v: &mut Checker) {
    match m {
        ModelSpec::Mlp(m) => {
            v.range("model.inputs", m.inputs, 1, MAX_WIDTH);
            v.range("model.outputs", m.outputs, 1, MAX_WIDTH);
            if m.hidden.len() > MAX_MLP_LAYERS {
                v.fail(
                    "model.hidden",
                    format!("at most {MAX_MLP_LAYERS} layers, got {}", m.hidden.len()),
                );
            }
            for (i, &h) in m.hidden.iter().enumerate() {
                v.range(&format!("model.hidden[{i}]"), h, 1, MAX_WIDTH);
            }
        }
        ModelSpec::Cnn(c) => {
            v.range("model.channels", c.channels, 1, MAX_IMAGE_CHANNELS);
            v.range("model.height", c.height, 1, MAX_IMAGE_SIDE);
            v.range("model.width", c.width, 1, MAX_IMAGE_SIDE);
            v.range("model.hidden", c.hidden, 1, MAX_WIDTH);
            v.range("model.classes", c.classes, 2, MAX_WIDTH);
            let n = c.conv_channels.len();
            if n == 0 || n > MAX_CNN_CONVS {
                v.fail(
                    "model.conv_channels",
                    format!("needs 1 to {MAX_CNN_CONVS} convolutions, got {n}"),
                );
            } else {
                for (i, &ch) in c.conv_channels.iter().enumerate() {
                    v.range(&format!("model.conv_channels[{i}]"), ch, 1, 4096);
                }
                let side = c.height.min(c.width);
                if side >> n == 0 {
                    v.fail("model.conv_channels", format!("{n} pooled convolutions shrink a {}×{} image to nothing; use at most {}", c.height, c.width, side.max(1).ilog2()));
                }
            }
        }
        ModelSpec::Transformer(t) => {
            v.range("model.vocab", t.vocab, 2, MAX_VOCAB);
            v.range("model.context", t.context, 1, MAX_CONTEXT);
            v.range("model.layers", t.layers, 1, MAX_TRANSFORMER_LAYERS);
            v.range("model.heads", t.heads, 1, MAX_HEADS);
            v.range("model.width", t.width, 1, MAX_TRANSFORMER_WIDTH);
            if t.heads > 0 && t.width % t.heads != 0 {
                v.fail(
                    "model.width",
                    format!(
                        "must be a multiple of model.heads ({}), got {}",
                        t.heads, t.width
                    ),
                );
            }
        }
        ModelSpec::Torchscript(t) => v.url("model.url", &t.url),
    }
}

/// Returns whether the dataset's own fields are valid (so that cross checks
/// against the model make sense).
fn check_dataset(d: &DatasetSpec, v: &mut Checker) -> bool {
    let before = v.0.len();
    match d {
        DatasetSpec::Classification(c) => {
            v.range("dataset.samples", c.samples, 2, MAX_SAMPLES);
            v.range("dataset.features", c.features, 1, MAX_WIDTH);
            v.range("dataset.classes", c.classes, 2, MAX_WIDTH);
        }
        DatasetSpec::Regression(r) => {
            v.range("dataset.samples", r.samples, 2, MAX_SAMPLES);
            v.range("dataset.features", r.features, 1, MAX_WIDTH);
            v.range("dataset.targets", r.targets, 1, MAX_WIDTH);
        }
        DatasetSpec::Text(t) => v.range("dataset.characters", t.characters, 2, MAX_SAMPLES * 100),
        DatasetSpec::File(f) => {
            v.url("dataset.url", &f.url);
            if f.format.is_none() && file_format_from_url(&f.url).is_none() {
                v.fail("dataset.format", "cannot tell the format from the URL's extension (.npz, .safetensors, .txt); give format");
            }
        }
    }
    v.0.len() == before
}

/// The format a dataset URL's extension names, if any.
pub fn file_format_from_url(url: &str) -> Option<FileFormat> {
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
        _ => None,
    }
}

fn check_model_fits_data(s: &JobSpecInput, v: &mut Checker) {
    let (features, outputs, classification) = match &s.dataset {
        DatasetSpec::Classification(c) => (Some(c.features), Some(c.classes), true),
        DatasetSpec::Regression(r) => (Some(r.features), Some(r.targets), false),
        DatasetSpec::Text(_) => (None, None, true),
        DatasetSpec::File(f) => {
            let fmt = f.format.or_else(|| file_format_from_url(&f.url));
            if fmt == Some(FileFormat::Text)
                && !matches!(
                    s.model,
                    ModelSpec::Transformer(_) | ModelSpec::Torchscript(_)
                )
            {
                v.fail(
                    "dataset.format",
                    "a text dataset trains a transformer (or TorchScript) model",
                );
            }
            if fmt != Some(FileFormat::Text) && matches!(s.model, ModelSpec::Transformer(_)) {
                v.fail("dataset", "a transformer language model trains on text (kind text, or a file of format text)");
            }
            return;
        }
    };
    let is_text = matches!(s.dataset, DatasetSpec::Text(_));
    match &s.model {
        ModelSpec::Mlp(m) => {
            if is_text {
                v.fail(
                    "dataset.kind",
                    "an MLP trains on classification or regression data, not text",
                );
            }
            if let Some(f) = features.filter(|&f| f != m.inputs) {
                v.fail(
                    "model.inputs",
                    format!("must equal dataset.features ({f}), got {}", m.inputs),
                );
            }
            if let Some(o) = outputs.filter(|&o| o != m.outputs) {
                let what = if classification {
                    "dataset.classes"
                } else {
                    "dataset.targets"
                };
                v.fail(
                    "model.outputs",
                    format!("must equal {what} ({o}), got {}", m.outputs),
                );
            }
        }
        ModelSpec::Cnn(c) => {
            if !classification || is_text {
                v.fail("dataset.kind", "a CNN trains on classification data");
            }
            let pixels = u64::from(c.channels) * u64::from(c.height) * u64::from(c.width);
            if let Some(f) = features.filter(|&f| u64::from(f) != pixels) {
                v.fail(
                    "dataset.features",
                    format!("must equal model.channels × height × width ({pixels}), got {f}"),
                );
            }
            if let Some(o) = outputs.filter(|&o| o != c.classes) {
                v.fail(
                    "model.classes",
                    format!("must equal dataset.classes ({o}), got {}", c.classes),
                );
            }
        }
        ModelSpec::Transformer(_) => {
            if !is_text {
                v.fail(
                    "dataset.kind",
                    "a transformer language model trains on text",
                );
            }
        }
        ModelSpec::Torchscript(_) => {}
    }
    let wants_ce = classification;
    match (s.loss, wants_ce) {
        (Loss::Mse, true) => v.fail(
            "loss",
            "classification and text data train with cross_entropy",
        ),
        (Loss::CrossEntropy, false) => v.fail("loss", "regression data trains with mse"),
        _ => {}
    }
}

fn check_memory(s: &JobSpecInput, v: &mut Checker) {
    let Some(e) = s.estimate() else { return };
    let params = e.parameters;
    let have = s.memory_bytes();
    let mib = |b: u64| b.div_ceil(1 << 20);
    let shards = s.parameter_servers.unwrap_or(1);
    match s.strategy {
        Strategy::Allreduce if e.allreduce_worker_bytes > have => v.fail(
            "resources.memory_mb",
            format!("an allreduce worker needs {} MiB for {params} parameters (weights, gradients, optimizer state), got {}; use strategy parameter_server or more memory", mib(e.allreduce_worker_bytes), s.resources.memory_mb),
        ),
        Strategy::ParameterServer | Strategy::Auto if e.allreduce_worker_bytes > have || s.strategy == Strategy::ParameterServer => {
            if e.ps_worker_bytes > have {
                v.fail("resources.memory_mb", format!("a worker needs at least {} MiB for {params} parameters (weights and gradients), got {}", mib(e.ps_worker_bytes), s.resources.memory_mb));
            } else if e.ps_shard_bytes(shards) > have {
                let need = e.ps_tier_bytes.div_ceil(have.max(1));
                v.fail("parameter_servers", format!("{shards} shard(s) of {} MiB each exceed resources.memory_mb ({}); use at least {need}", mib(e.ps_shard_bytes(shards)), s.resources.memory_mb));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
