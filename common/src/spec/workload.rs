//! The two kinds of job a spec describes, seen from the code that runs
//! them: a model job's parts ([`ModelJob`], and the accessors a checked
//! model job's code may call) and what one worker of either kind is
//! charged. It reads both the spec's fields (`input`) and the script's
//! part (`script`), which need nothing of it.

/// What a model job trains, every part present: a checked job has either
/// all of them or a script ([`super::UncheckedJobSpec::model_job`]).
#[derive(Debug, Clone, Copy)]
pub struct ModelJob<'a> {
    /// The model.
    pub model: &'a super::ModelSpec,
    /// Its data.
    pub dataset: &'a super::DatasetSpec,
    /// Its loss.
    pub loss: super::Loss,
    /// Its optimizer.
    pub optimizer: &'a super::OptimizerSpec,
    /// Samples per worker per step.
    pub batch_size: u32,
}

impl super::UncheckedJobSpec {
    /// The model job's parts; `None` for a script job (or a spec missing
    /// one, which no checked spec is).
    pub fn model_job(&self) -> Option<ModelJob<'_>> {
        Some(ModelJob {
            model: self.model.as_ref()?,
            dataset: self.dataset.as_ref()?,
            loss: self.loss?,
            optimizer: self.optimizer.as_ref()?,
            batch_size: self.batch_size?,
        })
    }

    /// Whether it runs a user's script.
    pub fn is_script(&self) -> bool {
        self.script.is_some()
    }

    /// Memory one worker is charged on its device, MiB: its
    /// `resources.memory_mb`, and for a script job on the CPU its spare
    /// interpreter's too ([`super::script::SPARE_INTERPRETER_MB`]), which lives in the
    /// executor's RAM, the CPU device's memory. A CUDA worker is charged
    /// its GPU's memory only, which a spare (started before any CUDA
    /// call) does not use.
    pub fn worker_memory_mb(&self) -> u64 {
        let spare = if self.is_script() && self.resources.device == super::Device::Cpu {
            super::script::SPARE_INTERPRETER_MB
        } else {
            0
        };
        self.resources.memory_mb.saturating_add(spare)
    }
}

/// A model job's parts. [`super::JobSpec::parse`] guarantees that a spec
/// without a `script` has every one of them, so these are for the code
/// that runs model jobs only (the executor's replicas, shards and
/// inspection, on a checked spec); a script job's path never calls them,
/// and code that may see either kind reads the `Option` fields or
/// [`super::UncheckedJobSpec::model_job`].
impl super::UncheckedJobSpec {
    const MODEL_JOB: &'static str =
        "a checked spec without a script is a model job with all its parts";

    /// The model.
    pub fn model(&self) -> &super::ModelSpec {
        self.model.as_ref().expect(Self::MODEL_JOB)
    }

    /// The dataset.
    pub fn dataset(&self) -> &super::DatasetSpec {
        self.dataset.as_ref().expect(Self::MODEL_JOB)
    }

    /// The loss.
    pub fn loss(&self) -> super::Loss {
        self.loss.expect(Self::MODEL_JOB)
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &super::OptimizerSpec {
        self.optimizer.as_ref().expect(Self::MODEL_JOB)
    }

    /// Samples per worker per step.
    pub fn batch_size(&self) -> u32 {
        self.batch_size.expect(Self::MODEL_JOB)
    }
}
