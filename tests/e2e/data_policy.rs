//! The data policy end to end, on the executor's side: the API fixes what a
//! user's job may read at submit and sends it with every assignment, and
//! the executor checks each URL against that policy before it opens it.
//! Here the policy the executor receives is narrower than the spec (as a
//! tampered or buggy control plane would send it): the job fails with the
//! refusal naming the URL, its file is never opened, and no step runs.

use serde_json::{json, Value};
use std::process::Command;
use std::time::Duration;
use trainyard_common::JobState;
use trainyard_e2e::{repo_root, MlpSpec, Platform};

const ADMIN: &str = "e2e-policy-admin";

fn psql(db: &str, sql: &str) {
    let ok = Command::new("psql")
        .args([db, "-qc", sql])
        .status()
        .expect("psql");
    assert!(ok.success(), "psql {sql}");
}

#[test]
fn an_executor_refuses_a_dataset_url_outside_the_policy_its_assignment_carries() {
    let allowed = std::env::temp_dir().join(format!("ty-policy-{}", std::process::id()));
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::copy(
        repo_root().join("data/digits.npz"),
        allowed.join("digits.npz"),
    )
    .unwrap();
    let prefix = format!("file://{}/", allowed.display());
    let p = Platform::builder("policy")
        .admin_token(ADMIN)
        .no_provisioner()
        .arg("--allow-data-url")
        .arg(&prefix)
        .start();
    let admin = p.with_token(ADMIN);
    let (status, token) = admin.post("/v1/tokens", &json!({"owner": "alice", "role": "user"}));
    assert_eq!(status, 201, "{token}");
    let alice = p.with_token(token["token"].as_str().unwrap());

    let url = format!("{prefix}digits.npz");
    let mut spec: Value = MlpSpec::digits("policy").workers(1, 1).steps(20).build();
    spec["dataset"] = json!({"kind": "file", "url": url});
    // Accepted at submit: the prefix is allowed.
    let id = alice.submit(&spec);
    // The policy the assignment will carry no longer allows it.
    psql(
        &p.db,
        &format!(
            "UPDATE jobs SET data_policy = jsonb_set(data_policy, '{{allowed_prefixes}}', '[]') WHERE id = '{id}'"
        ),
    );
    let _exec = p.executor("policy-0");
    let job = alice.wait_end(&id, Duration::from_secs(120));
    assert_eq!(job.state, JobState::Failed, "{job:?}");
    let reason = job.state_reason.clone();
    assert!(
        reason.contains(&url) && reason.contains("refused"),
        "the reason names the URL and the refusal: {reason}"
    );
    assert_eq!(alice.steps_recorded(&id), 0, "no step ran");
    println!("the job failed: {reason}");
    let _ = std::fs::remove_dir_all(&allowed);
}
