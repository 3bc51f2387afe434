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

/// Users' code runs in `trainyard-confined`, the program beside the
/// executor's: an executor installed without it says so and does not
/// start (it would have nowhere confined to run a model or a script).
#[test]
fn an_executor_without_its_confined_program_does_not_start() {
    let exe = binary("trainyard-executor").unwrap();
    // A hard link in a folder of its own, on the same file system: the
    // executor's own path is the link's (a symbolic link would resolve to
    // the folder that has the confined program).
    let alone = exe
        .parent()
        .unwrap()
        .join(format!("alone-{}", std::process::id()));
    std::fs::create_dir_all(&alone).unwrap();
    let copy = alone.join("trainyard-executor");
    let _ = std::fs::remove_file(&copy);
    std::fs::hard_link(&exe, &copy)
        .or_else(|_| std::fs::copy(&exe, &copy).map(drop))
        .unwrap();
    let out = Command::new(&copy)
        .args(["--api", "http://127.0.0.1:9", "--join-token", "t"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&alone);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("trainyard-confined is missing") && err.contains("does not run without it"),
        "{err}"
    );
}
