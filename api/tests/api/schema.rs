//! The database's types against the Rust types that read and bind them:
//! the state and event-kind enums are one set on both sides, and the
//! columns generated from the spec follow the spec.

use crate::helpers::{digits_spec, spawn_app};
use serde_json::json;
use trainyard_common::api::{ProvisionedState, ProvisionerEventKind};
use trainyard_common::cluster::ExecutorState;
use trainyard_common::{EventKind, JobState};

/// The labels of Postgres enum `name`, in their declared order.
async fn enum_labels(db: &sqlx::PgPool, name: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT enumlabel::text FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid
         WHERE t.typname = $1 ORDER BY e.enumsortorder",
    )
    .bind(name)
    .fetch_all(db)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_state_enums_are_the_rust_states_in_order_and_round_trip() {
    let app = spawn_app().await;
    let labels = enum_labels(&app.db, "job_state").await;
    let ours: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(labels, ours);
    for s in JobState::ALL {
        let back: JobState = sqlx::query_scalar("SELECT $1::job_state")
            .bind(s)
            .fetch_one(&app.db)
            .await
            .unwrap();
        assert_eq!(back, s);
    }
    let labels = enum_labels(&app.db, "executor_state").await;
    let all = [
        ExecutorState::Live,
        ExecutorState::Draining,
        ExecutorState::Lost,
        ExecutorState::Left,
    ];
    assert_eq!(labels, all.map(|s| s.as_str()));
    for s in all {
        let back: ExecutorState = sqlx::query_scalar("SELECT $1::executor_state")
            .bind(s)
            .fetch_one(&app.db)
            .await
            .unwrap();
        assert_eq!(back, s);
    }
}

#[tokio::test]
async fn the_event_kinds_are_the_rust_kinds_and_no_other_can_be_stored() {
    let app = spawn_app().await;
    let labels = enum_labels(&app.db, "event_kind").await;
    assert_eq!(labels, EventKind::ALL.map(|k| k.as_str()));
    let job = app.submit(&digits_spec("event-kinds")).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for k in EventKind::ALL {
        sqlx::query("INSERT INTO job_events (job_id, kind, reason) VALUES ($1::uuid, $2, 'test')")
            .bind(&job)
            .bind(k)
            .execute(&app.db)
            .await
            .unwrap();
    }
    let refused = sqlx::query(
        "INSERT INTO job_events (job_id, kind, reason) VALUES ($1::uuid, 'exploded', 'test')",
    )
    .bind(&job)
    .execute(&app.db)
    .await;
    assert!(refused.is_err(), "an unknown kind is refused");
    // Every kind reads back through the API as its name.
    let page = app
        .get_json(&format!("/v1/jobs/{job}/events?limit=100"))
        .await;
    let kinds: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds[0], "submitted");
    assert_eq!(
        &kinds[kinds.len() - EventKind::ALL.len()..],
        EventKind::ALL.map(|k| k.as_str())
    );
}

#[tokio::test]
async fn the_provisioners_states_and_kinds_are_the_rust_ones_and_no_other_is_stored() {
    let app = spawn_app().await;
    for (i, s) in ProvisionedState::ALL.iter().enumerate() {
        sqlx::query(
            "INSERT INTO provisioned_executors (name, provisioner, host, state) VALUES ($1, 'local', 'h', $2)",
        )
        .bind(format!("p-{i}"))
        .bind(s.as_str())
        .execute(&app.db)
        .await
        .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    let refused = sqlx::query(
        "INSERT INTO provisioned_executors (name, provisioner, host, state) VALUES ('p-x', 'local', 'h', 'exploded')",
    )
    .execute(&app.db)
    .await;
    assert!(refused.is_err(), "an unknown state is refused");
    for k in ProvisionerEventKind::ALL {
        sqlx::query(
            "INSERT INTO provisioner_events (provisioner, kind, reason) VALUES ('local', $1, 'test')",
        )
        .bind(k.as_str())
        .execute(&app.db)
        .await
        .unwrap_or_else(|e| panic!("{k}: {e}"));
    }
    let refused = sqlx::query(
        "INSERT INTO provisioner_events (provisioner, kind, reason) VALUES ('local', 'exploded', 'test')",
    )
    .execute(&app.db)
    .await;
    assert!(refused.is_err(), "an unknown kind is refused");
    // Each reads back through the API as its name.
    let status = app.get_json("/v1/provisioner?limit=100").await;
    let mut kinds: Vec<String> = status["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    kinds.reverse();
    assert_eq!(
        kinds,
        ProvisionerEventKind::ALL
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
    );
    let mut states: Vec<String> = status["executors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["state"].as_str().unwrap().to_owned())
        .collect();
    states.sort();
    let mut ours: Vec<String> = ProvisionedState::ALL
        .iter()
        .map(|s| s.to_string())
        .collect();
    ours.sort();
    assert_eq!(states, ours);
}

#[tokio::test]
async fn the_columns_queries_filter_on_follow_the_stored_spec() {
    let app = spawn_app().await;
    let mut spec = digits_spec("generated-columns");
    let plain = app.submit(&spec).await["id"].as_str().unwrap().to_owned();
    spec["name"] = json!("leaves-stragglers-out");
    spec["watchdog"] = json!({"exclude_stragglers": true});
    let strict = app.submit(&spec).await["id"].as_str().unwrap().to_owned();
    let row = |id: String| {
        let db = app.db.clone();
        async move {
            sqlx::query_as::<_, (Option<String>, bool)>(
                "SELECT model_kind, exclude_stragglers FROM jobs WHERE id = $1::uuid",
            )
            .bind(id)
            .fetch_one(&db)
            .await
            .unwrap()
        }
    };
    assert_eq!(row(plain).await, (Some("mlp".into()), false));
    assert_eq!(row(strict.clone()).await, (Some("mlp".into()), true));
    // They are the spec's, not copies: a changed spec changes them.
    sqlx::query(
        "UPDATE jobs SET spec = jsonb_set(jsonb_set(spec, '{watchdog,exclude_stragglers}', 'false'),
                                          '{model,kind}', '\"torchscript\"')
         WHERE id = $1::uuid",
    )
    .bind(&strict)
    .execute(&app.db)
    .await
    .unwrap();
    assert_eq!(row(strict).await, (Some("torchscript".into()), false));
}
