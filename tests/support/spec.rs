//! The job specs of the end-to-end tests: one builder of MLP specs (on the
//! digits dataset or a synthetic one; ring all-reduce or parameter server
//! in sync, async or bounded-staleness mode, optionally replicated), the
//! quick start's demo spec, and a TorchScript job with the Python that writes
//! its model. Each test states the knobs it turns; what it leaves alone is
//! the builder's default.

use crate::process::repo_root;
use serde_json::{json, Value};
use std::process::Command;

/// The `file://` URL of the digits dataset (`data/digits.npz`).
pub fn digits_url() -> String {
    format!("file://{}", repo_root().join("data/digits.npz").display())
}

/// The quick start's demo job (`examples/digits-mlp.json`, as `scripts/run`
/// submits it).
pub fn example_digits() -> Value {
    let text = std::fs::read_to_string(repo_root().join("examples/digits-mlp.json"))
        .expect("examples/digits-mlp.json");
    serde_json::from_str(&text.replace("@DIGITS@", &digits_url())).expect("a JSON spec")
}

/// How PS workers and shards agree on versions.
#[derive(Debug, Clone, Copy)]
pub enum Consistency {
    /// Every worker's gradient of a version, then the next version.
    Sync,
    /// Each push applied as it comes.
    Async,
    /// Pushes at most this many versions stale are applied.
    Bounded(u32),
}

impl Consistency {
    /// As the spec's `consistency` field.
    pub fn json(self) -> Value {
        match self {
            Consistency::Sync => json!("sync"),
            Consistency::Async => json!("async"),
            Consistency::Bounded(tau) => json!({"bounded": {"staleness": tau}}),
        }
    }
}

/// A spec of an MLP of 64 inputs and 10 classes. Defaults: the digits
/// file, one hidden layer of 64, Adam at 0.003, batches of 64, a fifth
/// held out, ring all-reduce with one worker; no length, seed, resources
/// or checkpoints unless set.
#[derive(Debug, Clone)]
pub struct MlpSpec {
    name: String,
    hidden: Vec<u32>,
    dataset: Value,
    optimizer: Value,
    batch_size: u32,
    length: Option<(&'static str, u64)>,
    eval_fraction: Option<f64>,
    parameter_servers: Option<u32>,
    replicas: Option<u32>,
    consistency: Option<Consistency>,
    workers: (u32, u32),
    memory_mb: Option<u64>,
    checkpoint: Option<Value>,
    seed: Option<u64>,
}

impl MlpSpec {
    /// A job named `name` on the digits dataset.
    pub fn digits(name: &str) -> MlpSpec {
        MlpSpec {
            name: name.to_owned(),
            hidden: vec![64],
            dataset: json!({"kind": "file", "url": digits_url()}),
            optimizer: json!({"kind": "adam", "lr": 0.003}),
            batch_size: 64,
            length: None,
            eval_fraction: Some(0.2),
            parameter_servers: None,
            replicas: None,
            consistency: None,
            workers: (1, 1),
            memory_mb: None,
            checkpoint: None,
            seed: None,
        }
    }

    /// The hidden layers' widths.
    pub fn hidden(mut self, widths: &[u32]) -> Self {
        self.hidden = widths.to_vec();
        self
    }

    /// A synthetic classification dataset of `samples` (10 classes).
    pub fn classification(mut self, samples: u32) -> Self {
        self.dataset =
            json!({"kind": "classification", "samples": samples, "features": 64, "classes": 10});
        self
    }

    /// Adam at `lr`.
    pub fn adam(mut self, lr: f64) -> Self {
        self.optimizer = json!({"kind": "adam", "lr": lr});
        self
    }

    /// AdamW at `lr` (weight decay 1e-4) with 20 warm-up steps and a cosine
    /// decay.
    pub fn adamw_warmup(mut self, lr: f64) -> Self {
        self.optimizer = json!({"kind": "adamw", "lr": lr, "weight_decay": 0.0001,
                                "schedule": {"kind": "warmup_cosine", "warmup_steps": 20}});
        self
    }

    /// Plain SGD at `lr`.
    pub fn sgd(mut self, lr: f64) -> Self {
        self.optimizer = json!({"kind": "sgd", "lr": lr});
        self
    }

    /// Samples per batch (per worker).
    pub fn batch_size(mut self, n: u32) -> Self {
        self.batch_size = n;
        self
    }

    /// Trains for `n` epochs.
    pub fn epochs(mut self, n: u64) -> Self {
        self.length = Some(("epochs", n));
        self
    }

    /// Trains for `n` optimizer steps.
    pub fn steps(mut self, n: u64) -> Self {
        self.length = Some(("steps", n));
        self
    }

    /// Holds nothing out (the spec names no `eval_fraction`).
    pub fn no_eval(mut self) -> Self {
        self.eval_fraction = None;
        self
    }

    /// Between `min` and `max` workers.
    pub fn workers(mut self, min: u32, max: u32) -> Self {
        self.workers = (min, max);
        self
    }

    /// The parameter-server pattern with `shards` shards.
    pub fn ps(mut self, shards: u32) -> Self {
        self.parameter_servers = Some(shards);
        self
    }

    /// The PS consistency mode.
    pub fn consistency(mut self, c: Consistency) -> Self {
        self.consistency = Some(c);
        self
    }

    /// Standbys per PS shard.
    pub fn replicas(mut self, n: u32) -> Self {
        self.replicas = Some(n);
        self
    }

    /// RAM each worker asks for.
    pub fn memory_mb(mut self, mb: u64) -> Self {
        self.memory_mb = Some(mb);
        self
    }

    /// The spec's `checkpoint` policy.
    pub fn checkpoint(mut self, policy: Value) -> Self {
        self.checkpoint = Some(policy);
        self
    }

    /// The seed of initialization and data order.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The spec as the API takes it.
    pub fn build(self) -> Value {
        let mut spec = json!({
            "name": self.name,
            "model": {"kind": "mlp", "inputs": 64, "hidden": self.hidden, "outputs": 10},
            "dataset": self.dataset,
            "loss": "cross_entropy",
            "optimizer": self.optimizer,
            "batch_size": self.batch_size,
            "strategy": if self.parameter_servers.is_some() { "parameter_server" } else { "allreduce" },
            "workers": {"min": self.workers.0, "max": self.workers.1},
        });
        if let Some((key, n)) = self.length {
            spec[key] = json!(n);
        }
        if let Some(f) = self.eval_fraction {
            spec["eval_fraction"] = json!(f);
        }
        if let Some(n) = self.parameter_servers {
            spec["parameter_servers"] = json!(n);
        }
        if let Some(n) = self.replicas {
            spec["replicas"] = json!(n);
        }
        if let Some(c) = self.consistency {
            spec["consistency"] = c.json();
        }
        if let Some(mb) = self.memory_mb {
            spec["resources"] = json!({"memory_mb": mb});
        }
        if let Some(policy) = self.checkpoint {
            spec["checkpoint"] = policy;
        }
        if let Some(seed) = self.seed {
            spec["seed"] = json!(seed);
        }
        spec
    }
}

/// A one-worker ring job of a TorchScript model at `url` (8 inputs, one
/// output, as [`write_torchscript`] writes it) on a synthetic regression.
pub fn torchscript(name: &str, url: &str) -> Value {
    json!({
        "name": name,
        "model": {"kind": "torchscript", "url": url},
        "dataset": {"kind": "regression", "samples": 2000, "features": 8},
        "loss": "mse",
        "optimizer": {"kind": "adam", "lr": 0.01},
        "batch_size": 64,
        "epochs": 20,
        "strategy": "allreduce",
        "workers": {"min": 1, "max": 1}
    })
}

/// Writes a TorchScript regression model (8 → 32 → 1, 321 parameters) to
/// `path` with Python's torch (`TRAINYARD_PYTHON`, else the venv's
/// `python3`, first on PATH in `scripts/test`).
pub fn write_torchscript(path: &std::path::Path) {
    let script = r#"
import sys, torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(8, 32)
        self.out = torch.nn.Linear(32, 1)
    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))
torch.manual_seed(0)
torch.jit.script(Net()).save(sys.argv[1])
"#;
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    // torch.jit.script reads the class's source, so it must live in a file.
    let file = path.with_extension("py");
    std::fs::write(&file, script).unwrap();
    let out = Command::new(&python)
        .arg(&file)
        .arg(path)
        .output()
        .expect("python3 with torch (run through scripts/test)");
    assert!(
        out.status.success(),
        "python could not write the model: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ps_spec_names_its_shards_mode_and_replicas_and_a_ring_spec_none() {
        let ring = MlpSpec::digits("r").steps(10).build();
        assert_eq!(ring["strategy"], "allreduce");
        assert_eq!(ring["steps"], 10);
        assert_eq!(ring["eval_fraction"], 0.2);
        for key in [
            "parameter_servers",
            "consistency",
            "replicas",
            "seed",
            "epochs",
        ] {
            assert!(ring.get(key).is_none(), "{key}: {ring}");
        }
        let ps = MlpSpec::digits("p")
            .epochs(3)
            .ps(2)
            .replicas(1)
            .consistency(Consistency::Bounded(2))
            .no_eval()
            .build();
        assert_eq!(ps["strategy"], "parameter_server");
        assert_eq!(ps["parameter_servers"], 2);
        assert_eq!(ps["replicas"], 1);
        assert_eq!(ps["consistency"], json!({"bounded": {"staleness": 2}}));
        assert!(ps.get("eval_fraction").is_none() && ps.get("steps").is_none());
        assert_eq!(Consistency::Sync.json(), "sync");
        assert_eq!(Consistency::Async.json(), "async");
    }
}
