//! The system-call layer: `no_new_privs` (Landlock sets it) and a seccomp
//! filter that refuses, with `EPERM`, what no training role needs and what
//! breaks out of a process: tracing others (ptrace, process_vm_*),
//! mounts and pivots, eBPF, kexec, kernel modules, new namespaces (unshare,
//! setns, clone with a `CLONE_NEW*` flag), the kernel keyring, perf events,
//! and host-wide settings (reboot, swap, clock, accounting, quotas).
//!
//! `clone3` passes its flags in memory a filter cannot read, so it answers
//! `ENOSYS`: the C library then falls back to `clone`, whose flags are
//! checked.

use crate::Error;
use seccompiler::{
    apply_filter_all_threads, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp,
    SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// The system calls refused outright.
pub const DENIED: &[(&str, i64)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("fsopen", libc::SYS_fsopen),
    ("fsmount", libc::SYS_fsmount),
    ("bpf", libc::SYS_bpf),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("personality", libc::SYS_personality),
];

/// The `clone` flags that make a namespace.
const NEW_NAMESPACE: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    // CLONE_NEWTIME shares its bit with CSIGNAL's range in clone(2)'s
    // flags word; it is only valid for clone3 and unshare, both refused.
];

fn arch() -> Result<TargetArch, Error> {
    if cfg!(target_arch = "x86_64") {
        Ok(TargetArch::x86_64)
    } else if cfg!(target_arch = "aarch64") {
        Ok(TargetArch::aarch64)
    } else {
        Err(Error::Seccomp("no filter for this architecture".into()))
    }
}

fn programs() -> Result<[BpfProgram; 2], Error> {
    let e = |e: seccompiler::BackendError| Error::Seccomp(e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|(_, n)| (*n, Vec::new())).collect();
    let clone_rules = NEW_NAMESPACE
        .iter()
        .map(|flag| {
            SeccompRule::new(vec![SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(*flag),
                *flag,
            )
            .map_err(e)?])
            .map_err(e)
        })
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(e)?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )
    .map_err(e)?;
    Ok([deny.try_into().map_err(e)?, clone3.try_into().map_err(e)?])
}

/// Installs the filters on every thread of this process (and its future
/// children). `no_new_privs` must be set (Landlock's restrict does).
pub fn install() -> Result<(), Error> {
    for p in programs()? {
        apply_filter_all_threads(&p).map_err(|e| Error::Seccomp(e.to_string()))?;
    }
    Ok(())
}

/// Whether this kernel takes seccomp filters.
pub fn available() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Seccomp:")))
        .unwrap_or(false)
        && programs().is_ok()
}
