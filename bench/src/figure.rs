//! One benchmark figure and its baseline: printed as
//! `name: value unit (baseline value unit, ratio r)` and recorded as a JSON
//! line for the report (see the crate's documentation).

use std::io::Write;

/// Which way a ratio is good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Larger values are better (throughput, bandwidth).
    Higher,
    /// Smaller values are better (time, latency).
    Lower,
}

/// A target on the ratio `value / baseline`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// The ratio must be at least this.
    AtLeast(f64),
    /// The ratio must be at most this.
    AtMost(f64),
}

impl Target {
    fn met(self, ratio: f64) -> bool {
        match self {
            Target::AtLeast(t) => ratio >= t,
            Target::AtMost(t) => ratio <= t,
        }
    }

    fn describe(self) -> String {
        match self {
            Target::AtLeast(t) => format!("ratio ≥ {t}"),
            Target::AtMost(t) => format!("ratio ≤ {t}"),
        }
    }
}

/// One measured value beside its baseline.
#[derive(Debug, Clone)]
pub struct Figure {
    /// The benchmark that measured it (`ring`, `ps`, `api`, …).
    pub bench: &'static str,
    /// What was measured, e.g. `ring busbw N=2 16 MiB`.
    pub name: String,
    /// The value.
    pub value: f64,
    /// Its unit (`GB/s`, `ms`, `req/s`, …; may be empty).
    pub unit: &'static str,
    /// What the baseline is, e.g. `gloo` or `loopback ceiling`.
    pub baseline_name: String,
    /// The baseline's value, measured in the same invocation (or a fixed
    /// target, which `baseline_name` then says).
    pub baseline: f64,
    /// The baseline's unit.
    pub baseline_unit: &'static str,
    /// Which way is good.
    pub better: Better,
    /// The target on the ratio, if the project set one.
    pub target: Option<Target>,
}

impl Figure {
    /// A figure of `bench` whose baseline has the same unit.
    pub fn new(
        bench: &'static str,
        name: impl Into<String>,
        value: f64,
        unit: &'static str,
        baseline_name: impl Into<String>,
        baseline: f64,
        better: Better,
    ) -> Figure {
        Figure {
            bench,
            name: name.into(),
            value,
            unit,
            baseline_name: baseline_name.into(),
            baseline,
            baseline_unit: unit,
            better,
            target: None,
        }
    }

    /// The same figure with a target on its ratio.
    pub fn target(mut self, target: Target) -> Figure {
        self.target = Some(target);
        self
    }

    /// The same figure with the baseline in another unit.
    pub fn baseline_unit(mut self, unit: &'static str) -> Figure {
        self.baseline_unit = unit;
        self
    }

    /// `value / baseline` (NaN when the baseline is zero or missing).
    pub fn ratio(&self) -> f64 {
        if self.baseline == 0.0 || !self.baseline.is_finite() {
            f64::NAN
        } else {
            self.value / self.baseline
        }
    }

    /// Whether the target holds (`None` without a target).
    pub fn met(&self) -> Option<bool> {
        self.target.map(|t| t.met(self.ratio()))
    }

    /// The printed line: `name: value unit (baseline value unit, ratio r)`.
    pub fn line(&self) -> String {
        let mut s = format!("{}: {} (", self.name, with_unit(self.value, self.unit));
        s.push_str(&format!(
            "{} {}, ratio {}",
            self.baseline_name,
            with_unit(self.baseline, self.baseline_unit),
            number(self.ratio())
        ));
        s.push(')');
        if let Some(t) = self.target {
            let verdict = if t.met(self.ratio()) { "met" } else { "MISSED" };
            s.push_str(&format!("  [target {}: {verdict}]", t.describe()));
        }
        s
    }

    /// The JSON record of the report.
    pub fn json(&self) -> serde_json::Value {
        let finite = |x: f64| if x.is_finite() { Some(x) } else { None };
        serde_json::json!({
            "bench": self.bench,
            "name": self.name,
            "value": finite(self.value),
            "unit": self.unit,
            "baseline_name": self.baseline_name,
            "baseline": finite(self.baseline),
            "baseline_unit": self.baseline_unit,
            "ratio": finite(self.ratio()),
            "better": match self.better { Better::Higher => "higher", Better::Lower => "lower" },
            "target": self.target.map(|t| t.describe()),
            "met": self.met(),
        })
    }

    /// Prints the line and records the figure (see the crate docs).
    pub fn emit(&self) {
        println!("{}", self.line());
        if let Some(dir) = std::env::var_os("TRAINYARD_BENCH_DIR") {
            let path = std::path::Path::new(&dir).join("figures.jsonl");
            let written = std::fs::create_dir_all(&dir).and_then(|()| {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)?;
                writeln!(f, "{}", self.json())
            });
            if let Err(e) = written {
                eprintln!("cannot record the figure in {}: {e}", path.display());
            }
        }
    }
}

/// Writes a benchmark's raw series to `$TRAINYARD_BENCH_DIR/<bench>.json`
/// (nothing without the variable).
pub fn record_data(bench: &str, data: &serde_json::Value) {
    if let Some(dir) = std::env::var_os("TRAINYARD_BENCH_DIR") {
        let path = std::path::Path::new(&dir).join(format!("{bench}.json"));
        let written = std::fs::create_dir_all(&dir).and_then(|()| {
            std::fs::write(
                &path,
                serde_json::to_string_pretty(data).unwrap_or_default(),
            )
        });
        if let Err(e) = written {
            eprintln!("cannot record {}: {e}", path.display());
        }
    }
}

/// A number with three significant figures (at least two decimals below 10).
pub fn number(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let a = x.abs();
    if a >= 1000.0 {
        format!("{x:.0}")
    } else if a >= 100.0 {
        format!("{x:.1}")
    } else if a >= 0.01 || a == 0.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.2e}")
    }
}

fn with_unit(x: f64, unit: &str) -> String {
    if unit.is_empty() {
        number(x)
    } else {
        format!("{} {unit}", number(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_has_value_baseline_and_ratio() {
        let f = Figure::new("ring", "busbw", 1.5, "GB/s", "gloo", 0.75, Better::Higher)
            .target(Target::AtLeast(1.0));
        assert_eq!(
            f.line(),
            "busbw: 1.50 GB/s (gloo 0.75 GB/s, ratio 2.00)  [target ratio ≥ 1: met]"
        );
        assert_eq!(f.met(), Some(true));
        let slow = Figure::new("api", "p99", 12.0, "ms", "pgbench", 3.0, Better::Lower)
            .target(Target::AtMost(2.0));
        assert_eq!(slow.met(), Some(false));
        assert!(slow.line().ends_with("[target ratio ≤ 2: MISSED]"));
    }

    #[test]
    fn zero_baseline_has_no_ratio() {
        let f = Figure::new("x", "y", 1.0, "", "none", 0.0, Better::Higher);
        assert!(f.ratio().is_nan());
        assert_eq!(f.json()["ratio"], serde_json::Value::Null);
        assert!(f.line().contains("ratio n/a"));
    }
}
