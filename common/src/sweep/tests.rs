//! Tests of the sweep's expansion and of ASHA's rule.

use super::*;
use proptest::prelude::*;
use serde_json::json;

fn base() -> Value {
    json!({
        "name": "base",
        "model": {"kind": "mlp", "inputs": 64, "hidden": [32], "outputs": 10},
        "dataset": {"kind": "file", "url": "file:///data/digits.npz"},
        "loss": "cross_entropy",
        "optimizer": {"kind": "momentum", "lr": 0.1},
        "batch_size": 32,
        "steps": 400
    })
}

fn sweep(parameters: Value, search: &str) -> SweepSpec {
    serde_json::from_value(json!({
        "name": "s",
        "base": base(),
        "parameters": parameters,
        "search": search,
        "metric": "eval_accuracy",
        "goal": "maximize",
        "max_trials": 8,
        "concurrency": 2
    }))
    .unwrap()
}

#[test]
fn a_grid_is_every_combination_in_order() {
    let mut s = sweep(
        json!({"optimizer.lr": {"log_uniform": [0.001, 0.1], "points": 3}, "batch_size": {"values": [16, 64]}}),
        "grid",
    );
    s.max_trials = None;
    let trials = expand(&s).unwrap();
    let got: Vec<(Value, Value)> = trials
        .iter()
        .map(|t| {
            (
                t.params["batch_size"].clone(),
                t.params["optimizer.lr"].clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (json!(16), json!(0.001)),
            (json!(16), json!(0.01)),
            (json!(16), json!(0.1)),
            (json!(64), json!(0.001)),
            (json!(64), json!(0.01)),
            (json!(64), json!(0.1)),
        ]
    );
    assert_eq!(trials[4].spec.batch_size, Some(64));
    assert_eq!(trials[4].spec.name, "s/t4");
}

#[test]
fn a_grid_sample_is_seeded_and_a_subset() {
    let s = sweep(
        json!({"optimizer.lr": {"uniform": [0.01, 0.2], "points": 20}}),
        "grid",
    );
    let a = expand(&s).unwrap();
    assert_eq!(a.len(), 8);
    assert_eq!(a, expand(&s).unwrap(), "the same seed, the same trials");
    let mut t = s.clone();
    t.seed = 7;
    assert_ne!(a, expand(&t).unwrap());
}

#[test]
fn random_draws_stay_in_range_and_round_integers() {
    let s = sweep(
        json!({"optimizer.lr": {"log_uniform": [0.001, 0.1]}, "batch_size": {"uniform": [8, 64], "integer": true}}),
        "random",
    );
    for t in expand(&s).unwrap() {
        let lr = t.params["optimizer.lr"].as_f64().unwrap();
        assert!((0.001..=0.1).contains(&lr), "{lr}");
        let b = t.params["batch_size"].as_u64().unwrap();
        assert!((8..=64).contains(&b));
    }
}

#[test]
fn bad_sweeps_name_the_field() {
    let fields = |s: &SweepSpec| -> Vec<String> {
        expand(s)
            .unwrap_err()
            .into_iter()
            .map(|v| v.field)
            .collect()
    };
    let s = sweep(
        json!({"optimizer.lr": {"log_uniform": [0.0, 0.1]}}),
        "random",
    );
    assert_eq!(fields(&s), ["parameters.optimizer.lr.log_uniform"]);
    let s = sweep(json!({"steps": {"values": [1, 2]}}), "grid");
    assert_eq!(fields(&s), ["parameters.steps"]);
    let s = sweep(
        json!({"dataset.url": {"values": ["file:///etc/passwd"]}}),
        "grid",
    );
    assert_eq!(fields(&s), ["parameters.dataset.url"]);
    let s = sweep(json!({"optimizer.lr": {"values": [-1.0]}}), "grid");
    assert_eq!(fields(&s), ["parameters.optimizer.lr"]);
    let s = sweep(
        json!({"optimizer.lr": {"values": [0.1], "uniform": [0, 1]}}),
        "grid",
    );
    assert_eq!(fields(&s), ["parameters.optimizer.lr"]);
    let mut s = sweep(json!({"optimizer.lr": {"values": [0.1]}}), "random");
    s.max_trials = None;
    s.concurrency = 0;
    assert_eq!(fields(&s), ["concurrency", "max_trials"]);
    s.max_trials = Some(2);
    s.concurrency = 1;
    s.early_stopping = Some(EarlyStopping {
        asha: Asha {
            reduction_factor: 4,
            min_steps: 400,
            max_steps: None,
        },
    });
    assert_eq!(fields(&s), ["early_stopping.asha.min_steps"]);
    let s = sweep(json!({"batch_size.x": {"values": [1]}}), "grid");
    assert_eq!(fields(&s), ["parameters.batch_size.x"]);
}

fn script_sweep(parameters: Value) -> SweepSpec {
    let mut s = sweep(parameters, "grid");
    s.max_trials = None;
    s.metric = SweepMetric::Loss;
    s.goal = Goal::Minimize;
    s.base = json!({
        "name": "script",
        "script": {"code": "artifact:train.py", "args": ["--epochs", "3"]},
        "inputs": ["artifact:digits.npz"],
        "workers": {"min": 1, "max": 1}
    });
    s
}

#[test]
fn a_script_sweep_passes_each_value_as_an_argument() {
    let mut s = script_sweep(json!({
        "script.args.lr": {"values": [0.01, 0.1]},
        "script.args.optimizer": {"values": ["sgd", "adam"]},
        "script.args.nesterov": {"values": [true]},
        "workers.max": {"values": [1]}
    }));
    s.early_stopping = Some(EarlyStopping {
        asha: Asha {
            reduction_factor: 2,
            min_steps: 1,
            max_steps: Some(3),
        },
    });
    let trials = expand(&s).unwrap();
    assert_eq!(trials.len(), 4);
    let args: Vec<Vec<String>> = trials
        .iter()
        .map(|t| t.spec.script.as_ref().unwrap().args.clone())
        .collect();
    // The base's arguments first, then one per parameter in name order
    // (the grid's last parameter varies fastest).
    assert_eq!(
        args[0],
        [
            "--epochs",
            "3",
            "--lr=0.01",
            "--nesterov=true",
            "--optimizer=sgd"
        ]
    );
    assert_eq!(
        args[3],
        [
            "--epochs",
            "3",
            "--lr=0.1",
            "--nesterov=true",
            "--optimizer=adam"
        ]
    );
    assert_eq!(trials[3].params["script.args.lr"], json!(0.1));
    assert_eq!(s.trial_steps(), Some(3));
    assert_eq!(rungs(&s.early_stopping.unwrap().asha, 3), vec![1, 2]);
}

#[test]
fn script_arguments_are_checked_and_need_a_script() {
    let field_of = |s: &SweepSpec| -> Vec<String> {
        expand(s)
            .unwrap_err()
            .into_iter()
            .map(|v| v.field)
            .collect()
    };
    // Names that could read as something else, and values that are not
    // one word.
    for bad in ["-lr", "lr=1", "lr x", "a.b", "", "l\u{0}r", &"x".repeat(65)] {
        let s = script_sweep(json!({ format!("script.args.{bad}"): {"values": [1]} }));
        assert!(expand(&s).is_err(), "{bad:?}");
    }
    let s = script_sweep(json!({"script.args.lr": {"values": [[1], {"a": 1}]}}));
    assert_eq!(field_of(&s), ["parameters.script.args.lr"]);
    let s = script_sweep(json!({"script.args.lr": {"values": [null]}}));
    assert_eq!(field_of(&s), ["parameters.script.args.lr"]);
    // A value the job spec refuses as an argument (a NUL byte, or too
    // long) names the parameter that made it, not the base.
    for bad in [json!("a\u{0}b"), json!("x".repeat(4094))] {
        let s = script_sweep(json!({
            "script.args.a": {"values": [1]},
            "script.args.z": {"values": [bad]}
        }));
        assert_eq!(field_of(&s), ["parameters.script.args.z"]);
    }
    let mut s = script_sweep(json!({"script.args.lr": {"values": [1]}}));
    s.base["script"]["args"] = json!(["ok", "a\u{0}b"]);
    assert_eq!(field_of(&s), ["base.script.args[1]"]);
    // The rest of the script stays the base's.
    let s = script_sweep(json!({"script.code": {"values": ["artifact:evil.py"]}}));
    let err = expand(&s).unwrap_err();
    assert_eq!(err[0].field, "parameters.script.code");
    assert!(err[0].message.contains("script.args.NAME"), "{err:?}");
    // A model job has no script to pass arguments to.
    let s = sweep(json!({"script.args.lr": {"values": [0.1]}}), "grid");
    assert_eq!(field_of(&s), ["parameters.script.args.lr"]);
    // ASHA needs the trials' length: a script's from max_steps.
    let mut s = script_sweep(json!({"script.args.lr": {"uniform": [0.01, 0.1], "points": 2}}));
    s.early_stopping = Some(EarlyStopping {
        asha: Asha {
            reduction_factor: 2,
            min_steps: 1,
            max_steps: None,
        },
    });
    assert_eq!(field_of(&s), ["base.steps"]);
    s.early_stopping.as_mut().unwrap().asha.max_steps = Some(1);
    assert_eq!(field_of(&s), ["early_stopping.asha.min_steps"]);
    // A model job's length is its steps: max_steps may only repeat it.
    let mut s = sweep(json!({"optimizer.lr": {"values": [0.1]}}), "grid");
    s.early_stopping = Some(EarlyStopping {
        asha: Asha {
            reduction_factor: 2,
            min_steps: 10,
            max_steps: Some(300),
        },
    });
    assert_eq!(field_of(&s), ["early_stopping.asha.max_steps"]);
    s.early_stopping.as_mut().unwrap().asha.max_steps = Some(400);
    assert!(expand(&s).is_ok());
}

#[test]
fn a_huge_grid_is_sampled_without_building_it_and_huge_specs_are_refused() {
    // 10^5 points of long values: four are built.
    let long = |tag: &str| -> Vec<Value> {
        (0..10)
            .map(|i| json!(format!("{tag}{i}{}", "x".repeat(4000))))
            .collect()
    };
    let mut parameters = serde_json::Map::new();
    for k in ["a", "b", "c", "d", "e"] {
        parameters.insert(format!("tags.{k}"), json!({"values": long(k)}));
    }
    let mut s = sweep(Value::Object(parameters.clone()), "grid");
    s.max_trials = Some(4);
    let err = expand(&s).unwrap_err();
    // The base spec has no `tags` field, so the trial specs are refused,
    // but only after four points were built and checked.
    assert!(err[0].message.contains("trial 0"), "{err:?}");
    // A thousand trials of 20 KB each: 20 MB, within the bound; of a
    // 40 KB base, beyond it.
    let mut big = sweep(json!({"optimizer.lr": {"uniform": [0.01, 0.1]}}), "random");
    big.max_trials = Some(1000);
    big.base["name"] = json!("n".repeat(40_000));
    let err = expand(&big).unwrap_err();
    assert_eq!(err[0].field, "max_trials", "{err:?}");
}

#[test]
fn a_range_from_zero_has_zero_on_its_grid() {
    let s = sweep(
        json!({"optimizer.weight_decay": {"uniform": [0.0, 0.001], "points": 3}}),
        "grid",
    );
    let got: Vec<Value> = expand(&s)
        .unwrap()
        .iter()
        .map(|t| t.params["optimizer.weight_decay"].clone())
        .collect();
    assert_eq!(got, vec![json!(0.0), json!(0.0005), json!(0.001)]);
}

#[test]
fn rungs_grow_by_eta_below_the_total() {
    let a = Asha {
        reduction_factor: 4,
        min_steps: 25,
        max_steps: None,
    };
    assert_eq!(rungs(&a, 400), vec![25, 100]);
    assert_eq!(rungs(&a, 401), vec![25, 100, 400]);
}

#[test]
fn asha_keeps_the_top_of_each_rung() {
    let t = |running: bool, values: &[f64]| RungView {
        running,
        values: values.to_vec(),
    };
    // Eight trials at rung 0: two go on (⌈8/4⌉); the running ones below
    // them stop, the ended ones and the one past the rung are not judged
    // there.
    let trials = vec![
        t(true, &[0.9]),
        t(true, &[0.5]),
        t(false, &[0.95]),
        t(true, &[0.6]),
        t(false, &[0.4]),
        t(true, &[0.3, 0.91]),
        t(true, &[0.2]),
        t(true, &[0.1]),
        t(true, &[]),
    ];
    let stops: Vec<usize> = asha_stops(Goal::Maximize, 4, &trials)
        .iter()
        .map(|s| s.trial)
        .collect();
    assert_eq!(stops, vec![1, 3, 6, 7]);
    // The first trial at a rung always goes on.
    assert!(asha_stops(Goal::Minimize, 4, &[t(true, &[5.0])]).is_empty());
    // Of two equal values, the earlier trial's goes on.
    let tied = asha_stops(Goal::Maximize, 4, &[t(true, &[0.9]), t(true, &[0.9])]);
    assert_eq!(tied.iter().map(|s| s.trial).collect::<Vec<_>>(), vec![1]);
}

proptest! {
    #[test]
    fn asha_never_stops_a_rungs_best_and_keeps_at_most_its_share(
        values in prop::collection::vec((any::<bool>(), prop::collection::vec(0.0f64..1.0, 0..4)), 1..40),
        eta in 2u32..8,
        max in any::<bool>(),
    ) {
        let goal = if max { Goal::Maximize } else { Goal::Minimize };
        let trials: Vec<RungView> = values.iter().map(|(r, v)| RungView { running: *r, values: v.clone() }).collect();
        let stops = asha_stops(goal, eta, &trials);
        for s in &stops {
            let t = &trials[s.trial];
            prop_assert!(t.running);
            prop_assert_eq!(s.rung, t.values.len() - 1);
            prop_assert!(s.rank >= s.keep);
            // Never the first trial holding the best value of its rung.
            let first_best = trials.iter().enumerate()
                .filter_map(|(j, o)| o.values.get(s.rung).map(|&x| (j, x)))
                .fold(None::<(usize, f64)>, |b, (j, x)| match b {
                    Some((_, bx)) if !goal.better(x, bx) => b,
                    _ => Some((j, x)),
                });
            prop_assert_ne!(first_best.map(|(j, _)| j), Some(s.trial));
        }
        // After the stops, at most `keep` running trials whose top rung is
        // k rank below the keep line.
        let mirrored: Vec<RungView> = trials.iter().map(|t| RungView { running: t.running, values: t.values.iter().map(|v| -v).collect() }).collect();
        let other = if max { Goal::Minimize } else { Goal::Maximize };
        let m: Vec<usize> = asha_stops(other, eta, &mirrored).iter().map(|s| s.trial).collect();
        let s: Vec<usize> = stops.iter().map(|s| s.trial).collect();
        prop_assert_eq!(m, s, "the rule is symmetric in the goal");
    }

    #[test]
    fn every_draw_is_a_valid_trial(seed in any::<u64>(), lo in 1e-4f64..1e-2, span in 1.5f64..100.0) {
        let mut s = sweep(json!({"optimizer.lr": {"log_uniform": [lo, lo * span]}, "optimizer.momentum": {"uniform": [0.0, 0.99]}}), "random");
        s.seed = seed;
        let trials = expand(&s).unwrap();
        prop_assert_eq!(trials.len(), 8);
        for t in trials {
            let lr = t.params["optimizer.lr"].as_f64().unwrap();
            prop_assert!(lr >= lo * 0.99999 && lr <= lo * span * 1.00001);
        }
    }
}
