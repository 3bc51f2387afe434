//! A job's model through the API: `GET /v1/jobs/{id}/model` in either
//! format (the `format` parameter refused by name when unknown or when a
//! built-in model has no TorchScript module, a 404 with its reason before
//! the file exists, the bytes once it does), the tensor list, and the
//! inspection of a TorchScript module: the heartbeat hands the inspector
//! the job's spec, a report's tensor kinds and dtypes are checked,
//! counted (only parameters are trainable; buffers take memory too) and
//! kept, and a refusal's reason is the executor's.

use crate::executors::register;
use crate::helpers::{assert_problem, digits_spec, spawn_app_with, TestApp};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// An app whose object store is a fresh folder; the folder.
async fn app_with_store(name: &str) -> (TestApp, PathBuf) {
    let store = std::env::temp_dir().join(format!("ty-api-{name}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&store).unwrap();
    let url = format!("file://{}", store.display());
    (spawn_app_with(|c| c.object_store = Some(url)).await, store)
}

/// The digits recipe with a TorchScript module instead of the MLP.
fn torchscript_spec(name: &str) -> Value {
    let mut spec = digits_spec(name);
    spec["model"] = json!({"kind": "torchscript", "url": "file:///models/net.pt"});
    spec
}

/// Writes `bytes` as the object `key` of the store in `dir`.
fn put(dir: &std::path::Path, key: &str, bytes: &[u8]) {
    let path = dir.join(key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn the_model_comes_in_the_format_asked_for_and_a_bad_format_is_named() {
    let (app, store) = app_with_store("model").await;
    let builtin = app.submit(&digits_spec("builtin")).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let scripted = app.submit(&torchscript_spec("scripted")).await["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // An unknown format: a 400 naming `format` and what it accepts.
    let body = assert_problem(
        app.get(&format!("/v1/jobs/{builtin}/model?format=onnx"))
            .await,
        400,
        Some("format"),
    )
    .await;
    let message = body["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("safetensors")
            && message.contains("torchscript")
            && message.contains("onnx"),
        "{body}"
    );
    // An unknown parameter is refused too, not ignored.
    assert_problem(
        app.get(&format!("/v1/jobs/{builtin}/model?fromat=torchscript"))
            .await,
        400,
        Some("query"),
    )
    .await;
    // A built-in model has no TorchScript module: said, naming `format`.
    let body = assert_problem(
        app.get(&format!("/v1/jobs/{builtin}/model?format=torchscript"))
            .await,
        400,
        Some("format"),
    )
    .await;
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("built-in (mlp)"),
        "{body}"
    );
    // Not written yet: a 404 that says which file and why.
    for (job, query, what) in [
        (&scripted, "?format=torchscript", "TorchScript module"),
        (&scripted, "", "final weights"),
        (&builtin, "?format=safetensors", "final weights"),
    ] {
        let body = assert_problem(
            app.get(&format!("/v1/jobs/{job}/model{query}")).await,
            404,
            None,
        )
        .await;
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains(what) && detail.contains("queued"), "{body}");
    }

    // Once the executor has written them, each format streams its file.
    put(
        &store,
        &format!("{scripted}/final/model.pt"),
        b"PK\x03\x04 a TorchScript zip",
    );
    put(
        &store,
        &format!("{scripted}/final/model.safetensors"),
        b"{safetensors of scripted}",
    );
    put(
        &store,
        &format!("{builtin}/final/model.safetensors"),
        b"{safetensors of builtin}",
    );
    for (job, query, want, filename) in [
        (
            &scripted,
            "?format=torchscript",
            &b"PK\x03\x04 a TorchScript zip"[..],
            "model.pt".to_owned(),
        ),
        (
            &scripted,
            "",
            &b"{safetensors of scripted}"[..],
            format!("{scripted}.safetensors"),
        ),
        (
            &builtin,
            "",
            &b"{safetensors of builtin}"[..],
            format!("{builtin}.safetensors"),
        ),
        (
            &builtin,
            "?format=safetensors",
            &b"{safetensors of builtin}"[..],
            format!("{builtin}.safetensors"),
        ),
    ] {
        let r = app.get(&format!("/v1/jobs/{job}/model{query}")).await;
        assert_eq!(r.status(), 200, "{job}{query}");
        assert_eq!(r.headers()["content-type"], "application/octet-stream");
        assert_eq!(
            r.headers()["content-disposition"],
            format!("attachment; filename=\"{filename}\"").as_str()
        );
        assert_eq!(&r.bytes().await.unwrap()[..], want, "{job}{query}");
    }
    // The built-in model still has no TorchScript module.
    assert_problem(
        app.get(&format!("/v1/jobs/{builtin}/model?format=torchscript"))
            .await,
        400,
        Some("format"),
    )
    .await;

    // The built-in model's tensors follow from its spec; the TorchScript
    // module's are unknown until it is inspected.
    let t = app.get_json(&format!("/v1/jobs/{builtin}/tensors")).await;
    assert_eq!(t["source"], "spec", "{t}");
    let listed = t["tensors"].as_array().unwrap();
    assert_eq!(listed.len(), 4, "{t}");
    assert_eq!(t["count"], 4);
    assert_eq!(t["parameters"], 64 * 128 + 128 + 128 * 10 + 10);
    assert_eq!(
        (t["buffers"].as_u64(), t["frozen"].as_u64()),
        (Some(0), Some(0))
    );
    let job = app.get_json(&format!("/v1/jobs/{builtin}")).await;
    assert_eq!(t["parameters"], job["estimate"]["parameters"]);
    let t = app.get_json(&format!("/v1/jobs/{scripted}/tensors")).await;
    assert_eq!(t["source"], "pending", "{t}");
    assert_eq!(t["tensors"], json!([]));
    let _ = std::fs::remove_dir_all(&store);
}

/// Heartbeats as executor `id` until it is asked to inspect `job`; the
/// inspection it is given.
/// One heartbeat of executor `id` running nothing: the API's answer.
async fn heartbeat(app: &TestApp, id: &str, token: &str) -> Value {
    app.post_as(
        &format!("/v1/executors/{id}/heartbeat"),
        token,
        &json!({"roles": []}),
    )
    .await
    .json()
    .await
    .unwrap()
}

async fn inspection_for(app: &TestApp, id: &str, token: &str, job: &str) -> Value {
    for _ in 0..100 {
        let hb = heartbeat(app, id, token).await;
        if let Some(i) = hb["inspections"]
            .as_array()
            .unwrap_or_else(|| panic!("a heartbeat answer without inspections: {hb}"))
            .iter()
            .find(|i| i["job_id"] == job)
        {
            return i.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("executor {id} was never asked to inspect {job}");
}

/// What the job says once its state is not `inspecting`.
async fn after_inspection(app: &TestApp, job: &str) -> Value {
    for _ in 0..100 {
        let j = app.get_json(&format!("/v1/jobs/{job}")).await;
        if j["state"] != "inspecting" {
            return j;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {job} stayed inspecting");
}

#[tokio::test]
async fn an_inspection_gets_the_spec_and_its_tensor_kinds_and_dtypes_are_checked() {
    let (app, store) = app_with_store("inspect").await;
    let (id, token) = register(&app, "inspector").await;
    let spec = torchscript_spec("bn-net");
    let job = app.submit(&spec).await["id"].as_str().unwrap().to_owned();

    // The heartbeat carries the file and the job's spec (for the forward
    // pass on a batch of its data).
    let i = inspection_for(&app, &id, &token, &job).await;
    assert_eq!(i["url"], "file:///models/net.pt");
    assert_eq!(i["spec"]["name"], "bn-net", "{i}");
    assert_eq!(i["spec"]["model"], spec["model"]);
    assert_eq!(i["spec"]["dataset"], spec["dataset"]);
    assert_eq!(i["spec"]["batch_size"], 64);

    let report = |tensors: Value| {
        let body = json!({"job_id": job, "result": {"parameters": tensors}});
        let (app, path, token) = (&app, format!("/v1/executors/{id}/inspections"), &token);
        async move { app.post_as(&path, token, &body).await }
    };
    let conv = json!({"name": "conv.weight", "shape": [8, 1, 3, 3]});
    let mean = json!({"name": "bn.running_mean", "shape": [8], "kind": "buffer"});
    // Each bad tensor is refused naming its field; the job stays inspecting.
    for (tensors, field) in [
        (
            json!([conv, {"name": "bn.weight", "shape": [8], "dtype": "float128"}]),
            "result.parameters[1].dtype",
        ),
        (
            json!([conv, {"name": "bn.weight", "shape": [8], "dtype": "x".repeat(5000)}]),
            "result.parameters[1].dtype",
        ),
        (
            json!([conv, {"name": "fc.weight", "shape": [8], "dtype": "int64"}]),
            "result.parameters[1].dtype",
        ),
        (
            json!([conv, mean, {"name": "conv.weight", "shape": [8], "kind": "frozen"}]),
            "result.parameters[2].name",
        ),
        (
            json!([conv, {"name": "bn.running_var", "shape": [8], "kind": "state"}]),
            "result.parameters[1].kind",
        ),
        (
            json!([conv, {"name": "", "shape": [8]}]),
            "result.parameters[1].name",
        ),
    ] {
        let body = assert_problem(report(tensors).await, 422, Some(field)).await;
        assert!(
            body.to_string().len() < 4000,
            "a refusal quotes the value bounded: {body}"
        );
    }
    let j = app.get_json(&format!("/v1/jobs/{job}")).await;
    assert_eq!(j["state"], "inspecting", "{j}");

    // Parameters, buffers (an integer one too) and a frozen parameter: the
    // job is scheduled, the reason counts each kind, and the tensor list
    // keeps their kinds and dtypes.
    let good = json!([
        conv,
        {"name": "bn.weight", "shape": [8]},
        {"name": "emb.weight", "shape": [10, 4], "kind": "frozen", "dtype": "float32"},
        mean,
        {"name": "bn.num_batches_tracked", "shape": [], "kind": "buffer", "dtype": "int64"},
        {"name": "mask", "shape": [4], "kind": "buffer", "dtype": "bool"},
    ]);
    assert_eq!(report(good).await.status(), 200);
    let j = after_inspection(&app, &job).await;
    assert_ne!(j["state"], "failed", "{j}");
    // The scheduler may have moved on already: the transition keeps the
    // inspection's reason.
    let events = app.get_json(&format!("/v1/jobs/{job}/events")).await;
    let reason = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["to_state"] == "scheduling")
        .and_then(|e| e["reason"].as_str())
        .unwrap_or_else(|| panic!("no transition to scheduling in {events}"));
    assert!(
        reason.contains("inspected: 6 tensors, 80 parameters, 13 buffer elements, 40 frozen"),
        "{reason}"
    );
    let t = app.get_json(&format!("/v1/jobs/{job}/tensors")).await;
    assert_eq!(t["source"], "inspection", "{t}");
    assert_eq!(
        (&t["parameters"], &t["buffers"], &t["frozen"], &t["count"]),
        (&json!(80), &json!(13), &json!(40), &json!(6))
    );
    let kinds: Vec<(&str, &str, &str)> = t["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap(),
                t["kind"].as_str().unwrap_or("parameter"),
                t["dtype"].as_str().unwrap_or("float32"),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("conv.weight", "parameter", "float32"),
            ("bn.weight", "parameter", "float32"),
            ("emb.weight", "frozen", "float32"),
            ("bn.running_mean", "buffer", "float32"),
            ("bn.num_batches_tracked", "buffer", "int64"),
            ("mask", "buffer", "bool"),
        ]
    );

    // Only buffers and frozen parameters: nothing to train.
    let job = app.submit(&torchscript_spec("all-frozen")).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    inspection_for(&app, &id, &token, &job).await;
    let body = json!({"job_id": job, "result": {"parameters": [
        {"name": "fc.weight", "shape": [10, 10], "kind": "frozen"},
        {"name": "bn.running_mean", "shape": [10], "kind": "buffer"},
    ]}});
    let r = app
        .post_as(&format!("/v1/executors/{id}/inspections"), &token, &body)
        .await;
    assert_eq!(r.status(), 200);
    let j = after_inspection(&app, &job).await;
    assert_eq!(j["state"], "failed", "{j}");
    assert!(
        j["state_reason"]
            .as_str()
            .unwrap()
            .contains("no trainable parameters"),
        "{j}"
    );

    // The executor's reason for refusing a module is the job's.
    let job = app.submit(&torchscript_spec("two-inputs")).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    inspection_for(&app, &id, &token, &job).await;
    let why = "the module's forward must take one tensor (a batch); it is `forward(self, x: Tensor, y: Tensor) -> Tensor`";
    let body = json!({"job_id": job, "result": {"error": why}});
    let r = app
        .post_as(&format!("/v1/executors/{id}/inspections"), &token, &body)
        .await;
    assert_eq!(r.status(), 200);
    let j = after_inspection(&app, &job).await;
    assert_eq!(
        (&j["state"], j["state_reason"].as_str()),
        (&json!("failed"), Some(why)),
        "{j}"
    );

    // Buffers take a worker's memory too: 10 parameters fit in 64 MiB, 10
    // parameters beside 100 million buffer elements do not.
    let mut spec = torchscript_spec("big-buffers");
    spec["resources"] = json!({"memory_mb": 64});
    let job = app.submit(&spec).await["id"].as_str().unwrap().to_owned();
    inspection_for(&app, &id, &token, &job).await;
    let body = json!({"job_id": job, "result": {"parameters": [
        {"name": "fc.weight", "shape": [10]},
        {"name": "table", "shape": [100_000_000], "kind": "buffer"},
    ]}});
    let r = app
        .post_as(&format!("/v1/executors/{id}/inspections"), &token, &body)
        .await;
    assert_eq!(r.status(), 200);
    let j = after_inspection(&app, &job).await;
    assert_eq!(j["state"], "failed", "{j}");
    let reason = j["state_reason"].as_str().unwrap();
    assert!(
        reason.contains("a worker needs") && reason.contains("resources.memory_mb (64)"),
        "{reason}"
    );
    let _ = std::fs::remove_dir_all(&store);
}

/// Registers executor `name` saying its sandbox is in `state`: its id and
/// token.
async fn register_sandboxed(app: &TestApp, name: &str, state: &str) -> (String, String) {
    let mut body = crate::executors::registration(name);
    body["sandbox"] = json!({"state": state, "detail": format!("{state} (test)")});
    crate::executors::register_body(app, &body).await
}

#[tokio::test]
async fn an_executor_that_cannot_confine_users_code_never_inspects_a_model() {
    let (app, store) = app_with_store("unconfined").await;
    let (bare, bare_token) = register_sandboxed(&app, "bare-kernel", "unavailable").await;
    let job = app.submit(&torchscript_spec("waits")).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // However often it asks, it is given nothing; the job says why it waits.
    let mut reason = String::new();
    for _ in 0..30 {
        let hb: Value = app
            .post_as(
                &format!("/v1/executors/{bare}/heartbeat"),
                &bare_token,
                &json!({"roles": []}),
            )
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(hb["inspections"], json!([]), "{hb}");
        let j = app.get_json(&format!("/v1/jobs/{job}")).await;
        assert_eq!(j["state"], "queued", "{j}");
        reason = j["state_reason"].as_str().unwrap_or("").to_owned();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reason.contains("can confine users' code"), "{reason}");
    // The listing says how each executor stands.
    let list = app.get_json("/v1/executors").await;
    let listed = &list["executors"][0];
    assert_eq!(
        listed["sandbox"],
        json!({"state": "unavailable", "detail": "unavailable (test)"})
    );
    // A confined executor takes the inspection.
    let (id, token) = register_sandboxed(&app, "confined", "confined").await;
    let i = inspection_for(&app, &id, &token, &job).await;
    assert_eq!(i["job_id"], json!(job));
    let _ = std::fs::remove_dir_all(&store);
}

#[tokio::test]
async fn a_sandbox_report_is_bounded_and_named_when_refused() {
    let app = crate::helpers::spawn_app().await;
    let mut body = crate::executors::registration("chatty");
    body["sandbox"] = json!({"state": "confined", "detail": "x".repeat(513)});
    let r = crate::executors::post_registration(&app, &body).await;
    assert_problem(r, 422, Some("sandbox.detail")).await;
    body["sandbox"] = json!({"state": "sideways", "detail": ""});
    let r = crate::executors::post_registration(&app, &body).await;
    assert_eq!(r.status(), 422, "an unknown state is refused");
}

/// The jobs of the assignments executor `id` is given over `beats`
/// heartbeats.
async fn assignments_of(app: &TestApp, id: &str, token: &str, beats: usize) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..beats {
        let hb = heartbeat(app, id, token).await;
        for a in hb["assignments"].as_array().cloned().unwrap_or_default() {
            seen.push(a["key"]["job_id"].as_str().unwrap_or("").to_owned());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

#[tokio::test]
async fn a_torchscript_job_trains_only_where_its_module_can_be_confined() {
    let (app, store) = app_with_store("placed-confined").await;
    let (bare, bare_token) = register_sandboxed(&app, "bare-kernel", "unavailable").await;
    let (ok, ok_token) = register_sandboxed(&app, "confined", "confined").await;
    let ring = |mut spec: Value| {
        spec["strategy"] = json!("allreduce");
        spec["workers"] = json!({"min": 1, "max": 2});
        let o = spec.as_object_mut().unwrap();
        o.remove("parameter_servers");
        o.remove("consistency");
        spec
    };
    // Control: a built-in model's ring of up to two takes both executors.
    let mlp = app.submit(&ring(digits_spec("mlp-ring"))).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Both beat (an executor that stops beating is declared lost).
    let mut on_bare = Vec::new();
    for _ in 0..30 {
        on_bare.extend(assignments_of(&app, &bare, &bare_token, 1).await);
        assignments_of(&app, &ok, &ok_token, 1).await;
    }
    assert!(on_bare.contains(&mlp), "{on_bare:?}");
    let r = app
        .post_json(&format!("/v1/jobs/{mlp}/cancel"), &json!({}))
        .await;
    assert!(r.status().is_success(), "{}", r.status());

    // The same ring of a TorchScript module: only the confined executor.
    let job = app.submit(&ring(torchscript_spec("ts-ring"))).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    inspection_for(&app, &ok, &ok_token, &job).await;
    let body = json!({"job_id": job, "result": {"parameters": [
        {"name": "fc.weight", "shape": [10, 64]},
        {"name": "fc.bias", "shape": [10]},
    ]}});
    let r = app
        .post_as(&format!("/v1/executors/{ok}/inspections"), &ok_token, &body)
        .await;
    assert_eq!(r.status(), 200);
    let (mut placed, mut on_bare) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        placed.extend(assignments_of(&app, &ok, &ok_token, 1).await);
        on_bare.extend(assignments_of(&app, &bare, &bare_token, 1).await);
    }
    assert!(placed.contains(&job), "{placed:?}");
    assert!(!on_bare.contains(&job), "{on_bare:?}");
    let _ = std::fs::remove_dir_all(&store);
}

#[tokio::test]
async fn a_script_job_is_placed_only_where_its_ranks_network_can_be_confined() {
    let (app, store) = app_with_store("placed-scripts").await;
    // Both confine models; only one can give a script rank its network
    // namespace (the other has no `nft`, say).
    let register_scripts = |name: &'static str, scripts: &'static str| {
        let mut body = crate::executors::registration(name);
        body["sandbox"] = json!({"state": "confined", "detail": "test", "scripts": scripts});
        body
    };
    let (bare, bare_token) =
        crate::executors::register_body(&app, &register_scripts("no-netns", "unavailable")).await;
    let (ok, ok_token) =
        crate::executors::register_body(&app, &register_scripts("netns", "confined")).await;
    let listed = app.get_json("/v1/executors").await;
    let scripts_of: Vec<String> = listed["executors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["sandbox"]["scripts"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(scripts_of.contains(&"unavailable".to_owned()), "{listed}");
    let r = app
        .client
        .put(app.url("/v1/artifacts/train.py"))
        .body("print('hi')\n")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let job = app
        .submit(&json!({
            "name": "ddp",
            "script": {"code": "artifact:train.py"},
            "workers": {"min": 1, "max": 2},
        }))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (mut placed, mut on_bare) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        placed.extend(assignments_of(&app, &ok, &ok_token, 1).await);
        on_bare.extend(assignments_of(&app, &bare, &bare_token, 1).await);
    }
    assert!(placed.contains(&job), "{placed:?}");
    assert!(!on_bare.contains(&job), "{on_bare:?}");
    let _ = std::fs::remove_dir_all(&store);
}
