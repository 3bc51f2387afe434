//! The bounds of a job spec, one named constant each: what
//! [`JobSpec::parse`](super::JobSpec::parse) enforces and the API documents.

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
/// Largest shuffle buffer of a sharded dataset, in samples.
pub const MAX_SHUFFLE_BUFFER: u64 = 1 << 24;
/// Largest held-out fraction.
pub const MAX_EVAL_FRACTION: f64 = 0.5;
/// Object-store URL schemes a job may name.
pub const URL_SCHEMES: [&str; 7] = ["file", "s3", "gs", "az", "abfs", "http", "https"];
