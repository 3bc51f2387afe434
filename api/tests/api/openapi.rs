//! The OpenAPI document: served, complete, and equal to the committed file.

use crate::helpers::spawn_app;
use serde_json::Value;
use std::path::PathBuf;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../openapi/openapi.json")
}

/// Fails when `openapi/openapi.json` differs from what the code generates.
/// `UPDATE_OPENAPI=1 cargo test -p trainyard-api openapi` rewrites it.
#[test]
fn committed_openapi_matches_the_code() {
    let generated = trainyard_api::openapi::document();
    let path = committed_path();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/openapi.json is stale: run `UPDATE_OPENAPI=1 cargo test -p trainyard-api openapi` (or `trainyard openapi > openapi/openapi.json`) and commit it"
    );
}

#[tokio::test]
async fn served_document_is_openapi_3_1_with_every_route() {
    let app = spawn_app().await;
    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/v1/jobs", "post"),
        ("/v1/jobs", "get"),
        ("/v1/jobs/{id}", "get"),
        ("/v1/jobs/{id}/cancel", "post"),
        ("/v1/jobs/{id}/events", "get"),
        ("/v1/executors", "post"),
        ("/v1/executors", "get"),
        ("/v1/executors/{id}", "get"),
        ("/v1/executors/{id}", "delete"),
        ("/v1/executors/{id}/heartbeat", "post"),
        ("/v1/executors/{id}/drain", "post"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
    ] {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} missing"
        );
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for s in [
        "JobSpec",
        "Job",
        "JobPage",
        "JobEvent",
        "Problem",
        "ModelSpec",
        "OptimizerSpec",
    ] {
        assert!(schemas.contains_key(s), "schema {s} missing");
    }
    let served = serde_json::to_string_pretty(&doc).unwrap();
    let generated: Value = serde_json::from_str(&trainyard_api::openapi::document()).unwrap();
    assert_eq!(
        doc, generated,
        "served document differs from the generated one:\n{served}"
    );
}

/// A `kind`-tagged union is published as one satisfiable object per
/// variant: the struct's own fields plus `kind`, unknown fields refused
/// (utoipa's `allOf` of the struct and the tag could be met by no object).
#[test]
fn tagged_unions_are_satisfiable_objects() {
    let doc: Value = serde_json::from_str(&trainyard_api::openapi::document()).unwrap();
    let schemas = &doc["components"]["schemas"];
    for (union, kinds) in [
        (
            "ModelSpec",
            vec!["mlp", "cnn", "transformer", "torchscript"],
        ),
        ("DatasetSpec", vec![]),
    ] {
        let variants = schemas[union]["oneOf"].as_array().unwrap();
        for v in variants {
            assert!(v.get("allOf").is_none(), "{union}: {v}");
            assert_eq!(
                v["additionalProperties"],
                Value::Bool(false),
                "{union}: {v}"
            );
            assert_eq!(v["required"][0], "kind", "{union}: {v}");
            assert!(v["properties"]["kind"]["enum"].is_array(), "{union}: {v}");
        }
        let names: Vec<&str> = variants
            .iter()
            .filter_map(|v| v["properties"]["kind"]["enum"][0].as_str())
            .collect();
        for k in kinds {
            assert!(names.contains(&k), "{union} lacks {k}: {names:?}");
        }
    }
    // The MLP variant keeps its own fields and required ones.
    let mlp = schemas["ModelSpec"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["properties"]["kind"]["enum"][0] == "mlp")
        .unwrap();
    assert!(mlp["properties"]["hidden"].is_object());
    let required: Vec<&str> = mlp["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(required, ["kind", "inputs", "outputs"]);
}
