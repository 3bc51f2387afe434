//! `trainyard-executor --probe` proves the libtorch link.

use std::process::Command;
use trainyard_e2e::{binary, run_ok};

#[test]
fn probe_reports_libtorch_2_11_and_a_working_cpu() {
    let out = run_ok(
        Command::new(binary("trainyard-executor").unwrap()).arg("--probe"),
        "trainyard-executor --probe",
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let version = report["libtorch_version"].as_str().unwrap_or_default();
    assert!(
        version.starts_with("2.11.0"),
        "libtorch {version}: {report}"
    );
    // --no-as-needed keeps libtorch_cuda linked even on a machine without a GPU.
    assert_eq!(report["cuda_library_loaded"], true, "{report}");
    assert_eq!(report["devices"][0]["device"], "cpu");
    assert_eq!(report["devices"][0]["matmul_ok"], true);
    if report["cuda_available"] == true {
        let devices = report["devices"].as_array().unwrap();
        assert!(
            devices.len() > 1 && devices.iter().all(|d| d["matmul_ok"] == true),
            "{report}"
        );
    }
}

#[test]
fn executor_without_a_mode_fails_with_a_message() {
    let out = Command::new(binary("trainyard-executor").unwrap())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--probe"));
}
