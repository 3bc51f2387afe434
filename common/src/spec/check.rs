//! The rules of a valid job spec. [`check`] walks a [`UncheckedJobSpec`] and
//! records every broken bound or cross-field rule in a [`Checker`], each
//! with its field path, so a user sees all of them at once.

use super::script::*;
use super::*;
use std::fmt;

/// Every rule `input` breaks, in the order the fields are checked.
pub(super) fn violations(input: &UncheckedJobSpec) -> Vec<Violation> {
    let mut v = Checker::default();
    check(input, &mut v);
    v.0
}

/// Collects violations; its helpers check one kind of field each.
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

    fn finite_range(&mut self, field: &str, value: f64, lo: f64, hi: f64) {
        if !value.is_finite() {
            return self.fail(field, format!("must be a number between {lo} and {hi}"));
        }
        self.range(field, value, lo, hi);
    }

    fn url(&mut self, field: &str, url: &str) {
        if url.chars().count() > MAX_URL_CHARS {
            return self.fail(field, format!("must be at most {MAX_URL_CHARS} characters"));
        }
        if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return self.fail(field, "must not contain whitespace or control characters");
        }
        if let Some(name) = crate::artifact::artifact_of(url) {
            if let Some(why) = crate::artifact::artifact_name_problem(name) {
                self.fail(field, why);
            }
            return;
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            return self.fail(
                field,
                format!(
                    "must be artifact:NAME (an upload of yours) or a URL such as s3://bucket/key (schemes: {})",
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

fn check(s: &UncheckedJobSpec, v: &mut Checker) {
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

    match &s.script {
        Some(script) => check_script_job(s, script, v),
        None => check_model_job(s, v),
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
    check_ps_fields(s, v);
    if let Some(t) = &s.tracking {
        super::tracking::check(t, &mut |field, message| v.fail(field, message));
    }
    check_limits(s, v);

    if v.0.is_empty() {
        check_memory(s, v);
    }
}

/// The parameter-server fields: none where the strategy is allreduce,
/// and each within its range.
fn check_ps_fields(s: &UncheckedJobSpec, v: &mut Checker) {
    if s.strategy == Strategy::Allreduce {
        for (field, given) in [
            ("parameter_servers", s.parameter_servers.is_some()),
            ("consistency", s.consistency.is_some()),
            ("replicas", s.replicas.is_some()),
            ("stale_updates", s.stale_updates.is_some()),
            ("until", s.until.is_some()),
        ] {
            if given {
                v.fail(
                    field,
                    "applies only to strategies parameter_server and auto",
                );
            }
        }
    }
    if s.until.is_some() && s.strategy != Strategy::Allreduce && s.is_sync() {
        v.fail(
            "until",
            "applies only to consistency async and bounded: a sync job's workers walk one data stream together",
        );
    }
    if let Some(u) = &s.stale_updates {
        v.finite_range(
            "stale_updates.delay_compensation",
            u.delay_compensation,
            0.0,
            10.0,
        );
    }
}

/// The numeric bounds of the fields both kinds of job share.
fn check_limits(s: &UncheckedJobSpec, v: &mut Checker) {
    let d = &s.divergence;
    v.finite_range("divergence.factor", d.factor, 1.5, 1e6);
    v.range("divergence.window_steps", d.window_steps, 1, 100_000);
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

    let w = &s.watchdog;
    v.finite_range("watchdog.stuck_factor", w.stuck_factor, 2.0, 10_000.0);
    v.finite_range(
        "watchdog.stuck_floor_seconds",
        w.stuck_floor_seconds,
        1.0,
        86_400.0,
    );
    v.finite_range("watchdog.straggler_factor", w.straggler_factor, 1.1, 1000.0);
    v.range("watchdog.window_steps", w.window_steps, 5, 10_000);

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
}

/// A script job's own fields: none of a model job's, the allreduce
/// pattern, and a script and inputs that are safe to materialize.
fn check_script_job(s: &UncheckedJobSpec, script: &ScriptSpec, v: &mut Checker) {
    let model_fields = [
        ("model", s.model.is_some()),
        ("dataset", s.dataset.is_some()),
        ("loss", s.loss.is_some()),
        ("optimizer", s.optimizer.is_some()),
        ("batch_size", s.batch_size.is_some()),
        ("epochs", s.epochs.is_some()),
        ("steps", s.steps.is_some()),
    ];
    for (field, given) in model_fields {
        if given {
            v.fail(
                field,
                format!("a script job has no {field}: its script decides how it trains"),
            );
        }
    }
    if s.strategy == Strategy::ParameterServer {
        v.fail("strategy", "the parameter-server pattern is not offered to script jobs; they run as one process group (allreduce, torchrun's pattern)");
    }
    for (field, given) in [
        ("parameter_servers", s.parameter_servers.is_some()),
        ("replicas", s.replicas.is_some()),
        ("consistency", s.consistency.is_some()),
        ("compression", s.compression != Compression::None),
    ] {
        if given {
            v.fail(
                field,
                "applies only to model jobs (a script exchanges its own gradients)",
            );
        }
    }

    check_script_code(script, v);
    check_script_args_and_env(script, v);
    if let Some(p) = &script.python {
        let ok = !p.is_empty()
            && p.len() <= 64
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if !ok {
            v.fail("script.python", "must be the name of one of the executors' Python runtimes: 1 to 64 letters, digits, `.`, `_` or `-`");
        }
    }
    if let Some(n) = script.max_restarts {
        v.range("script.max_restarts", n, 0, MAX_SCRIPT_RESTARTS);
    }
    if let Some(n) = script.max_seconds {
        v.range("script.max_seconds", n, 1, MAX_SCRIPT_SECONDS);
    }
    check_requirements(script, v);
    check_inputs(s, v);
}

/// The script's code and entrypoint.
fn check_script_code(script: &ScriptSpec, v: &mut Checker) {
    v.url("script.code", &script.code);
    let packaging = script.packaging();
    if packaging.is_none() {
        v.fail(
            "script.code",
            "must name a .py file or a .tar.gz, .tgz or .zip archive of a folder",
        );
    }
    match (&script.entrypoint, packaging) {
        (Some(e), _) => {
            if e.chars().count() > MAX_ENTRYPOINT_CHARS {
                v.fail(
                    "script.entrypoint",
                    format!("must be at most {MAX_ENTRYPOINT_CHARS} characters"),
                );
            } else if let Some(why) = relative_path_problem(e) {
                v.fail("script.entrypoint", why);
            } else if !e.ends_with(".py") {
                v.fail("script.entrypoint", "must name a .py file");
            } else if packaging == Some(CodePackaging::Python)
                && script.entrypoint() != script.code.rsplit(['/', ':']).next().map(str::to_owned)
            {
                v.fail(
                    "script.entrypoint",
                    "a single .py file is its own entrypoint: leave it out or give the file's name",
                );
            }
        }
        (None, Some(CodePackaging::TarGz | CodePackaging::Zip)) => {
            v.fail("script.entrypoint", "an archive needs an entrypoint: the .py file to run, relative to the archive's top folder");
        }
        (None, _) => {}
    }
}

/// The script's arguments and environment: bounded, without NUL, and
/// variables it may set.
fn check_script_args_and_env(script: &ScriptSpec, v: &mut Checker) {
    if script.args.len() > MAX_SCRIPT_ARGS {
        v.fail(
            "script.args",
            format!("at most {MAX_SCRIPT_ARGS} arguments"),
        );
    }
    for (i, a) in script.args.iter().enumerate() {
        if a.len() > MAX_SCRIPT_VALUE_BYTES || a.contains('\0') {
            v.fail(
                format!("script.args[{i}]"),
                format!("must be at most {MAX_SCRIPT_VALUE_BYTES} bytes, without NUL"),
            );
        }
    }
    if script.env.len() > MAX_SCRIPT_ENV {
        v.fail("script.env", format!("at most {MAX_SCRIPT_ENV} variables"));
    }
    for (k, value) in &script.env {
        if let Some(why) = env_key_problem(k) {
            v.fail(
                format!("script.env.{}", k.chars().take(64).collect::<String>()),
                why,
            );
        } else if value.len() > MAX_SCRIPT_VALUE_BYTES || value.contains('\0') {
            v.fail(
                format!("script.env.{k}"),
                format!("must be at most {MAX_SCRIPT_VALUE_BYTES} bytes, without NUL"),
            );
        }
    }
}

/// The script's own packages: a file, or 1 to [`MAX_REQUIREMENTS`] lines
/// each a plain requirement of the index.
fn check_requirements(script: &ScriptSpec, v: &mut Checker) {
    match &script.requirements {
        Some(Requirements::File(url)) => v.url("script.requirements", url),
        Some(Requirements::Lines(lines)) => {
            if lines.is_empty() || lines.len() > MAX_REQUIREMENTS {
                v.fail(
                    "script.requirements",
                    format!("must list 1 to {MAX_REQUIREMENTS} requirements"),
                );
            }
            for (i, l) in lines.iter().enumerate().take(MAX_REQUIREMENTS) {
                if let Some(why) = requirement_problem(l) {
                    v.fail(format!("script.requirements[{i}]"), why);
                }
            }
        }
        None => {}
    }
}

/// A script job's inputs: bounded, each one file with a name of its own.
fn check_inputs(s: &UncheckedJobSpec, v: &mut Checker) {
    if s.inputs.len() > MAX_INPUTS {
        v.fail("inputs", format!("at most {MAX_INPUTS} inputs"));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, url) in s.inputs.iter().enumerate() {
        let field = format!("inputs[{i}]");
        if url.contains('*') {
            v.fail(&field, "names one file (no globs)");
            continue;
        }
        v.url(&field, url);
        let name = input_name(url);
        if !names.insert(name.to_owned()) {
            v.fail(
                &field,
                format!(
                    "another input is also named {name:?}: each is materialized under its own name"
                ),
            );
        }
    }
}

/// The file name input `url` is materialized under in
/// `TRAINYARD_INPUT_DIR`: its last path segment (an artifact's name).
pub fn input_name(url: &str) -> &str {
    let rest = crate::artifact::artifact_of(url).unwrap_or(url);
    rest.rsplit('/').next().unwrap_or(rest)
}

/// A model job's own fields: all present, each valid, the model fitting
/// the data, and how long it trains.
fn check_model_job(s: &UncheckedJobSpec, v: &mut Checker) {
    if !s.inputs.is_empty() {
        v.fail(
            "inputs",
            "applies only to script jobs (a model job reads its dataset)",
        );
    }
    let Some(m) = s.model_job() else {
        let missing = [
            ("model", s.model.is_none()),
            ("dataset", s.dataset.is_none()),
            ("loss", s.loss.is_none()),
            ("optimizer", s.optimizer.is_none()),
            ("batch_size", s.batch_size.is_none()),
        ];
        for (field, absent) in missing {
            if absent {
                v.fail(field, "missing: a job names a model (with dataset, loss, optimizer and batch_size) or a script");
            }
        }
        return;
    };
    let before = v.0.len();
    check_model(m.model, v);
    let model_ok = v.0.len() == before;
    let dataset_ok = check_dataset(m.dataset, v);
    if model_ok && dataset_ok {
        check_model_fits_data(&m, v);
    }

    // Optimizer.
    let o = m.optimizer;
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

    v.range("batch_size", m.batch_size, 1, MAX_BATCH);
    match (s.epochs, s.steps) {
        (None, None) => v.fail("epochs", "give exactly one of epochs and steps"),
        (Some(_), Some(_)) => v.fail("steps", "give exactly one of epochs and steps, not both"),
        (Some(e), None) => v.range("epochs", e, 1, MAX_EPOCHS),
        (None, Some(n)) => v.range("steps", n, 1, MAX_STEPS),
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
        DatasetSpec::File(f) => check_file_data(f, v),
    }
    v.0.len() == before
}

fn check_model_fits_data(s: &ModelJob<'_>, v: &mut Checker) {
    let (features, outputs, classification) = match s.dataset {
        DatasetSpec::Classification(c) => (Some(c.features), Some(c.classes), true),
        DatasetSpec::Regression(r) => (Some(r.features), Some(r.targets), false),
        DatasetSpec::Text(_) => (None, None, true),
        DatasetSpec::File(f) => {
            let fmt = f.format.or_else(|| file_format_from_url(&f.url));
            if fmt == Some(FileFormat::Text)
                && !matches!(
                    *s.model,
                    ModelSpec::Transformer(_) | ModelSpec::Torchscript(_)
                )
            {
                v.fail(
                    "dataset.format",
                    "a text dataset trains a transformer (or TorchScript) model",
                );
            }
            if fmt != Some(FileFormat::Text) && matches!(*s.model, ModelSpec::Transformer(_)) {
                v.fail("dataset", "a transformer language model trains on text (kind text, or a file of format text)");
            }
            if f.inputs.is_some() && !matches!(*s.model, ModelSpec::Torchscript(_)) {
                v.fail(
                    "dataset.inputs",
                    "several inputs go to a TorchScript model whose forward takes them; a built-in model takes one",
                );
            }
            return;
        }
    };
    let is_text = matches!(s.dataset, DatasetSpec::Text(_));
    match s.model {
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

fn check_memory(s: &UncheckedJobSpec, v: &mut Checker) {
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

/// A file dataset's fields: its URLs (a file, a `*` glob in the last
/// segment, or a `.json` manifest), the format, and the sharded-data
/// settings.
fn check_file_data(f: &FileData, v: &mut Checker) {
    for (field, url) in [
        ("dataset.url", Some(&f.url)),
        ("dataset.eval_url", f.eval_url.as_ref()),
    ] {
        let Some(url) = url else { continue };
        if is_glob(url) {
            // The pattern is checked as the object it would name with its
            // stars as letters; only the last segment may hold them, so a
            // listing never leaves the folder the prefix names.
            let (folder, _) = url.rsplit_once('/').unwrap_or(("", url));
            if folder.contains('*') {
                v.fail(field, "only the last path segment may hold `*`");
                continue;
            }
            v.url(field, &url.replace('*', "x"));
        } else if url.ends_with('/') {
            // An image folder: checked as an object inside it would be.
            v.url(field, &format!("{url}x"));
        } else {
            v.url(field, url);
        }
    }
    let fmt = f.format_or_guess();
    if fmt.is_none() && !is_manifest(&f.url) {
        v.fail("dataset.format", "cannot tell the format from the URL's extension (.npz, .safetensors, .parquet, .txt, .tar, or a folder ending in /); give format");
    }
    let sharded = f.is_sharded()
        || f.eval_url
            .as_deref()
            .is_some_and(|u| is_glob(u) || is_manifest(u));
    if fmt == Some(FileFormat::Text) && sharded {
        v.fail("dataset.format", "text is read as one file: a glob, manifest or eval_url needs npz, safetensors or parquet");
    }
    let parquet_only = [
        ("dataset.x_columns", f.x_columns.is_some()),
        ("dataset.y_column", f.y_column.is_some()),
    ];
    for (field, given) in parquet_only {
        if given && fmt.is_some() && fmt != Some(FileFormat::Parquet) {
            v.fail(field, "names Parquet columns; the dataset is not Parquet");
        }
    }
    if let Some(cols) = &f.x_columns {
        if cols.is_empty() || cols.len() > MAX_WIDTH as usize {
            v.fail(
                "dataset.x_columns",
                format!("must name 1 to {MAX_WIDTH} columns"),
            );
        }
    }
    for (field, name) in [
        ("dataset.y_column", f.y_column.as_ref()),
        ("dataset.id_column", f.id_column.as_ref()),
    ] {
        if name.is_some_and(|n| n.is_empty() || n.chars().count() > MAX_NAME_CHARS) {
            v.fail(field, format!("must be 1 to {MAX_NAME_CHARS} characters"));
        }
    }
    if let Some(b) = f.shuffle_buffer {
        v.range("dataset.shuffle_buffer", b, 1, MAX_SHUFFLE_BUFFER);
    }
    if let Some(m) = f.memory_mb {
        v.range("dataset.memory_mb", m, MIN_MEMORY_MB, MAX_MEMORY_MB);
    }
    check_pixels(f, fmt, v);
    if let Some(inputs) = &f.inputs {
        if inputs.len() < 2 || inputs.len() > MAX_INPUTS {
            v.fail(
                "dataset.inputs",
                format!("names 2 to {MAX_INPUTS} inputs (one input is dataset.x_columns, or the array x)"),
            );
        }
        if inputs
            .iter()
            .any(|n| n.is_empty() || n.chars().count() > MAX_NAME_CHARS)
        {
            v.fail(
                "dataset.inputs",
                format!("each name is 1 to {MAX_NAME_CHARS} characters"),
            );
        }
        let unique: std::collections::HashSet<&String> = inputs.iter().collect();
        if unique.len() != inputs.len() {
            v.fail("dataset.inputs", "names an input twice");
        }
        if f.x_columns.is_some() {
            v.fail(
                "dataset.x_columns",
                "give either x_columns (one input) or inputs (several)",
            );
        }
        if fmt.is_some_and(|f| f.is_image() || f == FileFormat::Text) {
            v.fail(
                "dataset.inputs",
                "applies to npz, safetensors and Parquet data",
            );
        }
    }
}

/// Most tensors a multi-input model's forward may take.
const MAX_INPUTS: usize = 8;

/// Largest image side a transform may name.
pub const MAX_IMAGE_SIDE: u32 = 4096;

/// Most normalization channels.
const MAX_CHANNELS: usize = 4;

/// A file dataset's image settings and normalization.
fn check_pixels(f: &FileData, fmt: Option<FileFormat>, v: &mut Checker) {
    let images = fmt.is_some_and(FileFormat::is_image);
    if let Some(n) = &f.normalize {
        if n.mean.is_empty() || n.mean.len() > MAX_CHANNELS || n.mean.len() != n.std.len() {
            v.fail(
                "dataset.normalize",
                format!("needs as many means as standard deviations, 1 to {MAX_CHANNELS} of each"),
            );
        }
        if n.mean.iter().any(|m| !m.is_finite()) {
            v.fail("dataset.normalize.mean", "must be finite numbers");
        }
        if n.std.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
            v.fail("dataset.normalize.std", "must be finite numbers above 0");
        }
        if images && n.mean.len() > 1 && n.mean.len() != f.image_channels() as usize {
            v.fail(
                "dataset.normalize",
                format!(
                    "gives {} channels; the images have {} (dataset.channels)",
                    n.mean.len(),
                    f.image_channels()
                ),
            );
        }
    }
    if let Some(c) = f.channels {
        if !images {
            v.fail(
                "dataset.channels",
                "applies to images (format image_folder or webdataset)",
            );
        } else if c != 1 && c != 3 {
            v.fail("dataset.channels", "must be 1 (grayscale) or 3 (RGB)");
        }
    }
    let Some(ts) = &f.transforms else { return };
    if !images {
        v.fail(
            "dataset.transforms",
            "apply to images (format image_folder or webdataset)",
        );
        return;
    }
    if ts.len() > 16 {
        v.fail("dataset.transforms", "at most 16 transforms");
    }
    let mut random_seen = false;
    for (i, t) in ts.iter().enumerate() {
        let field = format!("dataset.transforms[{i}]");
        match *t {
            Transform::Resize(n) | Transform::CenterCrop(n) | Transform::RandomCrop(n) => {
                v.range(&field, n, 1, MAX_IMAGE_SIDE);
            }
            Transform::HorizontalFlip(p) => {
                if !(0.0..=1.0).contains(&p) {
                    v.fail(&field, "horizontal_flip takes a probability from 0 to 1");
                }
            }
        }
        if random_seen && matches!(t, Transform::Resize(_)) {
            v.fail(
                &field,
                "resize must come before random_crop and horizontal_flip (they are drawn anew each epoch, after the images are decoded and resized once)",
            );
        }
        random_seen |= t.is_random();
    }
}
