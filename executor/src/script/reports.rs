//! What a rank's script reports with `trainyard.report(step, **metrics)`:
//! JSON lines the SDK appends to the rank's report file
//! (`TRAINYARD_REPORT_FILE`, in its scratch folder), read here as they
//! come. Every rank's step feeds its role's progress (the watchdog and the
//! heartbeat); rank 0's metrics become the job's metric points; a report
//! with `checkpoint: true` asks for the checkpoint folder to be committed
//! at once. A stranger writes the file: lines are bounded, a malformed one
//! is skipped (and said once), and steps must grow.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use trainyard_common::cluster::MetricPoint;

/// Longest report line, bytes.
pub const MAX_LINE: usize = 4096;
/// Most bytes read from the file at one look.
pub const MAX_READ: u64 = 1 << 20;

/// One report line.
#[derive(Debug, Deserialize)]
struct Line {
    step: u64,
    #[serde(default)]
    checkpoint: bool,
    #[serde(default)]
    metrics: BTreeMap<String, f64>,
}

/// One report, as the rank's role uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The step.
    pub step: u64,
    /// Whether the script asked for its checkpoint folder to be committed.
    pub checkpoint: bool,
    /// The metric point, when the report has a `loss`.
    pub point: Option<MetricPoint>,
    /// Metrics the platform does not store (named once in the log).
    pub unknown: Vec<String>,
}

/// The reader of one rank's report file.
pub struct Reports {
    path: PathBuf,
    at: u64,
    partial: Vec<u8>,
    last_step: Option<u64>,
    /// Whether a bad line was already said.
    pub complained: bool,
}

/// The metrics a point stores.
const KNOWN: [&str; 5] = [
    "loss",
    "lr",
    "eval_loss",
    "eval_accuracy",
    "samples_per_sec",
];

/// A line of the reports file that is not a report.
#[derive(Debug, thiserror::Error)]
pub enum BadReport {
    /// Longer than [`MAX_LINE`].
    #[error("a report line longer than {MAX_LINE} bytes")]
    TooLong,
    /// Not a report's JSON.
    #[error("a report line that is not a report ({0})")]
    NotReport(#[from] serde_json::Error),
    /// A step before the last one reported.
    #[error("step {step} reported after step {after}")]
    WentBack {
        /// The step reported.
        step: u64,
        /// The step reported before it.
        after: u64,
    },
}

impl Reports {
    /// A reader of `path` (which may not exist yet).
    pub fn new(path: PathBuf) -> Reports {
        Reports {
            path,
            at: 0,
            partial: Vec::new(),
            last_step: None,
            complained: false,
        }
    }

    /// The reports appended since the last call, and the lines that were
    /// not reports (bad JSON, too long, a step that went back).
    pub fn poll(&mut self) -> (Vec<Report>, Vec<BadReport>) {
        let (mut out, mut bad) = (Vec::new(), Vec::new());
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return (out, bad);
        };
        if f.seek(SeekFrom::Start(self.at)).is_err() {
            return (out, bad);
        }
        let mut buf = Vec::new();
        let Ok(n) = f.take(MAX_READ).read_to_end(&mut buf) else {
            return (out, bad);
        };
        self.at += n as u64;
        self.partial.extend_from_slice(&buf);
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            match self.parse(&line[..line.len() - 1]) {
                Ok(r) => out.push(r),
                Err(why) => bad.push(why),
            }
        }
        if self.partial.len() > MAX_LINE {
            self.partial.clear();
            bad.push(BadReport::TooLong);
        }
        (out, bad)
    }

    fn parse(&mut self, line: &[u8]) -> Result<Report, BadReport> {
        if line.len() > MAX_LINE {
            return Err(BadReport::TooLong);
        }
        let l: Line = serde_json::from_slice(line)?;
        if let Some(after) = self.last_step.filter(|s| l.step < *s) {
            return Err(BadReport::WentBack {
                step: l.step,
                after,
            });
        }
        self.last_step = Some(l.step);
        let get = |k: &str| l.metrics.get(k).copied().filter(|v| v.is_finite());
        let point = get("loss").map(|loss| MetricPoint {
            step: l.step,
            loss,
            lr: get("lr").unwrap_or(0.0),
            samples_per_sec: get("samples_per_sec").unwrap_or(0.0),
            data_seconds: 0.0,
            compute_seconds: 0.0,
            comm_seconds: 0.0,
            comm_bytes: 0,
            staleness: None,
            rejected: 0,
            eval_loss: get("eval_loss"),
            eval_accuracy: get("eval_accuracy"),
            data_bytes_read: 0,
            data_cache_hits: 0,
            data_cache_misses: 0,
            prefetch_depth: 0,
            epoch_done: None,
        });
        let unknown = l
            .metrics
            .keys()
            .filter(|k| !KNOWN.contains(&k.as_str()))
            .cloned()
            .collect();
        Ok(Report {
            step: l.step,
            checkpoint: l.checkpoint,
            point,
            unknown,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reports_are_read_as_they_come_and_bad_lines_are_named() {
        let path = std::env::temp_dir().join(format!("ty-reports-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut r = Reports::new(path.clone());
        let (got, bad) = r.poll();
        assert!(got.is_empty() && bad.is_empty());
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(
            concat!(
                r#"{"step": 1, "metrics": {"loss": 2.5, "top5": 0.9}}"#,
                "\n",
                r#"{"step": 2, "chec"#
            )
            .as_bytes(),
        )
        .unwrap();
        let (got, bad) = r.poll();
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].point.as_ref().unwrap().loss, 2.5);
        assert_eq!(got[0].unknown, ["top5"]);
        // The rest of the line arrives; then junk, a step going back, a
        // report without a loss (progress only) and a very long line.
        writeln!(f, r#"kpoint": true, "metrics": {{}}}}"#).unwrap();
        writeln!(f, "not json").unwrap();
        writeln!(f, r#"{{"step": 1}}"#).unwrap();
        writeln!(f, r#"{{"step": 3, "metrics": {{"accuracy": 1}}}}"#).unwrap();
        writeln!(f, "{}", "x".repeat(MAX_LINE + 1)).unwrap();
        let (got, bad) = r.poll();
        assert_eq!(got.iter().map(|g| g.step).collect::<Vec<_>>(), [2, 3]);
        assert!(got[0].checkpoint && got[0].point.is_none());
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert!(
            bad[1].to_string().contains("step 1 reported after step 2"),
            "{bad:?}"
        );
        let _ = std::fs::remove_file(&path);
    }
}
