//! A user's TorchScript module in a replica, written by Python's torch at
//! test time: BatchNorm (float and int64 buffers), dropout, a frozen
//! layer, a tied weight and an int64 counter of its own.

use super::*;
use crate::replica::process::Host;
use crate::storage::Fetcher;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use tch::{Kind, Tensor};

const MODULE: &str = r#"
import sys, torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(0.2)
        self.fc = torch.nn.Linear(4 * 8 * 8, 16)
        self.frozen = torch.nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.head = torch.nn.Linear(16, 10)
        self.head2 = torch.nn.Linear(16, 10)
        self.head2.weight = self.head.weight
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
    def forward(self, x):
        if self.training:
            self.steps += 1
        h = self.bn(self.conv(x.reshape(-1, 1, 8, 8))).relu()
        h = self.frozen(self.drop(self.fc(h.flatten(1))).relu()).relu()
        return self.head(h) + self.head2(h)
torch.manual_seed(0)
torch.jit.script(Net()).save(sys.argv[1])
"#;

/// Runs the Python `script` (the venv's torch: `TRAINYARD_PYTHON`, else
/// `python3`, first on PATH in `scripts/test`) with `arg`, from a file of
/// its own beside `arg` (`torch.jit.script` reads the classes' source).
pub(crate) fn python(script: &str, arg: &Path) {
    let file = arg.with_extension("make.py");
    std::fs::write(&file, script).unwrap();
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let run = Command::new(python)
        .arg(&file)
        .arg(arg)
        .output()
        .expect("python3 with torch (the venv of scripts/test)");
    assert!(
        run.status.success(),
        "python could not write the module: {}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// The module's file, written once per test binary.
pub(crate) fn module_file() -> PathBuf {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("trainyard-replica-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("bn.pt");
        python(MODULE, &out);
        out
    })
    .clone()
}

fn digits_url() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/digits.npz");
    format!("file://{}", p.canonicalize().unwrap().display())
}

pub(crate) fn spec() -> UncheckedJobSpec {
    let s: trainyard_common::JobSpec = serde_json::from_value(json!({
        "name": "byom",
        "model": {"kind": "torchscript", "url": format!("file://{}", module_file().display())},
        "dataset": {"kind": "file", "url": digits_url()}, "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "lr": 0.01},
        "batch_size": 32, "steps": 20, "seed": 1
    }))
    .unwrap();
    s.into()
}

fn replica() -> Replica {
    Replica::new(
        &spec(),
        tch::Device::Cpu,
        &Fetcher::local_only(),
        &Host::for_tests(),
    )
    .unwrap()
}

fn tensor<'a>(w: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &w.iter().find(|(k, _)| k == name).unwrap().1
}

fn step(r: &mut Replica) {
    let b = r.batches(0, 1, r.cursor).recv().unwrap();
    let (loss, g) = r.forward_backward(&b).unwrap();
    let samples = b.samples as f32;
    r.apply_summed(g, samples, loss / f64::from(samples), 0.01, b.next)
        .unwrap();
}

#[test]
fn tensors_keep_pytorchs_names_kinds_and_dtypes() {
    let r = replica();
    let infos = r.tensor_infos();
    let kind = |name: &str| {
        let i = infos.iter().find(|i| i.name == name).unwrap();
        (i.kind, i.dtype.as_str())
    };
    use trainyard_common::model::TensorKind::*;
    assert_eq!(kind("conv.weight"), (Parameter, "float32"));
    assert_eq!(kind("bn.running_mean"), (Buffer, "float32"));
    assert_eq!(kind("bn.num_batches_tracked"), (Buffer, "int64"));
    assert_eq!(kind("steps"), (Buffer, "int64"));
    assert_eq!(kind("frozen.weight"), (Frozen, "float32"));
    assert!(
        !infos.iter().any(|i| i.name == "head2.weight"),
        "a tied weight is listed once"
    );
    // The final weights are the module's state_dict(), every name of it.
    let mut names: Vec<String> = r.weights().into_iter().map(|(k, _)| k).collect();
    names.sort();
    let mut want = vec![
        "bn.bias",
        "bn.num_batches_tracked",
        "bn.running_mean",
        "bn.running_var",
        "bn.weight",
        "conv.bias",
        "conv.weight",
        "fc.bias",
        "fc.weight",
        "frozen.bias",
        "frozen.weight",
        "head.bias",
        "head.weight",
        "head2.bias",
        "head2.weight",
        "steps",
    ];
    want.sort();
    assert_eq!(names, want);
    // The flat vector: parameters, then the buffers.
    let layout = r.layout();
    let first_buffer = layout
        .iter()
        .position(|(k, ..)| k.starts_with("bn.running") || k == "steps" || k.ends_with("tracked"))
        .unwrap();
    assert_eq!(layout[first_buffer].1, r.trainable_len());
    assert_eq!(r.numel(), r.trainable_len() + 4 + 4 + 1 + 1);
}

#[test]
fn training_moves_buffers_evaluation_does_not_and_frozen_stays() {
    let mut r = replica();
    let frozen = tensor(&r.weights(), "frozen.weight").copy();
    for _ in 0..3 {
        step(&mut r);
    }
    let w = r.weights();
    assert_eq!(tensor(&w, "bn.num_batches_tracked").kind(), Kind::Int64);
    assert_eq!(tensor(&w, "bn.num_batches_tracked").int64_value(&[]), 3);
    assert_eq!(tensor(&w, "steps").int64_value(&[]), 3);
    assert!(
        tensor(&w, "bn.running_mean")
            .abs()
            .sum(Kind::Float)
            .double_value(&[])
            > 0.0
    );
    assert!(
        tensor(&w, "frozen.weight").equal(&frozen),
        "frozen layer changed"
    );
    assert!(
        tensor(&w, "head2.weight").equal(tensor(&w, "head.weight")),
        "tied weights parted"
    );
    let (_, acc) = r.evaluate_now();
    assert!(acc.is_some());
    let after = r.weights();
    assert_eq!(
        tensor(&after, "steps").int64_value(&[]),
        3,
        "evaluation ran in training mode"
    );
    assert!(tensor(&after, "bn.running_var").equal(tensor(&w, "bn.running_var")));
}

#[test]
fn rank_0s_buffers_ride_with_the_gradient_and_win() {
    let (mut a, mut b) = (replica(), replica());
    b.set_carries_state(false);
    let batch_a = a.batches(0, 2, a.cursor).recv().unwrap();
    let batch_b = b.batches(1, 2, b.cursor).recv().unwrap();
    let (la, ga) = a.forward_backward(&batch_a).unwrap();
    let (lb, gb) = b.forward_backward(&batch_b).unwrap();
    let (ga, gb) = (ga.unwrap().copy(), gb.unwrap().copy());
    let p = a.trainable_len() as i64;
    let tail = a.numel() as i64 - p;
    assert_eq!(
        gb.narrow(0, p, tail)
            .abs()
            .sum(Kind::Float)
            .double_value(&[]),
        0.0
    );
    let sum = &ga + &gb;
    let total = (batch_a.samples + batch_b.samples) as f32;
    let loss = (la + lb) / f64::from(total);
    a.apply_summed(Some(sum.copy()), total, loss, 0.01, batch_a.next)
        .unwrap();
    b.apply_summed(Some(sum), total, loss, 0.01, batch_a.next)
        .unwrap();
    assert_eq!(a.weights_sha256(), b.weights_sha256());
    let (wa, wb) = (a.weights(), b.weights());
    for (k, t) in &wa {
        assert!(t.equal(tensor(&wb, k)), "{k} differs between the replicas");
    }
    assert_eq!(tensor(&wb, "steps").int64_value(&[]), 1);
}

#[test]
fn export_import_and_the_saved_module_carry_the_buffers() {
    let mut a = replica();
    for _ in 0..2 {
        step(&mut a);
    }
    let mut c = replica();
    c.import(&a.export()).unwrap();
    let (wa, wc) = (a.weights(), c.weights());
    for (k, t) in &wa {
        assert!(t.equal(tensor(&wc, k)), "{k} lost in export/import");
    }
    let bytes = a.torchscript().unwrap().unwrap();
    let file = module_file().with_file_name(format!("trained-{}.pt", std::process::id()));
    std::fs::write(&file, bytes).unwrap();
    let m = torchscript::Module::load(&file, tch::Device::Cpu).unwrap();
    let saved: Vec<(String, Tensor)> = m
        .parameters()
        .unwrap()
        .into_iter()
        .chain(m.buffers().unwrap())
        .collect();
    for (k, t) in &saved {
        assert!(
            t.equal(tensor(&wa, k)),
            "{k} in the saved module is not the trained one"
        );
    }
    // Saving left the module's parameters views of the flat weights: a
    // step still trains the module itself.
    let before = tensor(&a.weights(), "conv.weight").copy();
    step(&mut a);
    assert!(!tensor(&a.weights(), "conv.weight").equal(&before));
    let mut d = replica();
    d.import(&a.export()).unwrap();
    assert!(tensor(&d.weights(), "conv.weight").equal(tensor(&a.weights(), "conv.weight")));
}

/// A role's replica reads only what its assignment's data policy allows:
/// a model URL outside it fails the replica with the URL named and the
/// policy's reason, and the same spec under a policy that allows its
/// folders builds.
#[test]
fn a_replica_refuses_a_model_url_outside_its_jobs_data_policy() {
    use trainyard_common::artifact::DataPolicy;
    let s = spec();
    let data_dir = std::path::Path::new(digits_url().trim_start_matches("file://"))
        .parent()
        .unwrap()
        .to_path_buf();
    let only_data = DataPolicy {
        allowed_prefixes: vec![format!("file://{}/", data_dir.display())],
        ..DataPolicy::default()
    };
    let fetcher = Fetcher::local_only().with_policy(only_data.clone());
    let err = Replica::new(&s, tch::Device::Cpu, &fetcher, &Host::for_tests())
        .err()
        .expect("refused")
        .to_string();
    let trainyard_common::spec::ModelSpec::Torchscript(t) = s.model() else {
        unreachable!()
    };
    assert!(err.contains(&t.url) && err.contains("refused"), "{err}");
    let model_dir = module_file().parent().unwrap().to_path_buf();
    let both = DataPolicy {
        allowed_prefixes: vec![
            format!("file://{}/", data_dir.display()),
            format!("file://{}/", model_dir.display()),
        ],
        ..only_data
    };
    let fetcher = Fetcher::local_only().with_policy(both);
    assert!(Replica::new(&s, tch::Device::Cpu, &fetcher, &Host::for_tests()).is_ok());
}
