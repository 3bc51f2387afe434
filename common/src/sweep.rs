//! Hyperparameter sweeps: what a user asks for (`POST /v1/sweeps`), the
//! trials it expands to, and the early-stopping rule that judges them.
//!
//! A sweep is a base job spec, a search space over fields of that spec
//! (named by dotted paths such as `optimizer.lr`), a metric and a goal, a
//! trial budget and a concurrency. Everything here is pure: [`expand`]
//! turns a sweep into its trials' specs (deterministically, from the
//! sweep's seed), [`rungs`] and [`asha_stops`] are the asynchronous
//! successive-halving rule (ASHA, Li et al. 2018) in its "stop once"
//! form: a running trial that reached rung `k` goes on only while its
//! metric there is among the best `⌈n/η⌉` of the `n` trials recorded at
//! that rung so far; it is judged again as more trials arrive, until it
//! reaches rung `k + 1`. The API stores sweeps and starts, reads and stops
//! their trials ([`crate::api::Sweep`] is the resource).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::ToSchema;

use crate::spec::{JobSpec, SpecError, Violation};

/// Most parameters a sweep may search over.
pub const MAX_PARAMETERS: usize = 16;
/// Most enumerated values one parameter may list.
pub const MAX_VALUES: usize = 256;
/// Most trials one sweep may run.
pub const MAX_TRIALS: u32 = 1000;
/// Most trials of one sweep running at once.
pub const MAX_CONCURRENCY: u32 = 64;
/// Most grid points a `uniform` or `log_uniform` axis may ask for.
pub const MAX_POINTS: u32 = 64;
/// Longest dotted path a parameter may name.
pub const MAX_PATH: usize = 128;
/// Most bytes of JSON all of a sweep's trial specs may take together.
pub const MAX_SPEC_BYTES: usize = 32 << 20;

/// A sweep as a user asks for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    /// A human name (1–100 characters, no control characters); trial `i`
    /// is the job `<name>/t<i>`.
    #[schema(example = "digits-lr")]
    pub name: String,
    /// The job spec every trial starts from.
    #[schema(value_type = Object)]
    pub base: Value,
    /// The search space: dotted paths into the base spec (`optimizer.lr`,
    /// `batch_size`, `model.hidden`), each with its values or range; for a
    /// script job, `script.args.NAME` passes `--NAME=VALUE` to the script.
    pub parameters: BTreeMap<String, Parameter>,
    /// How trials are drawn from the space (default `random`).
    #[serde(default)]
    pub search: Search,
    /// The metric trials are judged on (rank 0's reported value).
    pub metric: SweepMetric,
    /// Whether a larger or a smaller metric is better.
    pub goal: Goal,
    /// Trials to run (1–1000). A grid runs all its points by default (a
    /// seeded sample of them when fewer are asked for); a random search
    /// must say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_trials: Option<u32>,
    /// Trials running at once (1–64, default 1).
    #[serde(default = "one")]
    pub concurrency: u32,
    /// Early stopping (absent: every trial runs to its end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<EarlyStopping>,
    /// Seed of the random draws (default 0).
    #[serde(default)]
    pub seed: u64,
}

impl SweepSpec {
    /// The trials' length in steps, where one is known: the base spec's
    /// `steps`, else ASHA's `max_steps` (a script job's).
    pub fn trial_steps(&self) -> Option<u64> {
        self.base
            .get("steps")
            .and_then(Value::as_u64)
            .or(self.early_stopping.and_then(|e| e.asha.max_steps))
    }
}

fn one() -> u32 {
    1
}

/// One parameter's values: exactly one of `values`, `uniform` and
/// `log_uniform`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct Parameter {
    /// Enumerated values (any JSON: numbers, strings, lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub values: Option<Vec<Value>>,
    /// `[low, high]`, drawn uniformly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uniform: Option<[f64; 2]>,
    /// `[low, high]` with `0 < low`, drawn uniformly in the logarithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_uniform: Option<[f64; 2]>,
    /// Grid points of a range (2–64; default 3), evenly spaced (in the
    /// logarithm for `log_uniform`), both ends included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub points: Option<u32>,
    /// Round a range's values to integers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub integer: bool,
}

/// How trials are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum Search {
    /// Every combination of the parameters' values (ranges at their
    /// `points`), in the parameters' name order.
    Grid,
    /// Independent draws of every parameter.
    #[default]
    Random,
}

/// The metric a sweep judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SweepMetric {
    /// Training loss (every step).
    Loss,
    /// Held-out loss (at each evaluation).
    EvalLoss,
    /// Held-out accuracy (at each evaluation; classification).
    EvalAccuracy,
}

impl SweepMetric {
    /// The `job_metrics` column it is read from.
    pub fn column(self) -> &'static str {
        match self {
            SweepMetric::Loss => "loss",
            SweepMetric::EvalLoss => "eval_loss",
            SweepMetric::EvalAccuracy => "eval_accuracy",
        }
    }
}

/// Which way is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    /// Larger is better.
    Maximize,
    /// Smaller is better.
    Minimize,
}

impl Goal {
    /// Whether `a` is strictly better than `b`.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Goal::Maximize => a > b,
            Goal::Minimize => a < b,
        }
    }
}

/// Early-stopping rules.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EarlyStopping {
    /// Asynchronous successive halving.
    pub asha: Asha,
}

/// ASHA's settings. Rungs are at `min_steps · η^k` steps (below the
/// trials' length: the base spec's `steps`, or `max_steps` for a script
/// job); a trial's value at a rung is the first metric point at or after
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Asha {
    /// η (2–16, default 4): one trial in η goes on past each rung.
    #[serde(default = "four")]
    pub reduction_factor: u32,
    /// The first rung, in steps (at least 1, below the trials' length).
    pub min_steps: u64,
    /// The trials' length in steps where the base spec gives no `steps`:
    /// a script job's last step passed to `trainyard.report()`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
}

fn four() -> u32 {
    4
}

/// One trial a sweep expands to.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialPlan {
    /// The parameters' values, by path.
    pub params: BTreeMap<String, Value>,
    /// The trial's job spec (checked).
    pub spec: JobSpec,
}

/// The rung steps of `asha` under a job of `total` steps: `min_steps · η^k`
/// for every `k` below `total`.
pub fn rungs(asha: &Asha, total: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut r = asha.min_steps.max(1);
    let eta = u64::from(asha.reduction_factor.max(2));
    while r < total && out.len() < 64 {
        out.push(r);
        r = r.saturating_mul(eta);
    }
    out
}

/// A trial as ASHA sees it: whether it still runs, and its metric at each
/// rung it reached (in rung order).
#[derive(Debug, Clone, PartialEq)]
pub struct RungView {
    /// Still training (may be stopped).
    pub running: bool,
    /// Its value at rungs `0..values.len()`.
    pub values: Vec<f64>,
}

/// A stop ASHA decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Stop {
    /// The trial's position in the slice judged.
    pub trial: usize,
    /// The rung it was judged at.
    pub rung: usize,
    /// Its rank there (0 = best).
    pub rank: usize,
    /// Trials recorded at that rung.
    pub recorded: usize,
    /// How many of them go on.
    pub keep: usize,
}

/// How many of `n` trials recorded at a rung go on past it.
pub fn keep(n: usize, eta: u32) -> usize {
    n.div_ceil(eta.max(2) as usize).max(1)
}

/// The running trials ASHA stops now: each is judged at the highest rung
/// it reached, against every trial recorded there (running, stopped or
/// ended), and stopped when it is not among the best [`keep`]. A trial that
/// reached no rung, or ended, is never stopped; its rank is the number of
/// trials recorded there with a better value, or an equal one and a
/// lower index (so a tie never keeps more than [`keep`]).
pub fn asha_stops(goal: Goal, eta: u32, trials: &[RungView]) -> Vec<Stop> {
    let mut stops = Vec::new();
    for (i, t) in trials.iter().enumerate() {
        if !t.running || t.values.is_empty() {
            continue;
        }
        let k = t.values.len() - 1;
        let v = t.values[k];
        let at: Vec<(usize, f64)> = trials
            .iter()
            .enumerate()
            .filter_map(|(j, o)| o.values.get(k).map(|&x| (j, x)))
            .collect();
        // Equal values (an accuracy over a few hundred rows often ties)
        // rank by the trials' order, so that a tie does not let both go on.
        let rank = at
            .iter()
            .filter(|&&(j, o)| better_or_nan(goal, o, v) || (j < i && same(o, v)))
            .count();
        let kept = keep(at.len(), eta);
        if rank >= kept {
            stops.push(Stop {
                trial: i,
                rung: k,
                rank,
                recorded: at.len(),
                keep: kept,
            });
        }
    }
    stops
}

/// Equal, counting two values that are not numbers as equal.
fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// `a` better than `b`, where a value that is not a number is worst.
fn better_or_nan(goal: Goal, a: f64, b: f64) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (true, _) => false,
        (false, true) => true,
        _ => goal.better(a, b),
    }
}

/// A small deterministic generator (SplitMix64): draws depend only on the
/// sweep's seed, so a sweep expands to the same trials on every replica.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }
}

fn violation(field: impl Into<String>, message: impl Into<String>) -> Violation {
    Violation {
        field: field.into(),
        message: message.into(),
    }
}

impl Parameter {
    fn range(&self) -> Option<([f64; 2], bool)> {
        self.uniform
            .map(|r| (r, false))
            .or(self.log_uniform.map(|r| (r, true)))
    }

    /// The grid points of this parameter.
    fn grid(&self) -> Vec<Value> {
        if let Some(v) = &self.values {
            return v.clone();
        }
        let Some(([lo, hi], log)) = self.range() else {
            return Vec::new();
        };
        let n = self.points.unwrap_or(3).max(2);
        let mut out: Vec<Value> = Vec::new();
        for i in 0..n {
            let t = i as f64 / (n - 1) as f64;
            let x = if log {
                (lo.ln() + t * (hi.ln() - lo.ln())).exp()
            } else {
                lo + t * (hi - lo)
            };
            let v = self.number(x);
            if !out.contains(&v) {
                out.push(v);
            }
        }
        out
    }

    fn draw(&self, rng: &mut SplitMix) -> Value {
        if let Some(v) = &self.values {
            return v[rng.below(v.len())].clone();
        }
        let Some(([lo, hi], log)) = self.range() else {
            return Value::Null;
        };
        if self.points.is_some() {
            let g = self.grid();
            return g[rng.below(g.len())].clone();
        }
        let u = rng.unit();
        let x = if log {
            (lo.ln() + u * (hi.ln() - lo.ln())).exp()
        } else {
            lo + u * (hi - lo)
        };
        self.number(x)
    }

    fn number(&self, x: f64) -> Value {
        if self.integer {
            Value::from(x.round() as i64)
        } else {
            // Six significant digits: `0.0316228`, not `0.031622776601683794`.
            let r = if x == 0.0 || !x.is_finite() {
                x
            } else {
                let p = 10f64.powi(5 - (x.abs().log10().floor() as i32).clamp(-300, 300));
                if p.is_finite() && p > 0.0 {
                    (x * p).round() / p
                } else {
                    x
                }
            };
            serde_json::Number::from_f64(r).map_or(Value::Null, Value::Number)
        }
    }

    fn check(&self, field: &str, out: &mut Vec<Violation>) {
        let given = [
            self.values.is_some(),
            self.uniform.is_some(),
            self.log_uniform.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if given != 1 {
            out.push(violation(
                field,
                "give exactly one of values, uniform and log_uniform",
            ));
            return;
        }
        if let Some(v) = &self.values {
            if v.is_empty() || v.len() > MAX_VALUES {
                out.push(violation(
                    format!("{field}.values"),
                    format!("must list 1–{MAX_VALUES} values"),
                ));
            }
            if let Some(i) = v.iter().position(|x| x.to_string().len() > 4096) {
                out.push(violation(
                    format!("{field}.values[{i}]"),
                    "is longer than 4096 characters of JSON",
                ));
            }
            if self.points.is_some() || self.integer {
                out.push(violation(
                    field,
                    "points and integer apply to uniform and log_uniform only",
                ));
            }
            return;
        }
        let ([lo, hi], log) = self.range().expect("one range is given");
        let name = if log { "log_uniform" } else { "uniform" };
        if !lo.is_finite() || !hi.is_finite() || lo >= hi {
            out.push(violation(
                format!("{field}.{name}"),
                format!("must be [low, high] with finite low < high, got [{lo}, {hi}]"),
            ));
        } else if log && lo <= 0.0 {
            out.push(violation(
                format!("{field}.{name}"),
                format!("a logarithmic range must be above 0, got low {lo}"),
            ));
        }
        if let Some(p) = self.points {
            if !(2..=MAX_POINTS).contains(&p) {
                out.push(violation(
                    format!("{field}.points"),
                    format!("must be 2–{MAX_POINTS}, got {p}"),
                ));
            }
        }
    }
}

/// Sets `path` (dotted object keys) of `doc` to `value`, making the
/// objects on the way; fails where the path crosses a value that is not
/// an object.
fn set_path(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let mut at = doc;
    let keys: Vec<&str> = path.split('.').collect();
    for (i, k) in keys.iter().enumerate() {
        let Value::Object(map) = at else {
            return Err(format!(
                "{} is not an object in the base spec",
                keys[..i].join(".")
            ));
        };
        if i + 1 == keys.len() {
            map.insert((*k).to_owned(), value);
            return Ok(());
        }
        at = map
            .entry((*k).to_owned())
            .or_insert_with(|| Value::Object(Default::default()));
    }
    Ok(())
}

/// Appends `--NAME=VALUE` to the script's arguments in `doc`.
fn push_script_arg(doc: &mut Value, name: &str, value: &Value) -> Result<(), String> {
    let arg = script_arg(name, value)?;
    let Some(script) = doc.get_mut("script").and_then(Value::as_object_mut) else {
        return Err("the base spec has no script to pass it to".into());
    };
    match script
        .entry("args")
        .or_insert_with(|| Value::Array(Vec::new()))
    {
        Value::Array(args) => {
            args.push(Value::String(arg));
            Ok(())
        }
        _ => Err("the base spec's script.args is not a list".into()),
    }
}

/// The `script.args.NAME` parameter that made the trial's argument named
/// by a violation's `field` (`script.args[i]`, past the base's own).
fn swept_arg<'a>(sweep: &'a SweepSpec, field: &str) -> Option<&'a str> {
    let i: usize = field
        .strip_prefix("script.args[")?
        .strip_suffix(']')?
        .parse()
        .ok()?;
    let base_args = sweep.base["script"]["args"].as_array().map_or(0, Vec::len);
    sweep
        .parameters
        .keys()
        .filter(|k| k.starts_with(SCRIPT_ARGS))
        .nth(i.checked_sub(base_args)?)
        .map(String::as_str)
}

/// Paths a sweep may not set: what names the trial or the data it reads
/// stays the base spec's (trials differ in how they train, not in what).
const FIXED: &[&str] = &["name", "steps", "epochs", "script", "inputs", "resume_from"];

/// The path prefix of a script's command-line arguments: a parameter
/// `script.args.NAME` passes `--NAME=VALUE` to the trial's script.
pub const SCRIPT_ARGS: &str = "script.args.";

/// The argument a `script.args.NAME` parameter adds for `value` (a string,
/// number or boolean, as a command line spells it).
pub fn script_arg(name: &str, value: &Value) -> Result<String, String> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => {
            return Err(format!(
                "a script argument is a string, number or boolean, not {other}"
            ))
        }
    };
    Ok(format!("--{name}={text}"))
}

fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() || path.len() > MAX_PATH {
        return Err(format!("a path is 1–{MAX_PATH} characters"));
    }
    if let Some(name) = path.strip_prefix(SCRIPT_ARGS) {
        // Passed as `--NAME=VALUE`: nothing that could read as another
        // argument, an option's end or a shell word.
        let ok = !name.is_empty()
            && name.len() <= 64
            && name.as_bytes()[0].is_ascii_alphanumeric()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        return if ok {
            Ok(())
        } else {
            Err("a script argument's name is 1–64 letters, digits, `_` and `-`, starting with a letter or digit (it is passed as --NAME=VALUE)".into())
        };
    }
    if !path
        .split('.')
        .all(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    {
        return Err("a path is object keys of letters, digits and _ joined by dots".into());
    }
    let top = path.split('.').next().unwrap_or_default();
    if FIXED.contains(&top) {
        return Err(if top == "script" {
            format!("{top} is fixed by the base spec; a sweep passes values to the script as `{SCRIPT_ARGS}NAME` (--NAME=VALUE)")
        } else {
            format!("{top} is fixed by the base spec; a sweep searches over how trials train")
        });
    }
    if top == "dataset" && path.split('.').any(|k| k.ends_with("url")) {
        return Err("a dataset's URLs are fixed by the base spec".into());
    }
    Ok(())
}

/// Checks `sweep` and expands it to its trials: every trial's spec is the
/// base with the trial's values set, named `<name>/t<i>`, and checked as a
/// job spec (a violation names `trials[i].<field>`).
pub fn expand(sweep: &SweepSpec) -> Result<Vec<TrialPlan>, Vec<Violation>> {
    let mut out = check_sweep(sweep);
    if let Some(es) = &sweep.early_stopping {
        check_early_stopping(sweep, es, &mut out);
    }
    if !out.is_empty() {
        return Err(out);
    }
    let chosen = choose(sweep)?;
    bound_specs(sweep, chosen.len())?;
    build_trials(sweep, chosen)
}

/// What is wrong with `sweep`'s own fields (its name, base, parameters,
/// concurrency and number of trials).
fn check_sweep(sweep: &SweepSpec) -> Vec<Violation> {
    let mut out = Vec::new();
    let name = sweep.name.trim();
    if name.is_empty()
        || sweep.name.chars().count() > 100
        || sweep.name.chars().any(char::is_control)
    {
        out.push(violation(
            "name",
            "must be 1–100 characters without control characters",
        ));
    }
    if !sweep.base.is_object() {
        out.push(violation("base", "must be a job spec (a JSON object)"));
    }
    if sweep.parameters.is_empty() || sweep.parameters.len() > MAX_PARAMETERS {
        out.push(violation(
            "parameters",
            format!("must name 1–{MAX_PARAMETERS} parameters"),
        ));
    }
    let script_base = sweep.base.get("script").is_some_and(Value::is_object);
    for (path, p) in &sweep.parameters {
        let field = format!("parameters.{path}");
        if let Err(e) = check_path(path) {
            out.push(violation(&field, e));
        } else if let Some(name) = path.strip_prefix(SCRIPT_ARGS) {
            if !script_base {
                out.push(violation(
                    &field,
                    "passes an argument to the base spec's script: the base must be a script job",
                ));
            }
            for v in p.values.iter().flatten() {
                if let Err(e) = script_arg(name, v) {
                    out.push(violation(&field, e));
                    break;
                }
            }
        }
        p.check(&field, &mut out);
    }
    if !(1..=MAX_CONCURRENCY).contains(&sweep.concurrency) {
        out.push(violation(
            "concurrency",
            format!("must be 1–{MAX_CONCURRENCY}, got {}", sweep.concurrency),
        ));
    }
    if let Some(n) = sweep.max_trials {
        if !(1..=MAX_TRIALS).contains(&n) {
            out.push(violation(
                "max_trials",
                format!("must be 1–{MAX_TRIALS}, got {n}"),
            ));
        }
    } else if sweep.search == Search::Random {
        out.push(violation(
            "max_trials",
            "a random search must say how many trials to run",
        ));
    }
    out
}

/// What is wrong with `sweep`'s early stopping `es`, added to `out`.
fn check_early_stopping(sweep: &SweepSpec, es: &EarlyStopping, out: &mut Vec<Violation>) {
    let a = es.asha;
    if !(2..=16).contains(&a.reduction_factor) {
        out.push(violation(
            "early_stopping.asha.reduction_factor",
            format!("must be 2–16, got {}", a.reduction_factor),
        ));
    }
    let base_steps = sweep.base.get("steps").and_then(Value::as_u64);
    if let (Some(b), Some(m)) = (base_steps, a.max_steps) {
        if b != m {
            out.push(violation(
                "early_stopping.asha.max_steps",
                format!("the base spec's steps ({b}) are the trials' length; leave max_steps out or make it {b}"),
            ));
        }
    }
    match sweep.trial_steps() {
        None => out.push(violation(
            "base.steps",
            "early stopping judges trials at rungs of steps: the base spec must give steps (not epochs), or a script job's early_stopping.asha.max_steps its last reported step",
        )),
        Some(total) if a.min_steps == 0 || a.min_steps >= total => out.push(violation(
            "early_stopping.asha.min_steps",
            format!("must be 1–{} (below the trials' {total} steps), got {}", total.saturating_sub(1), a.min_steps),
        )),
        Some(_) => {}
    }
}

/// The parameter values of each trial: the grid's points (all, or a
/// seeded sample of `max_trials` in grid order), or `max_trials` random
/// draws.
fn choose(sweep: &SweepSpec) -> Result<Vec<BTreeMap<String, Value>>, Vec<Violation>> {
    let params: Vec<(&String, &Parameter)> = sweep.parameters.iter().collect();
    Ok(match sweep.search {
        Search::Grid => grid_points(sweep, &params)?,
        Search::Random => {
            let mut rng = SplitMix(sweep.seed);
            (0..sweep.max_trials.unwrap_or(1))
                .map(|_| {
                    params
                        .iter()
                        .map(|(k, p)| ((*k).clone(), p.draw(&mut rng)))
                        .collect()
                })
                .collect()
        }
    })
}

/// The grid's points `sweep` runs.
fn grid_points(
    sweep: &SweepSpec,
    params: &[(&String, &Parameter)],
) -> Result<Vec<BTreeMap<String, Value>>, Vec<Violation>> {
    let axes: Vec<Vec<Value>> = params.iter().map(|(_, p)| p.grid()).collect();
    let size = axes
        .iter()
        .try_fold(1usize, |acc, a| acc.checked_mul(a.len()))
        .unwrap_or(usize::MAX);
    if size > 100_000 {
        return Err(vec![violation(
            "parameters",
            format!("the grid has {size} points; at most 100000"),
        )]);
    }
    // Only the chosen points are built: a grid of many large values
    // never sits whole in memory.
    let point = |mut i: usize| {
        let mut m = BTreeMap::new();
        // The last parameter varies fastest.
        for (j, axis) in axes.iter().enumerate().rev() {
            m.insert(params[j].0.clone(), axis[i % axis.len()].clone());
            i /= axis.len();
        }
        m
    };
    let want = sweep.max_trials.map_or(size, |n| (n as usize).min(size));
    if want > MAX_TRIALS as usize {
        return Err(vec![violation(
            "max_trials",
            format!(
                "the grid has {size} points; run at most {MAX_TRIALS} (set max_trials to sample it)"
            ),
        )]);
    }
    if want == size {
        return Ok((0..size).map(point).collect());
    }
    // A seeded sample of the grid, kept in grid order.
    let mut rng = SplitMix(sweep.seed);
    let mut idx: Vec<usize> = (0..size).collect();
    for i in 0..want {
        let j = i + rng.below(size - i);
        idx.swap(i, j);
    }
    let mut pick: Vec<usize> = idx[..want].to_vec();
    pick.sort_unstable();
    Ok(pick.into_iter().map(point).collect())
}

/// Every trial's spec is stored: what `n` of them take together is
/// bounded.
fn bound_specs(sweep: &SweepSpec, n: usize) -> Result<(), Vec<Violation>> {
    let per_trial = sweep.base.to_string().len()
        + sweep
            .parameters
            .values()
            .map(|p| {
                p.grid()
                    .iter()
                    .map(|v| v.to_string().len())
                    .max()
                    .unwrap_or(32)
            })
            .sum::<usize>();
    if per_trial.saturating_mul(n) > MAX_SPEC_BYTES {
        return Err(vec![violation(
            "max_trials",
            format!(
                "{} trials of a spec of up to {per_trial} bytes exceed {} MiB together; run fewer or smaller",
                n,
                MAX_SPEC_BYTES >> 20
            ),
        )]);
    }
    Ok(())
}

/// Each trial's spec: the base with its values set, named, and checked as
/// a job spec.
fn build_trials(
    sweep: &SweepSpec,
    chosen: Vec<BTreeMap<String, Value>>,
) -> Result<Vec<TrialPlan>, Vec<Violation>> {
    let mut plans = Vec::with_capacity(chosen.len());
    let mut errors = Vec::new();
    for (i, params) in chosen.into_iter().enumerate() {
        let mut doc = sweep.base.clone();
        let trial_name = format!("{}/t{i}", sweep.name.trim());
        if let Err(e) = set_path(&mut doc, "name", Value::from(trial_name)) {
            errors.push(violation("base", e));
            break;
        }
        for (path, v) in &params {
            let set = match path.strip_prefix(SCRIPT_ARGS) {
                Some(name) => push_script_arg(&mut doc, name, v),
                None => set_path(&mut doc, path, v.clone()),
            };
            if let Err(e) = set {
                errors.push(violation(format!("parameters.{path}"), e));
            }
        }
        if !errors.is_empty() {
            break;
        }
        let bytes = serde_json::to_vec(&doc).unwrap_or_default();
        match JobSpec::from_json(&bytes) {
            Ok(spec) => plans.push(TrialPlan { params, spec }),
            Err(SpecError::Syntax(e)) => errors.push(violation(format!("trials[{i}]"), e)),
            Err(e) => {
                for v in e.violations() {
                    let base = if sweep.parameters.contains_key(&v.field) {
                        format!("parameters.{}", v.field)
                    } else if let Some(path) = swept_arg(sweep, &v.field) {
                        format!("parameters.{path}")
                    } else if v.field.is_empty() {
                        "base".into()
                    } else {
                        format!("base.{}", v.field)
                    };
                    errors.push(violation(
                        base,
                        format!("trial {i} ({}): {}", describe(&params), v.message),
                    ));
                }
                break;
            }
        }
    }
    if errors.is_empty() {
        Ok(plans)
    } else {
        Err(errors)
    }
}

/// `optimizer.lr=0.01, batch_size=32`.
pub fn describe(params: &BTreeMap<String, Value>) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
