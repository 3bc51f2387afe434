//! A job whose rank-0 loss diverges: reports whose losses stay above the
//! spec's `divergence.factor` × the early value for `window_steps` steps
//! fail the job with a `diverged` event (or, with `action: warn`, give one
//! event and a warning line, and the job goes on); a role that saw a loss
//! that is not finite fails the job whatever the action; a normal curve
//! gives nothing; a policy out of range is refused naming its field.

use crate::executors::{holder_of_rank, place_ring_job, register};
use crate::helpers::{assert_problem, digits_spec, spawn_app, TestApp};
use serde_json::{json, Value};
use trainyard_common::event::{Diverged, EventData, EventKind};
use trainyard_common::spec::DivergenceAction;

async fn job(app: &TestApp, id: &str) -> Value {
    app.get_json(&format!("/v1/jobs/{id}")).await
}

/// The job's `diverged` events, decoded, with their reasons.
async fn diverged(app: &TestApp, id: &str) -> Vec<(Diverged, String)> {
    let page: Value = app
        .get_json(&format!("/v1/jobs/{id}/events?limit=1000"))
        .await;
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "diverged")
        .map(|e| {
            let EventData::Diverged(d) =
                EventData::from_json(EventKind::Diverged, &e["data"]).unwrap()
            else {
                panic!("{e}")
            };
            (d, e["reason"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// A ring job of one rank with `divergence` as its policy, placed on a
/// registered executor: its id, and the executor's id and token.
async fn placed(app: &TestApp, name: &str, divergence: Value) -> (String, (String, String)) {
    let holder = register(app, &format!("{name}-holder")).await;
    let mut spec = digits_spec(name);
    spec["divergence"] = divergence;
    let id = place_ring_job(app, spec, 1).await;
    assert_eq!(holder_of_rank(app, &id, 0).await, holder.0);
    let key = json!({"job_id": id, "generation": 1, "role": "worker", "index": 0});
    let r = app
        .post_as(
            &format!("/v1/executors/{}/heartbeat", holder.0),
            &holder.1,
            &json!({"roles": [key]}),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    (id, holder)
}

fn point(step: u64, loss: f64) -> Value {
    json!({"step": step, "loss": loss, "lr": 0.1, "samples_per_sec": 100.0,
           "data_seconds": 0.0, "compute_seconds": 0.01, "comm_seconds": 0.0})
}

/// Rank 0 reports `losses` as steps `from`, `from + 1`, …: the ack.
async fn report(
    app: &TestApp,
    id: &str,
    holder: &(String, String),
    from: u64,
    losses: &[f64],
    outcome: Option<Value>,
) -> Value {
    let key = json!({"job_id": id, "generation": 1, "role": "worker", "index": 0});
    let metrics: Vec<Value> = losses
        .iter()
        .enumerate()
        .map(|(i, &l)| point(from + i as u64, l))
        .collect();
    let mut body = json!({"key": key, "metrics": metrics});
    if let Some(o) = outcome {
        body["outcome"] = o;
    }
    let r = app
        .post_as(
            &format!("/v1/executors/{}/reports", holder.0),
            &holder.1,
            &body,
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    r.json().await.unwrap()
}

async fn wait_state(app: &TestApp, id: &str, state: &str) {
    for _ in 0..200 {
        if job(app, id).await["state"] == state {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("job {id} never became {state}: {}", job(app, id).await);
}

#[tokio::test]
async fn a_loss_that_came_down_and_climbed_back_to_chance_fails_as_collapsed() {
    let app = spawn_app().await;
    let (id, holder) = placed(&app, "collapses", json!({"factor": 3, "window_steps": 4})).await;
    wait_state(&app, &id, "running").await;
    // Early value 2.3; down to 0.05; back to chance, never 3 × 2.3.
    report(&app, &id, &holder, 1, &[2.3, 2.3, 2.3, 2.3, 2.3], None).await;
    report(
        &app,
        &id,
        &holder,
        6,
        &[1.0, 0.5, 0.1, 0.05, 0.05, 0.05],
        None,
    )
    .await;
    report(&app, &id, &holder, 12, &[0.05, 2.2, 2.3], None).await;
    assert_eq!(job(&app, &id).await["state"], "running");
    report(&app, &id, &holder, 15, &[2.3, 2.31], None).await;
    let j = job(&app, &id).await;
    assert_eq!(j["state"], "failed", "{j}");
    let reason = j["state_reason"].as_str().unwrap();
    assert!(reason.contains("the loss collapsed"), "{reason}");
    assert!(reason.contains("steps 13–16"), "{reason}");
    let events = diverged(&app, &id).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0.best, Some(0.05));
    assert_eq!(events[0].0.first_step, Some(13));
}

#[tokio::test]
async fn a_loss_that_stays_above_the_bound_for_the_window_fails_the_job() {
    let app = spawn_app().await;
    let (id, holder) = placed(&app, "blows-up", json!({"factor": 3, "window_steps": 6})).await;
    wait_state(&app, &id, "running").await;
    // Early value 1.0 (the smallest of the first five); the bound is 3.0.
    report(&app, &id, &holder, 1, &[2.3, 1.6, 1.0, 1.2, 1.1], None).await;
    // Five steps above the bound, then one at it: no window yet.
    report(&app, &id, &holder, 6, &[4.0, 5.0, 9.0, 7.0, 3.5, 3.0], None).await;
    assert_eq!(job(&app, &id).await["state"], "running");
    assert!(diverged(&app, &id).await.is_empty());
    // Six in a row, over two reports: the window is found across them.
    report(&app, &id, &holder, 12, &[8.0, 9.0, 12.5], None).await;
    assert_eq!(job(&app, &id).await["state"], "running");
    report(&app, &id, &holder, 15, &[20.0, 31.0, 44.0], None).await;

    let j = job(&app, &id).await;
    assert_eq!(j["state"], "failed", "{j}");
    let reason = j["state_reason"].as_str().unwrap();
    for w in [
        "the loss diverged",
        "3 × its early value 1.0000",
        "6 steps in a row",
        "steps 12–17",
        "loss 44.0000 at step 17",
        "optimizer.lr",
        "optimizer.grad_clip",
        "divergence.action",
    ] {
        assert!(reason.contains(w), "{w}: {reason}");
    }
    let events = diverged(&app, &id).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let (d, why) = &events[0];
    assert_eq!(
        d,
        &Diverged {
            step: 17,
            loss: Some(44.0),
            not_finite: false,
            first_step: Some(12),
            early: Some(1.0),
            best: None,
            factor: 3.0,
            window_steps: 6,
            action: DivergenceAction::Fail,
        }
    );
    assert_eq!(why, reason);
    // The result event precedes the move to failed, as for any failure.
    let page: Value = app
        .get_json(&format!("/v1/jobs/{id}/events?limit=1000"))
        .await;
    let kinds: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["diverged", "result", "transition"],
        "{kinds:?}"
    );
    // The job's log says it too, at error level, under rank 0.
    let logs: Value = app.get_json(&format!("/v1/jobs/{id}/logs")).await;
    assert!(
        logs["lines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["level"] == "error" && l["message"].as_str().unwrap().contains("diverged")),
        "{logs}"
    );
    // The scheduler releases its roles, as for any ended job.
    let mut released = false;
    for _ in 0..200 {
        let a: Value = app.get_json(&format!("/v1/jobs/{id}/assignments")).await;
        if a["workers"].as_array().is_none_or(|w| w.is_empty()) {
            released = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(released, "the failed job's roles were not released");
    // Its end is final: the executor's success report changes nothing.
    let ack = report(
        &app,
        &id,
        &holder,
        18,
        &[50.0],
        Some(
            json!({"succeeded": {"steps": 18, "final_loss": 50.0, "eval_loss": null,
            "eval_accuracy": null, "weights_url": "file:///w"}}),
        ),
    )
    .await;
    assert_eq!(ack["outcome_applied"], false, "{ack}");
    assert_eq!(job(&app, &id).await["state"], "failed");
    assert_eq!(diverged(&app, &id).await.len(), 1);
}

#[tokio::test]
async fn with_warn_a_diverged_loss_gives_one_event_and_the_job_goes_on() {
    let app = spawn_app().await;
    let (id, holder) = placed(
        &app,
        "warned",
        json!({"action": "warn", "factor": 2, "window_steps": 3}),
    )
    .await;
    wait_state(&app, &id, "running").await;
    report(&app, &id, &holder, 1, &[1.0, 0.9, 0.8, 0.7, 0.6], None).await;
    // The bound is 1.2: one step above it at a time is no window.
    report(&app, &id, &holder, 6, &[1.0, 1.3, 1.1, 1.1], None).await;
    assert!(diverged(&app, &id).await.is_empty());
    report(
        &app,
        &id,
        &holder,
        10,
        &[2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
        None,
    )
    .await;
    assert_eq!(job(&app, &id).await["state"], "running");
    // More windows above the bound: still one event.
    report(&app, &id, &holder, 16, &[8.0; 10], None).await;
    let events = diverged(&app, &id).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let (d, why) = &events[0];
    assert_eq!(
        (d.step, d.first_step, d.action, d.not_finite),
        (12, Some(10), DivergenceAction::Warn, false)
    );
    assert!(why.contains("training goes on"), "{why}");
    let logs: Value = app.get_json(&format!("/v1/jobs/{id}/logs")).await;
    assert!(
        logs["lines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["level"] == "warn" && l["message"].as_str().unwrap().contains("diverged")),
        "{logs}"
    );
    // The job ends as it trained.
    let ack = report(
        &app,
        &id,
        &holder,
        26,
        &[8.0],
        Some(
            json!({"succeeded": {"steps": 26, "final_loss": 8.0, "eval_loss": null,
            "eval_accuracy": 0.1, "weights_url": "file:///w"}}),
        ),
    )
    .await;
    assert_eq!(ack["outcome_applied"], true, "{ack}");
    assert_eq!(job(&app, &id).await["state"], "succeeded");
    assert_eq!(diverged(&app, &id).await.len(), 1);
}

#[tokio::test]
async fn a_loss_that_is_not_finite_fails_the_job_whatever_the_action() {
    let app = spawn_app().await;
    // Reported by the training loop, which stops before storing the step.
    let (a, holder_a) = placed(&app, "nan-outcome", json!({"action": "warn"})).await;
    wait_state(&app, &a, "running").await;
    report(&app, &a, &holder_a, 1, &[2.0, 1.5, 1.25, 1.0, 0.9], None).await;
    let ack = report(
        &app,
        &a,
        &holder_a,
        6,
        &[],
        Some(json!({"diverged": {"step": 6, "reason": "the loss diverged: it is not finite at step 6"}})),
    )
    .await;
    assert_eq!(ack["outcome_applied"], true, "{ack}");
    let j = job(&app, &a).await;
    assert_eq!(j["state"], "failed", "{j}");
    let reason = j["state_reason"].as_str().unwrap();
    assert!(
        reason.contains("not finite at step 6")
            && reason.contains("early loss 0.9000")
            && reason.contains("optimizer.lr"),
        "{reason}"
    );
    let events = diverged(&app, &a).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0].0,
        Diverged {
            step: 6,
            loss: None,
            not_finite: true,
            first_step: None,
            early: Some(0.9),
            best: None,
            factor: 3.0,
            window_steps: 50,
            action: DivergenceAction::Fail,
        }
    );

    // The curve stores a loss that is not finite as f64::MAX, and reads it
    // back as not finite: found there too, before the early value is known.
    // (On an app of its own: the first job's executor is free again.)
    let app = spawn_app().await;
    let (b, holder_b) = placed(&app, "huge-loss", json!({"action": "warn"})).await;
    wait_state(&app, &b, "running").await;
    report(&app, &b, &holder_b, 1, &[2.0, 1.5, 1.25, f64::MAX], None).await;
    let j = job(&app, &b).await;
    assert_eq!(j["state"], "failed", "{j}");
    assert!(
        j["state_reason"]
            .as_str()
            .unwrap()
            .contains("not finite at step 4"),
        "{j}"
    );
    let events = diverged(&app, &b).await;
    assert_eq!(events.len(), 1);
    assert!(events[0].0.not_finite && events[0].0.early.is_none());
}

#[tokio::test]
async fn a_decreasing_curve_gives_nothing() {
    let app = spawn_app().await;
    let (id, holder) = placed(&app, "healthy", json!({"factor": 1.5, "window_steps": 1})).await;
    wait_state(&app, &id, "running").await;
    // A high first loss that comes down: the early steps are not judged.
    let losses: Vec<f64> = (0..200).map(|i| 9.0 / (1.0 + f64::from(i))).collect();
    for (i, chunk) in losses.chunks(37).enumerate() {
        report(&app, &id, &holder, 1 + 37 * i as u64, chunk, None).await;
    }
    // Noise that stays below 1.5 × the early value.
    report(&app, &id, &holder, 201, &[0.06, 0.08, 0.05, 0.07], None).await;
    assert_eq!(job(&app, &id).await["state"], "running");
    assert!(diverged(&app, &id).await.is_empty());
}

#[tokio::test]
async fn a_divergence_policy_out_of_range_is_refused_naming_the_field() {
    let app = spawn_app().await;
    for (policy, field) in [
        (json!({"factor": 1.2}), "divergence.factor"),
        (json!({"factor": 2e6}), "divergence.factor"),
        (json!({"window_steps": 0}), "divergence.window_steps"),
        (json!({"window_steps": 100001}), "divergence.window_steps"),
    ] {
        let mut spec = digits_spec("bad-policy");
        spec["divergence"] = policy.clone();
        let r = app.post_json("/v1/jobs", &spec).await;
        assert_problem(r, 422, Some(field)).await;
    }
    let mut spec = digits_spec("unknown-action");
    spec["divergence"] = json!({"action": "explode"});
    let r = app.post_json("/v1/jobs", &spec).await;
    let p = assert_problem(r, 422, None).await;
    assert!(p.to_string().contains("divergence"), "{p}");
    // In range, it is stored as given; absent, the defaults are.
    let mut spec = digits_spec("good-policy");
    spec["divergence"] = json!({"action": "warn", "factor": 1.5, "window_steps": 100000});
    let j = app.submit(&spec).await;
    assert_eq!(
        j["spec"]["divergence"],
        json!({"action": "warn", "factor": 1.5, "window_steps": 100000})
    );
    let j = app.submit(&digits_spec("default-policy")).await;
    assert_eq!(
        j["spec"]["divergence"],
        json!({"action": "fail", "factor": 3.0, "window_steps": 50})
    );
}
