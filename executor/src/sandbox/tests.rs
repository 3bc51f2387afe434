//! The sandbox's refusals on kernels that cannot confine, and this
//! kernel's confinement, as the executor reports them.

use super::*;
use trainyard_common::cluster::SandboxState;

fn on_a_kernel(status: Status, mode: Mode) -> Sandbox {
    let mut s = Sandbox::for_tests();
    s.status = status;
    s.mode = mode;
    s
}

fn bare() -> Status {
    Status {
        landlock_abi: 0,
        seccomp: true,
        memory_cgroup: false,
        pids_cgroup: false,
        netns_missing: None,
    }
}

#[test]
fn without_landlock_users_code_is_refused_unless_the_admin_says_off() {
    let s = on_a_kernel(bare(), Mode::On);
    let why = s.refusal().expect("refused");
    assert!(
        why.contains("no Landlock") && why.contains("--sandbox off"),
        "{why}"
    );
    assert_eq!(s.report().state, SandboxState::Unavailable);
    // Nothing is started: the refusal is the answer.
    let ws = s.workspace("refused").unwrap();
    let r: Result<serde_json::Value, SandboxError> = s.run(
        Kind::Inspection,
        &ws,
        &0,
        Limits::default(),
        Duration::from_secs(5),
        &|| false,
    );
    assert!(
        matches!(&r, Err(SandboxError::Refused(w)) if *w == why),
        "{r:?}"
    );

    let off = on_a_kernel(bare(), Mode::Off);
    assert_eq!(off.refusal(), None);
    assert_eq!(off.report().state, SandboxState::Unconfined);
    assert!(off.report().detail.contains("unconfined"));
}

#[test]
fn without_a_network_namespace_script_jobs_are_refused_and_models_are_not() {
    let mut status = Status::probe();
    status.netns_missing = Some("`nft` is not installed".into());
    let s = on_a_kernel(status.clone(), Mode::On);
    assert_eq!(s.refusal(), None, "models are still confined here");
    let why = s.script_refusal().expect("scripts refused");
    assert!(
        why.contains("nft") && why.contains("--sandbox off"),
        "{why}"
    );
    let r = s.report();
    assert_eq!(r.state, SandboxState::Confined);
    assert_eq!(r.scripts, Some(SandboxState::Unavailable));
    assert!(r.detail.contains("script jobs refused"), "{}", r.detail);
    let ws = s.workspace("no-netns").unwrap();
    let task = ScriptTask {
        program: "/bin/true".into(),
        args: vec![],
        env: vec![],
        cwd: "/".into(),
    };
    let started = s.start_script(
        &ws,
        &task,
        Limits::default(),
        vec![],
        vec![],
        tch::Device::Cpu,
        None,
    );
    assert!(
        matches!(&started, Err(SandboxError::Refused(w)) if *w == why),
        "{:?}",
        started.err()
    );
    // Off: the admin's choice, said loudly.
    let off = on_a_kernel(status, Mode::Off);
    assert_eq!(off.script_refusal(), None);
    assert_eq!(off.report().scripts, Some(SandboxState::Unconfined));
    assert!(
        off.summary().contains("host's network"),
        "{}",
        off.summary()
    );
}

#[test]
fn this_kernel_confines_and_says_how() {
    let s = Sandbox::for_tests();
    assert_eq!(s.refusal(), None, "{:?}", s.status());
    let r = s.report();
    assert_eq!(r.state, SandboxState::Confined);
    assert!(r.detail.starts_with("on: landlock ABI"), "{}", r.detail);
    assert_eq!(r.scripts, Some(SandboxState::Confined), "{}", r.detail);
    assert!(r.detail.contains("network namespace each"), "{}", r.detail);
}
