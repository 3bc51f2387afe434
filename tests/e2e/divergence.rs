//! A diverged loss ends its job in every pattern. SGD at learning rate 10
//! on a digits MLP of three hidden layers of 256 overflows within ten
//! steps (the loss grows by orders of magnitude a step until it is not
//! finite): the job fails with a `diverged` event and a reason that names
//! the step and the remedies, in a ring of 1 and of 2 and in PS `sync`,
//! `async` and `bounded` jobs, all submitted at once to one platform. Adam
//! at learning rate 10 on a small MLP keeps its loss finite but thousands
//! of times its first step's for some thirty steps before its ReLUs die:
//! with a window of 20 steps that fails its job too, and a job whose
//! policy says `warn` gets its one event and trains to its end.

use serde_json::{json, Value};
use std::time::Duration;
use trainyard_common::event::Diverged;
use trainyard_common::spec::DivergenceAction;
use trainyard_common::{EventData, EventKind, JobState};
use trainyard_e2e::{eventually, Consistency, MlpSpec, Platform, Proc};

/// SGD at learning rate 10 on three hidden layers of 256: not finite
/// within ten steps (a ring of 1: step 6).
fn overflowing(name: &str) -> MlpSpec {
    MlpSpec::digits(name)
        .hidden(&[256, 256, 256])
        .sgd(10.0)
        .batch_size(32)
        .steps(300)
        .seed(5)
}

/// Adam at learning rate 10 on one hidden layer of 64, `steps` steps:
/// losses of 10⁴ from step 2, above 3 × the first step's for about 30
/// steps in a row, then about 2.5 (its ReLUs died), all finite.
fn exploding(name: &str, steps: u64, divergence: Value) -> Value {
    let mut spec = MlpSpec::digits(name)
        .hidden(&[64])
        .adam(10.0)
        .batch_size(32)
        .steps(steps)
        .seed(5)
        .build();
    spec["divergence"] = divergence;
    spec
}

/// The job's `diverged` events, decoded, with their reasons.
fn diverged(p: &Platform, id: &str) -> Vec<(Diverged, String)> {
    p.events(id)
        .into_iter()
        .filter(|e| e.kind == EventKind::Diverged)
        .map(|e| match e.typed() {
            Ok(EventData::Diverged(d)) => (d, e.reason.clone()),
            other => panic!("{other:?}: {e:?}"),
        })
        .collect()
}

#[test]
fn a_diverging_recipe_fails_in_every_pattern_and_warn_trains_on() {
    let p = Platform::builder("diverge").start();
    // 1 + 2 + 3 × 2 workers (PS shards share their executors), the job
    // that stays above its bound and the warned one.
    let _execs: Vec<Proc> = (0..11).map(|i| p.executor(&format!("div-{i}"))).collect();
    let mut failing: Vec<(&str, Value)> = vec![
        ("ring-1", overflowing("ring-1").build()),
        ("ring-2", overflowing("ring-2").workers(2, 2).build()),
    ];
    for (name, c) in [
        ("ps-sync", Consistency::Sync),
        ("ps-async", Consistency::Async),
        ("ps-bounded", Consistency::Bounded(2)),
    ] {
        let spec = overflowing(name).workers(2, 2).ps(1).consistency(c).build();
        failing.push((name, spec));
    }
    failing.push((
        "stays-above",
        exploding("stays-above", 200, json!({"window_steps": 20})),
    ));
    let warned = exploding(
        "warned",
        100,
        json!({"action": "warn", "factor": 3, "window_steps": 10}),
    );

    let ids: Vec<(&str, String)> = failing
        .iter()
        .map(|(name, spec)| (*name, p.submit(spec)))
        .collect();
    let warned_id = p.submit(&warned);

    let mut not_finite = Vec::new();
    for (name, id) in &ids {
        let job = p.wait_end(id, Duration::from_secs(240));
        assert_eq!(
            job.state,
            JobState::Failed,
            "{name}: {job:?} {:?}",
            p.log_messages(id)
        );
        let reason = &job.state_reason;
        assert!(
            reason.contains("the loss diverged") && reason.contains("optimizer.lr"),
            "{name}: {reason}"
        );
        let events = diverged(&p, id);
        assert_eq!(events.len(), 1, "{name}: {events:?}");
        let (d, why) = &events[0];
        assert_eq!(why, reason, "{name}");
        assert_eq!(d.action, DivergenceAction::Fail, "{name}: {d:?}");
        assert!(
            reason.contains(&format!("step {}", d.step)),
            "{name}: {reason}"
        );
        println!("{name}: {reason}");
        if d.not_finite {
            not_finite.push(*name);
        }
        // Nothing of the job runs on.
        assert!(
            eventually(Duration::from_secs(30), || {
                p.assignments(id).workers.is_empty().then_some(())
            })
            .is_some(),
            "{name}: its roles were not released"
        );
    }
    // Both rules: the training loops' own check of a loss that is not
    // finite, in a ring and in the PS pattern, and the API's window.
    assert!(
        not_finite.contains(&"ring-1") && not_finite.iter().any(|n| n.starts_with("ps-")),
        "{not_finite:?}"
    );
    assert!(!not_finite.contains(&"stays-above"), "{not_finite:?}");

    let job = p.wait_end(&warned_id, Duration::from_secs(240));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{job:?} {:?}",
        p.log_messages(&warned_id)
    );
    let events = diverged(&p, &warned_id);
    assert_eq!(events.len(), 1, "{events:?}");
    let (d, why) = &events[0];
    assert!(!d.not_finite && d.action == DivergenceAction::Warn, "{d:?}");
    assert!(why.contains("training goes on"), "{why}");
    println!("warned: {why}");
    assert!(
        p.logs(&warned_id)
            .iter()
            .any(|l| l.level == "warn" && l.message.contains("diverged")),
        "no warning in the log"
    );
}
