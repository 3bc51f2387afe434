//! Unit and property tests of spec validation.

use super::*;
use proptest::prelude::{
    any, prop, prop_assert, prop_assert_eq, prop_oneof, proptest, Just, Strategy as PropStrategy,
};
use serde_json::{json, Value};

fn digits() -> Value {
    json!({
        "name": "digits-mlp",
        "model": {"kind": "mlp", "inputs": 64, "hidden": [128, 64], "outputs": 10},
        "dataset": {"kind": "file", "url": "file:///data/digits.npz"},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adamw", "lr": 0.001, "weight_decay": 0.01,
                      "schedule": {"kind": "warmup_cosine", "warmup_steps": 10}},
        "batch_size": 64,
        "steps": 500,
        "strategy": "parameter_server",
        "workers": {"min": 2, "max": 4},
        "parameter_servers": 2,
        "consistency": {"bounded": {"staleness": 2}},
        "checkpoint": {"every_steps": 100, "keep": 2},
        "resources": {"device": "cpu", "memory_mb": 512},
        "seed": 7
    })
}

fn parse(v: &Value) -> Result<JobSpec, SpecError> {
    JobSpec::from_json(&serde_json::to_vec(v).unwrap())
}

/// Sets `path` (dotted) in `v` to `new`.
fn with(mut v: Value, path: &str, new: Value) -> Value {
    let mut cur = &mut v;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        // An optional section the base spec leaves out is made.
        cur = cur
            .as_object_mut()
            .unwrap()
            .entry(*p)
            .or_insert_with(|| json!({}));
    }
    cur.as_object_mut()
        .unwrap()
        .insert(parts[parts.len() - 1].to_owned(), new);
    v
}

fn fields(e: &SpecError) -> Vec<String> {
    e.violations().iter().map(|v| v.field.clone()).collect()
}

#[test]
fn valid_spec_parses_and_round_trips() {
    let spec = parse(&digits()).unwrap();
    assert_eq!(spec.name, "digits-mlp");
    let back = serde_json::to_value(&spec).unwrap();
    let again: JobSpec = serde_json::from_value(back.clone()).unwrap();
    assert_eq!(again, spec);
    assert_eq!(serde_json::to_value(&again).unwrap(), back);
}

#[test]
fn a_stored_spec_reads_back_as_it_was_stored_or_says_what_is_wrong() {
    let spec = parse(&digits()).unwrap();
    let stored = serde_json::to_value(&spec).unwrap();
    assert_eq!(JobSpec::from_stored(stored.clone()).unwrap(), spec);
    // Not the shape of a spec: the field is named.
    let bad = with(stored.clone(), "checkpoint.keep", json!("two"));
    match JobSpec::from_stored(bad) {
        Err(StoredSpecError::Decode { path, message }) => {
            assert_eq!(path, "checkpoint.keep");
            assert!(!message.contains(" at line "), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // The shape of one, but against the rules (keep 0 is never valid).
    let bad = with(stored, "checkpoint.keep", json!(0));
    match JobSpec::from_stored(bad) {
        Err(e @ StoredSpecError::Invalid(_)) => {
            assert!(e.to_string().contains("checkpoint.keep"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(JobSpec::from_stored(json!([1, 2])).is_err());
}

#[test]
fn defaults_are_filled_in() {
    let v = json!({
        "name": "x",
        "model": {"kind": "mlp", "inputs": 4, "outputs": 3},
        "dataset": {"kind": "classification", "samples": 100, "features": 4, "classes": 3},
        "loss": "cross_entropy",
        "optimizer": {"kind": "sgd", "lr": 0.1},
        "batch_size": 8,
        "epochs": 1
    });
    let s = parse(&v).unwrap();
    assert_eq!(s.strategy, Strategy::Auto);
    assert_eq!(s.workers, WorkerRange { min: 1, max: 1 });
    assert_eq!(s.checkpoint.keep, 3);
    assert!(s.checkpoint.at_end);
    assert_eq!(s.resources.memory_mb, 1024);
    assert_eq!(s.eval_fraction, 0.1);
    assert_eq!(s.consistency_mode(), Consistency::Sync);
}

#[test]
fn malformed_json_is_a_syntax_error() {
    assert!(matches!(
        JobSpec::from_json(b"{\"name\": "),
        Err(SpecError::Syntax(_))
    ));
    assert!(matches!(
        JobSpec::from_json(b"not json"),
        Err(SpecError::Syntax(_))
    ));
    // A shape error early in a document that is not JSON at all is still a syntax error.
    assert!(matches!(
        JobSpec::from_json(b"[1, 2"),
        Err(SpecError::Syntax(_))
    ));
    assert!(matches!(JobSpec::from_json(b""), Err(SpecError::Syntax(_))));
}

#[test]
fn unknown_fields_are_rejected_at_every_level() {
    for path in [
        "colour",
        "model.colour",
        "optimizer.colour",
        "workers.colour",
        "checkpoint.colour",
        "resources.colour",
        "dataset.colour",
    ] {
        let e = parse(&with(digits(), path, json!(1))).unwrap_err();
        assert!(matches!(e, SpecError::Shape(_)), "{path}: {e:?}");
        let msg = &e.violations()[0].message;
        assert!(msg.contains("unknown field `colour`"), "{path}: {msg}");
        // Inside tagged enums (model, dataset) the path stops at the enum.
        let field = &e.violations()[0].field;
        assert!(
            path == field || path.starts_with(&format!("{field}.")),
            "{path}: {field}"
        );
    }
}

#[test]
fn unknown_fields_inside_consistency_are_rejected() {
    let v = with(
        digits(),
        "consistency",
        json!({"bounded": {"staleness": 3, "colour": 1}}),
    );
    let e = parse(&v).unwrap_err();
    assert!(matches!(e, SpecError::Shape(_)), "{e:?}");
    assert!(e.violations()[0].message.contains("colour"));
}

#[test]
fn wrong_types_name_the_field() {
    let e = parse(&with(digits(), "optimizer.lr", json!("fast"))).unwrap_err();
    assert!(matches!(e, SpecError::Shape(_)));
    assert_eq!(fields(&e), ["optimizer.lr"]);
    let e = parse(&with(digits(), "batch_size", json!(-1))).unwrap_err();
    assert_eq!(fields(&e), ["batch_size"]);
    let e = parse(&with(digits(), "model.kind", json!("resnet"))).unwrap_err();
    assert_eq!(fields(&e), ["model.kind"]);
}

#[test]
fn missing_required_field_is_named() {
    let mut v = digits();
    v.as_object_mut().unwrap().remove("loss");
    let e = parse(&v).unwrap_err();
    assert_eq!(fields(&e), ["loss"]);
    assert!(e.violations()[0].message.starts_with("missing"), "{e}");
}

#[test]
fn each_bound_is_rejected_with_its_field() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("name", json!(""), "name"),
        ("name", json!("x".repeat(129)), "name"),
        ("name", json!("a\u{7}b"), "name"),
        ("model.inputs", json!(0), "model.inputs"),
        ("model.hidden", json!([128, 0]), "model.hidden[1]"),
        ("model.hidden", json!(vec![1; 33]), "model.hidden"),
        ("dataset.url", json!("ftp://x/y.npz"), "dataset.url"),
        ("dataset.url", json!("file://relative/y.npz"), "dataset.url"),
        ("dataset.url", json!("s3://bucket"), "dataset.url"),
        ("dataset.url", json!("artifact:../bob/x.npz"), "dataset.url"),
        ("dataset.url", json!("artifact:"), "dataset.url"),
        (
            "dataset.url",
            json!("file:///data/digits.csv"),
            "dataset.format",
        ),
        ("optimizer.lr", json!(0.0), "optimizer.lr"),
        ("optimizer.lr", json!(11.0), "optimizer.lr"),
        (
            "optimizer.weight_decay",
            json!(2.0),
            "optimizer.weight_decay",
        ),
        ("optimizer.momentum", json!(0.9), "optimizer.momentum"),
        ("optimizer.betas", json!([0.9, 1.0]), "optimizer.betas[1]"),
        ("optimizer.grad_clip", json!(0.0), "optimizer.grad_clip"),
        (
            "optimizer.schedule.warmup_steps",
            json!(500),
            "optimizer.schedule.warmup_steps",
        ),
        ("batch_size", json!(0), "batch_size"),
        ("batch_size", json!(70000), "batch_size"),
        ("steps", json!(0), "steps"),
        ("epochs", json!(3), "steps"),
        ("workers.min", json!(0), "workers.min"),
        ("workers.max", json!(1), "workers.max"),
        ("workers.max", json!(2000), "workers.max"),
        ("parameter_servers", json!(0), "parameter_servers"),
        ("parameter_servers", json!(300), "parameter_servers"),
        (
            "consistency",
            json!({"bounded": {"staleness": 20000}}),
            "consistency.bounded.staleness",
        ),
        ("checkpoint.every_steps", json!(0), "checkpoint.every_steps"),
        (
            "checkpoint.every_seconds",
            json!(0),
            "checkpoint.every_seconds",
        ),
        ("checkpoint.keep", json!(0), "checkpoint.keep"),
        ("resources.memory_mb", json!(1), "resources.memory_mb"),
        ("eval_fraction", json!(0.9), "eval_fraction"),
        ("priority", json!(1001), "priority"),
        ("watchdog.stuck_factor", json!(1), "watchdog.stuck_factor"),
        (
            "watchdog.stuck_floor_seconds",
            json!(0.5),
            "watchdog.stuck_floor_seconds",
        ),
        (
            "watchdog.straggler_factor",
            json!(1.0),
            "watchdog.straggler_factor",
        ),
        ("watchdog.window_steps", json!(4), "watchdog.window_steps"),
    ];
    for (path, value, field) in cases {
        let e = parse(&with(digits(), path, value.clone())).unwrap_err();
        assert!(
            fields(&e).iter().any(|f| f == field),
            "{path}={value}: expected {field}, got {e:?}"
        );
    }
}

#[test]
fn all_violations_are_listed() {
    let mut v = with(digits(), "batch_size", json!(0));
    v = with(v, "optimizer.lr", json!(-1.0));
    v = with(v, "workers.min", json!(0));
    v = with(v, "name", json!(""));
    let e = parse(&v).unwrap_err();
    let f = fields(&e);
    for want in ["batch_size", "optimizer.lr", "workers.min", "name"] {
        assert!(f.iter().any(|x| x == want), "{want} missing from {f:?}");
    }
}

#[test]
fn model_and_data_must_agree() {
    let v = with(
        digits(),
        "dataset",
        json!({"kind": "classification", "samples": 10, "features": 32, "classes": 10}),
    );
    assert_eq!(fields(&parse(&v).unwrap_err()), ["model.inputs"]);
    let v = with(v, "model.inputs", json!(32));
    let v = with(v, "loss", json!("mse"));
    assert_eq!(fields(&parse(&v).unwrap_err()), ["loss"]);
    let v = with(
        digits(),
        "model",
        json!({"kind": "transformer", "vocab": 256, "context": 32, "layers": 2, "heads": 4, "width": 66}),
    );
    let f = fields(&parse(&v).unwrap_err());
    assert!(f.contains(&"model.width".to_owned()), "{f:?}");
    let v = with(
        digits(),
        "model",
        json!({"kind": "cnn", "channels": 1, "height": 8, "width": 8, "conv_channels": [8, 8, 8, 8], "hidden": 32, "classes": 10}),
    );
    assert!(fields(&parse(&v).unwrap_err()).contains(&"model.conv_channels".to_owned()));
}

#[test]
fn strategy_specific_fields_are_rejected_elsewhere() {
    let v = with(digits(), "strategy", json!("allreduce"));
    let f = fields(&parse(&v).unwrap_err());
    assert_eq!(f, ["parameter_servers", "consistency"]);
}

#[test]
fn until_is_all_unless_given_and_only_for_an_out_of_sync_ps_job() {
    let bounded = parse(&digits()).unwrap();
    assert_eq!(bounded.until_mode(), Until::All);
    let first = parse(&with(digits(), "until", json!("first"))).unwrap();
    assert_eq!(first.until_mode(), Until::First);
    let all = with(
        with(digits(), "until", json!("all")),
        "consistency",
        json!("async"),
    );
    assert_eq!(parse(&all).unwrap().until_mode(), Until::All);
    // Sync workers walk one stream together: nothing to choose.
    let sync = with(
        with(digits(), "until", json!("first")),
        "consistency",
        json!("sync"),
    );
    let e = parse(&sync).unwrap_err();
    assert_eq!(fields(&e), ["until"]);
    assert!(e.to_string().contains("async and bounded"), "{e}");
    let mut unset = with(digits(), "until", json!("all"));
    unset.as_object_mut().unwrap().remove("consistency");
    assert_eq!(fields(&parse(&unset).unwrap_err()), ["until"]);
    let mut ring = with(digits(), "until", json!("first"));
    ring["strategy"] = json!("allreduce");
    for f in ["parameter_servers", "consistency"] {
        ring.as_object_mut().unwrap().remove(f);
    }
    assert_eq!(fields(&parse(&ring).unwrap_err()), ["until"]);
    assert!(parse(&with(digits(), "until", json!("last"))).is_err());
}

#[test]
fn replicas_are_0_or_1_and_only_for_the_ps_tier() {
    let one = with(digits(), "replicas", json!(1));
    let spec = parse(&one).unwrap();
    assert_eq!(spec.ps_replicas(), 1);
    // The PS tier is held twice: each shard and its standby.
    let e = spec.estimate().unwrap();
    assert_eq!(e.ps_replicas, 1);
    assert_eq!(e.ps_tier_total_bytes(), 2 * e.ps_tier_bytes);
    assert_eq!(parse(&digits()).unwrap().ps_replicas(), 0);
    assert_eq!(
        parse(&with(digits(), "replicas", json!(0)))
            .unwrap()
            .ps_replicas(),
        0
    );
    let e = parse(&with(digits(), "replicas", json!(2))).unwrap_err();
    assert_eq!(fields(&e), ["replicas"]);
    assert!(e.to_string().contains("between 0 and 1"), "{e}");
    assert_eq!(
        fields(&parse(&with(digits(), "replicas", json!(-1))).unwrap_err()),
        ["replicas"]
    );
    let mut ring = with(one, "strategy", json!("allreduce"));
    ring.as_object_mut().unwrap().remove("parameter_servers");
    ring.as_object_mut().unwrap().remove("consistency");
    assert_eq!(fields(&parse(&ring).unwrap_err()), ["replicas"]);
}

#[test]
fn memory_arithmetic_decides_auto_and_rejects_what_cannot_fit() {
    // 8.4 M parameters with Adam: 16 B/param = 128 MiB for a ring replica.
    let big = json!({"kind": "mlp", "inputs": 64, "hidden": [4096, 2048], "outputs": 10});
    let v = with(
        with(digits(), "model", big.clone()),
        "strategy",
        json!("auto"),
    );
    let v = with(v, "resources.memory_mb", json!(100));
    // auto is decided by the scheduler; the spec only has to fit one way.
    assert!(parse(&v).is_ok());
    let v = with(v.clone(), "resources.memory_mb", json!(200));
    assert!(parse(&v).is_ok());
    // 120 MiB of PS-worker weights and gradients cannot fit 64 MiB either way.
    let tiny = with(v.clone(), "resources.memory_mb", json!(64));
    assert_eq!(fields(&parse(&tiny).unwrap_err()), ["resources.memory_mb"]);
    let mut v = with(with(digits(), "model", big), "strategy", json!("allreduce"));
    v.as_object_mut().unwrap().remove("parameter_servers");
    v.as_object_mut().unwrap().remove("consistency");
    let v = with(v, "resources.memory_mb", json!(100));
    assert_eq!(fields(&parse(&v).unwrap_err()), ["resources.memory_mb"]);
}

#[test]
fn file_format_comes_from_the_extension() {
    assert_eq!(file_format_from_url("s3://b/x.NPZ"), Some(FileFormat::Npz));
    assert_eq!(
        file_format_from_url("artifact:digits.npz"),
        Some(FileFormat::Npz)
    );
    assert_eq!(file_format_from_url("file:///a.b/c"), None);
    assert_eq!(
        file_format_from_url("file:///t.txt"),
        Some(FileFormat::Text)
    );
}

fn arb_valid() -> impl PropStrategy<Value = Value> {
    (
        "[a-z][a-z0-9-]{0,40}",
        1u32..=512,
        prop::collection::vec(1u32..=512, 0..4),
        2u32..=50,
        1u32..=1024,
        (1u32..=16, 0u32..=16),
        prop::option::of(1u32..=8),
        0u32..=3,
        1e-5f64..1.0,
        any::<u64>(),
    )
        .prop_map(|(name, inputs, hidden, classes, batch, (wmin, extra), ps, opt, lr, seed)| {
            let kind = ["sgd", "momentum", "adam", "adamw"][opt as usize];
            let mut v = json!({
                "name": name,
                "model": {"kind": "mlp", "inputs": inputs, "hidden": hidden, "outputs": classes},
                "dataset": {"kind": "classification", "samples": 1000, "features": inputs, "classes": classes},
                "loss": "cross_entropy",
                "optimizer": {"kind": kind, "lr": lr},
                "batch_size": batch,
                "epochs": 2,
                "strategy": "parameter_server",
                "workers": {"min": wmin, "max": wmin + extra},
                "seed": seed,
                "resources": {"memory_mb": 4096}
            });
            if let Some(ps) = ps {
                v["parameter_servers"] = json!(ps);
            }
            v
        })
}

proptest! {
    #[test]
    fn generated_valid_specs_round_trip(v in arb_valid()) {
        let spec = parse(&v).unwrap();
        let json = serde_json::to_vec(&spec).unwrap();
        let again = JobSpec::from_json(&json).unwrap();
        prop_assert_eq!(&again, &spec);
    }

    #[test]
    fn out_of_range_batch_is_always_named(v in arb_valid(), b in prop_oneof![Just(0u64), (u64::from(MAX_BATCH) + 1)..u64::from(u32::MAX)]) {
        let e = parse(&with(v, "batch_size", json!(b))).unwrap_err();
        prop_assert!(fields(&e).contains(&"batch_size".to_owned()));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = JobSpec::from_json(&bytes);
    }

    #[test]
    fn arbitrary_numbers_never_panic(lr in any::<f64>(), mem in any::<u64>(), w in any::<u32>(), h in prop::collection::vec(any::<u32>(), 0..5)) {
        let v = with(with(with(digits(), "optimizer.lr", json!(lr)), "resources.memory_mb", json!(mem)), "model.hidden", json!(h));
        let v = with(v, "workers.max", json!(w));
        let _ = parse(&v);
    }
}

#[test]
fn globs_match_stars_within_a_name() {
    for (p, n, m) in [
        ("part-*.npz", "part-0001.npz", true),
        ("part-*.npz", "part-.npz", true),
        ("part-*.npz", "part-1.npz.tmp", false),
        ("*", "anything", true),
        ("a*b*c", "abc", true),
        ("a*b*c", "aXbYc", true),
        ("a*b*c", "acb", false),
        ("ab*ba", "aba", false),
        ("x.npz", "x.npz", true),
        ("x.npz", "y.npz", false),
    ] {
        assert_eq!(glob_matches(p, n), m, "{p} vs {n}");
    }
    assert!(is_glob("s3://b/train/part-*.parquet"));
    assert!(!is_glob("s3://b/tr*ain/part.parquet"));
    assert!(is_manifest("file:///d/shards.JSON"));
    assert!(FileData::at("s3://b/x.parquet").is_sharded());
    assert!(!FileData::at("s3://b/x.npz").is_sharded());
}

fn ddp_script() -> Value {
    json!({
        "name": "ddp",
        "script": {"code": "artifact:train.py", "args": ["--epochs", "3"], "env": {"SEED": "1"}},
        "inputs": ["artifact:digits.npz"],
        "workers": {"min": 2, "max": 3},
        "resources": {"memory_mb": 2048},
    })
}

#[test]
fn a_script_job_parses_round_trips_and_has_no_model_parts() {
    let spec = parse(&ddp_script()).unwrap();
    assert!(spec.is_script() && spec.model_job().is_none());
    let s = spec.script.as_ref().unwrap();
    assert_eq!(s.entrypoint().as_deref(), Some("train.py"));
    assert_eq!(s.max_restarts(), script::DEFAULT_SCRIPT_RESTARTS);
    let back = serde_json::to_value(&spec).unwrap();
    assert!(
        back.get("model").is_none() && back.get("batch_size").is_none(),
        "{back}"
    );
    assert_eq!(parse(&back).unwrap(), spec);
    // An archive names its entrypoint.
    let tar = with(ddp_script(), "script.code", json!("artifact:code.tar.gz"));
    assert_eq!(fields(&parse(&tar).unwrap_err()), ["script.entrypoint"]);
    let tar = with(tar, "script.entrypoint", json!("src/train.py"));
    assert_eq!(
        parse(&tar)
            .unwrap()
            .script
            .as_ref()
            .unwrap()
            .entrypoint()
            .as_deref(),
        Some("src/train.py")
    );
    assert_eq!(input_name("artifact:digits.npz"), "digits.npz");
    assert_eq!(input_name("s3://b/data/x.parquet"), "x.parquet");
}

#[test]
fn a_script_job_refuses_a_model_jobs_fields_and_the_ps_pattern_by_name() {
    for (field, value) in [
        (
            "model",
            json!({"kind": "mlp", "inputs": 64, "hidden": [], "outputs": 10}),
        ),
        (
            "dataset",
            json!({"kind": "file", "url": "file:///data/digits.npz"}),
        ),
        ("loss", json!("mse")),
        ("optimizer", json!({"kind": "sgd", "lr": 0.1})),
        ("batch_size", json!(32)),
        ("steps", json!(10)),
        ("epochs", json!(1)),
        ("strategy", json!("parameter_server")),
        ("parameter_servers", json!(1)),
        ("compression", json!("bf16")),
    ] {
        let e = parse(&with(ddp_script(), field, value)).unwrap_err();
        assert_eq!(fields(&e), [field], "{e}");
    }
    let e = parse(&with(ddp_script(), "strategy", json!("parameter_server"))).unwrap_err();
    assert!(e.to_string().contains("not offered to script jobs"), "{e}");
    // allreduce and auto are torchrun's pattern.
    for s in ["allreduce", "auto"] {
        parse(&with(ddp_script(), "strategy", json!(s))).unwrap();
    }
    // Neither a model nor a script: every missing part is named.
    let mut none = ddp_script();
    none.as_object_mut().unwrap().remove("script");
    none.as_object_mut().unwrap().remove("inputs");
    let e = parse(&none).unwrap_err();
    assert_eq!(
        fields(&e),
        ["model", "dataset", "loss", "optimizer", "batch_size"]
    );
    // A model job has no inputs.
    let e = parse(&with(digits(), "inputs", json!(["artifact:x.npz"]))).unwrap_err();
    assert_eq!(fields(&e), ["inputs"]);
}

#[test]
fn a_scripts_paths_environment_and_inputs_are_bounded_and_safe() {
    let bad = [
        ("script.code", json!("artifact:train.sh"), "script.code"),
        ("script.code", json!("ftp://x/train.py"), "script.code"),
        (
            "script.entrypoint",
            json!("../escape.py"),
            "script.entrypoint",
        ),
        ("script.entrypoint", json!("/etc/x.py"), "script.entrypoint"),
        ("script.entrypoint", json!("other.py"), "script.entrypoint"),
        ("script.python", json!("../../bin/sh"), "script.python"),
        ("script.max_restarts", json!(101), "script.max_restarts"),
        ("script.env", json!({"RANK": "3"}), "script.env.RANK"),
        (
            "script.env",
            json!({"MASTER_ADDR": "10.0.0.1"}),
            "script.env.MASTER_ADDR",
        ),
        (
            "script.env",
            json!({"LD_PRELOAD": "/x.so"}),
            "script.env.LD_PRELOAD",
        ),
        (
            "script.env",
            json!({"TRAINYARD_TOKEN": "x"}),
            "script.env.TRAINYARD_TOKEN",
        ),
        (
            "script.env",
            json!({"PYTHONPATH": "/"}),
            "script.env.PYTHONPATH",
        ),
        ("script.env", json!({"1BAD": "x"}), "script.env.1BAD"),
        ("script.args", json!(["a\u{0}b"]), "script.args[0]"),
        (
            "inputs",
            json!(["file:///data/a/x.npz", "file:///data/b/x.npz"]),
            "inputs[1]",
        ),
        ("inputs", json!(["artifact:shard-*.npz"]), "inputs[0]"),
        ("inputs", json!(["http://"]), "inputs[0]"),
    ];
    for (path, value, field) in bad {
        let e = parse(&with(ddp_script(), path, value.clone())).unwrap_err();
        assert_eq!(fields(&e), [field], "{path} = {value}: {e}");
    }
    let many: Vec<String> = (0..=script::MAX_SCRIPT_ARGS)
        .map(|i| i.to_string())
        .collect();
    let e = parse(&with(ddp_script(), "script.args", json!(many))).unwrap_err();
    assert_eq!(fields(&e), ["script.args"]);
    let long = "x".repeat(script::MAX_SCRIPT_VALUE_BYTES + 1);
    let e = parse(&with(ddp_script(), "script.env", json!({"K": long}))).unwrap_err();
    assert_eq!(fields(&e), ["script.env.K"]);
    let e = parse(&with(ddp_script(), "script.unknown", json!(1))).unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
}

#[test]
fn a_scripts_time_limit_is_positive_bounded_and_a_day_by_default() {
    let s = parse(&ddp_script()).unwrap();
    let limit = s.script.as_ref().unwrap().time_limit();
    assert_eq!(limit.as_secs(), script::DEFAULT_SCRIPT_SECONDS);
    assert_eq!(limit.as_secs(), 24 * 3600);
    for ok in [1, 3, script::MAX_SCRIPT_SECONDS] {
        let s = parse(&with(ddp_script(), "script.max_seconds", json!(ok))).unwrap();
        let script = s.script.as_ref().unwrap();
        assert_eq!(script.time_limit().as_secs(), ok);
        // It survives the stored spec's round trip.
        let back = serde_json::to_value(&s).unwrap();
        assert_eq!(back["script"]["max_seconds"], ok, "{back}");
    }
    // Out of range: a rule violation naming the field and the bounds.
    for bad in [0, script::MAX_SCRIPT_SECONDS + 1] {
        let e = parse(&with(ddp_script(), "script.max_seconds", json!(bad))).unwrap_err();
        assert!(matches!(e, SpecError::Invalid(_)), "{bad}: {e}");
        assert_eq!(fields(&e), ["script.max_seconds"], "{bad}: {e}");
        let message = &e.violations()[0].message;
        assert!(
            message.contains("between 1 and") && message.contains(&bad.to_string()),
            "{message}"
        );
    }
    // Not a whole number of seconds: a shape error naming the field.
    for bad in [json!(-1), json!(1.5), json!("3")] {
        let e = parse(&with(ddp_script(), "script.max_seconds", bad.clone())).unwrap_err();
        assert!(matches!(e, SpecError::Shape(_)), "{bad}: {e}");
        assert_eq!(fields(&e), ["script.max_seconds"], "{bad}: {e}");
    }
}

proptest! {
    /// A worker is charged what its job asks, and a CPU script rank its
    /// spare interpreter besides (it lives in the executor's RAM, the CPU
    /// device's memory); a model job, or a script on a GPU, nothing more.
    #[test]
    fn a_cpu_script_rank_is_charged_its_spare_interpreter_too(
        mem in MIN_MEMORY_MB..=MAX_MEMORY_MB,
        script in any::<bool>(),
        cuda in any::<bool>(),
    ) {
        let base = if script { ddp_script() } else { digits() };
        let device = if cuda { "cuda" } else { "cpu" };
        let v = with(with(base, "resources.memory_mb", json!(mem)), "resources.device", json!(device));
        let spec = parse(&v).unwrap();
        let charged = spec.worker_memory_mb();
        let spare = if script && !cuda { script::SPARE_INTERPRETER_MB } else { 0 };
        prop_assert_eq!(charged, mem + spare);
        prop_assert!(charged >= spec.resources.memory_mb);
    }
}

#[test]
fn image_and_input_settings_are_checked_with_their_fields() {
    let images = |dataset: Value| {
        let v = with(digits(), "dataset", dataset);
        with(
            v,
            "model",
            json!({"kind": "torchscript", "url": "file:///m.pt"}),
        )
    };
    // An image folder (a URL ending in /) and WebDataset shards parse.
    let folder = images(json!({"kind": "file", "url": "s3://b/train/",
        "transforms": [{"resize": 36}, {"center_crop": 36}, {"random_crop": 32}, {"horizontal_flip": 0.5}],
        "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]}}));
    let s = parse(&folder).unwrap();
    let DatasetSpec::File(f) = s.dataset() else {
        panic!()
    };
    assert_eq!(f.format_or_guess(), Some(FileFormat::ImageFolder));
    assert!(f.is_sharded());
    let tars = images(json!({"kind": "file", "url": "s3://b/shard-*.tar", "channels": 1}));
    assert!(parse(&tars).is_ok());
    let cases = [
        (
            json!({"kind": "file", "url": "s3://b/t/", "transforms": [{"random_crop": 8}, {"resize": 9}]}),
            "dataset.transforms[1]",
        ),
        (
            json!({"kind": "file", "url": "s3://b/t/", "transforms": [{"horizontal_flip": 1.5}]}),
            "dataset.transforms[0]",
        ),
        (
            json!({"kind": "file", "url": "s3://b/t/", "transforms": [{"center_crop": 0}]}),
            "dataset.transforms[0]",
        ),
        (
            json!({"kind": "file", "url": "s3://b/t/", "channels": 2}),
            "dataset.channels",
        ),
        (
            json!({"kind": "file", "url": "s3://b/t/", "normalize": {"mean": [0.5, 0.5], "std": [1, 1]}}),
            "dataset.normalize",
        ),
        (
            json!({"kind": "file", "url": "s3://b/d.npz", "normalize": {"mean": [0.5], "std": [0]}}),
            "dataset.normalize.std",
        ),
        (
            json!({"kind": "file", "url": "s3://b/d.npz", "transforms": [{"resize": 8}]}),
            "dataset.transforms",
        ),
        (
            json!({"kind": "file", "url": "s3://b/d.npz", "channels": 3}),
            "dataset.channels",
        ),
        (
            json!({"kind": "file", "url": "s3://b/d.npz", "inputs": ["ids"]}),
            "dataset.inputs",
        ),
        (
            json!({"kind": "file", "url": "s3://b/d.npz", "inputs": ["ids", "ids"]}),
            "dataset.inputs",
        ),
        (
            json!({"kind": "file", "url": "s3://b/d.parquet", "inputs": ["a", "b"], "x_columns": ["a"]}),
            "dataset.x_columns",
        ),
        (
            json!({"kind": "file", "url": "s3://b/t/", "inputs": ["a", "b"]}),
            "dataset.inputs",
        ),
    ];
    for (dataset, field) in cases {
        let e = parse(&images(dataset.clone())).unwrap_err();
        assert!(fields(&e).iter().any(|f| f == field), "{dataset}: {e:?}");
    }
    // Several inputs go to a TorchScript model only.
    let mlp = with(
        digits(),
        "dataset",
        json!({"kind": "file", "url": "s3://b/d.npz", "inputs": ["a", "b"]}),
    );
    assert!(fields(&parse(&mlp).unwrap_err()).contains(&"dataset.inputs".to_owned()));
    assert!(parse(&images(
        json!({"kind": "file", "url": "s3://b/d.npz", "inputs": ["ids", "mask"]})
    ))
    .is_ok());
}

#[test]
fn a_scripts_requirements_name_index_packages_only() {
    for ok in [
        json!("artifact:requirements.txt"),
        json!([
            "tqdm==4.66.5",
            "scikit-learn>=1.5,<2",
            "pandas[parquet]; python_version >= '3.9'"
        ]),
    ] {
        let s = parse(&with(ddp_script(), "script.requirements", ok.clone())).unwrap();
        let back = serde_json::to_value(&s).unwrap();
        assert_eq!(back["script"]["requirements"], ok, "{back}");
    }
    let bad = [
        (json!("ftp://x/requirements.txt"), "script.requirements"),
        (json!([]), "script.requirements"),
        (json!(["tqdm", "-r /etc/passwd"]), "script.requirements[1]"),
        (
            json!(["--index-url http://evil/simple"]),
            "script.requirements[0]",
        ),
        (json!(["-e ."]), "script.requirements[0]"),
        (
            json!(["evil @ file:///etc/passwd"]),
            "script.requirements[0]",
        ),
        (
            json!(["evil @ https://evil.example/evil.whl"]),
            "script.requirements[0]",
        ),
        (
            json!(["git+https://github.com/x/y"]),
            "script.requirements[0]",
        ),
        (json!(["./local-package"]), "script.requirements[0]"),
        (json!(["/abs/pkg.whl"]), "script.requirements[0]"),
        (json!([""]), "script.requirements[0]"),
        (json!(["tqdm\nnumpy"]), "script.requirements[0]"),
    ];
    for (value, field) in bad {
        let e = parse(&with(ddp_script(), "script.requirements", value.clone())).unwrap_err();
        assert_eq!(fields(&e), [field], "{value}: {e}");
    }
    let many: Vec<String> = (0..=script::MAX_REQUIREMENTS)
        .map(|i| format!("p{i}"))
        .collect();
    let e = parse(&with(ddp_script(), "script.requirements", json!(many))).unwrap_err();
    assert_eq!(fields(&e), ["script.requirements"]);
    // A file's lines: comments, blanks and continuations dropped.
    assert_eq!(
        script::requirement_lines("# mine\ntqdm==4.66.5  # progress\n\nscikit-learn \\\n  >=1.5\n"),
        ["tqdm==4.66.5", "scikit-learn    >=1.5"]
    );
}
