//! Starting a script job's rank, in the order it happens: the runtime and
//! the code ([`code_in_place`]), the job's own packages
//! ([`own_packages`]), its inputs, the checkpoint folder restored from the
//! job's latest commit ([`restored_checkpoints`]), its network (the slot's
//! namespace and relay, [`network`]) and then the confined process itself,
//! from a warm spare when one is ready ([`launch`]). What the rank's
//! thread then watches is a [`Started`].

use super::runtime::runtime_folders;
use super::{checkpoints, code, env, packages, relay, reports, toolchain, warm, Failure};
use crate::role::Role;
use crate::sandbox::{Sandbox, Workspace, RUNTIME_MB};
use std::path::{Path, PathBuf};
use std::time::Instant;
use trainyard_common::cluster::{
    LogLevel, PackagesPhase, PackagesStage, WorkerPeer, MAX_PACKAGES_DETAIL,
};
use trainyard_common::spec::{input_name, ScriptSpec};
use trainyard_confined::protocol::ScriptTask;
use trainyard_sandbox::Limits;

/// A started rank.
pub(super) struct Started {
    pub(super) child: trainyard_sandbox::spawn::Child,
    /// Rank 0's: commits its checkpoint folder to the job's store.
    pub(super) committer: Option<checkpoints::Committer>,
    /// What its script reports (`trainyard.report()`).
    pub(super) reports: reports::Reports,
    /// Metrics it reported that are not stored, already named in the log.
    pub(super) unknown: std::collections::BTreeSet<String>,
    pub(super) rank: u32,
    /// Whether its script reported anything (`trainyard.report()`) in
    /// this try.
    pub(super) reported: bool,
    /// Its packages' environment (in use while it runs).
    _env: Option<packages::Env>,
    pub(super) checkpoints: PathBuf,
    /// Its workspace (removed when dropped, after the process ended).
    _ws: Workspace,
    pub(super) outputs: PathBuf,
}

/// The rank's folders in its slot's workspace.
struct Slot {
    /// The slot's index on this executor.
    index: u32,
    /// Its workspace, kept across the job's generations here (a spare
    /// interpreter for the next one is confined to it before its rank
    /// exists).
    ws: Workspace,
}

/// Puts the code and inputs in place and starts the script.
pub(super) fn prepare(
    role: &Role,
    script: &ScriptSpec,
    rank: u32,
    peers: &[&WorkerPeer],
) -> Result<Started, Failure> {
    let a = &role.assignment;
    let sandbox = &role.ctx.sandbox;
    let job = a.key.job_id;
    let base = sandbox
        .python(script.python.as_deref())
        .map_err(Failure::refused)?;
    let index = a.device.unwrap_or(0);
    let slot = Slot {
        index,
        ws: sandbox
            .job_workspace(job, &format!("slot-{index}"))
            .map_err(Failure::crashed)?,
    };
    let (code_dir, entrypoint) = code_in_place(role, script, &slot.ws)?;
    let env = own_packages(role, script, rank, base, &code_dir)?;
    let python = env.as_ref().map_or(base, |e| e.python.as_path());
    let input_dir = inputs_in_place(role, &slot.ws)?;
    let (checkpoints, committer) = restored_checkpoints(role, rank, slot.index)?;
    let outputs = slot.ws.scratch().join("outputs");
    let home = slot.ws.scratch().join("home");
    // One file per generation: a new one's reports start from nothing.
    let report_file = slot
        .ws
        .scratch()
        .join(format!("reports-{}.jsonl", a.key.generation));
    for d in [&outputs, &home] {
        std::fs::create_dir_all(d).map_err(Failure::crashed)?;
        sandbox.give(d).map_err(Failure::crashed)?;
    }
    let netns = network(role, rank, slot.index, peers)?;
    // Confined, its `/tmp` is its own (bound there); unconfined, a folder
    // of its scratch.
    let tmp = match netns {
        Some(_) => PathBuf::from(crate::sandbox::SCRIPT_TMP),
        None => {
            let t = slot.ws.scratch().join("tmp");
            std::fs::create_dir_all(&t).map_err(Failure::crashed)?;
            t
        }
    };
    let folders = env::Folders {
        code: &code_dir,
        inputs: &input_dir,
        checkpoints: &checkpoints,
        outputs: &outputs,
        scratch: &home,
        tmp: &tmp,
        reports: &report_file,
    };
    let child = launch(
        role,
        script,
        Rank {
            rank,
            peers,
            python,
        },
        &slot,
        &folders,
        &entrypoint,
        netns,
    )?;
    Ok(Started {
        child,
        committer,
        reports: reports::Reports::new(report_file),
        unknown: Default::default(),
        rank,
        reported: false,
        _env: env,
        checkpoints,
        _ws: slot.ws,
        outputs,
    })
}

/// `url` fetched (the field `what` named in the error).
fn fetch(role: &Role, url: &str, what: &str) -> Result<crate::storage::Fetched, Failure> {
    role.ctx
        .fetcher
        .fetch(url)
        .map_err(|e| Failure::Refused(format!("{what}: {e}")))
}

/// The script's code unpacked into the slot's `inputs/code` (once: a slot
/// keeps it across generations); the folder and the entrypoint.
fn code_in_place(
    role: &Role,
    script: &ScriptSpec,
    ws: &Workspace,
) -> Result<(PathBuf, String), Failure> {
    let code_dir = ws.inputs().join("code");
    let code = fetch(role, &script.code, "script.code")?;
    let entrypoint = script.entrypoint().unwrap_or_default();
    let packaging = script
        .packaging()
        .ok_or_else(|| Failure::Refused("script.code: not a .py file or an archive".into()))?;
    let name = input_name(&script.code).to_owned();
    if !code_dir.exists() {
        // Whole or not at all: a half-made folder is never reused.
        let part = ws.inputs().join("code.part");
        let _ = std::fs::remove_dir_all(&part);
        code::materialize(&code, &name, packaging, &part, &entrypoint).map_err(Failure::refused)?;
        std::fs::rename(&part, &code_dir).map_err(Failure::crashed)?;
    }
    Ok((code_dir, entrypoint))
}

/// The job's own packages, in an environment over the runtime `base`,
/// made (or found in this executor's cache) before the rank starts;
/// `None` where it asks for none.
fn own_packages(
    role: &Role,
    script: &ScriptSpec,
    rank: u32,
    base: &Path,
    code_dir: &Path,
) -> Result<Option<packages::Env>, Failure> {
    let sandbox = &role.ctx.sandbox;
    let fetch_file = |url: &str| match fetch(role, url, "script.requirements") {
        Ok(f) => Ok(f.path),
        Err(Failure::Refused(e) | Failure::Crashed(e) | Failure::OutOfTime(e)) => {
            Err(packages::RequirementsError::Fetch(e))
        }
    };
    let Some(wanted) = packages::wanted(script.requirements.as_ref(), &fetch_file, code_dir)
        .map_err(Failure::refused)?
    else {
        return Ok(None);
    };
    let base_runtime = runtime_folders(base).map_err(Failure::refused)?;
    let log = |line: String| role.log(LogLevel::Info, format!("rank {rank}: {line}"));
    let phase = |p: PackagesPhase| role.packages(p);
    let run = packages::Run {
        sandbox,
        python: base,
        runtime: &base_runtime,
        log: &log,
        phase: &phase,
        stopping: &|| role.stopping(),
    };
    let asked = Instant::now();
    match packages::config(sandbox).ensure(&run, &wanted) {
        Ok(env) => {
            if env.cached {
                let seconds = asked.elapsed().as_secs_f64();
                role.log(
                    LogLevel::Info,
                    format!(
                        "rank {rank}: packages: this executor's environment for them ({} packages, ready in {seconds:.3} s)",
                        env.packages,
                    ),
                );
                phase(PackagesPhase {
                    stage: PackagesStage::Cached,
                    detail: format!("this executor's environment {} for them", env.key()),
                    packages: Some(u32::try_from(env.packages).unwrap_or(u32::MAX)),
                    seconds: Some(seconds),
                    environment: Some(env.key().to_owned()),
                });
            }
            Ok(Some(env))
        }
        Err(packages::InstallError::Refused(why)) => {
            phase(PackagesPhase {
                stage: PackagesStage::Failed,
                detail: why.chars().take(MAX_PACKAGES_DETAIL).collect(),
                packages: None,
                seconds: Some(asked.elapsed().as_secs_f64()),
                environment: None,
            });
            Err(Failure::Refused(why))
        }
        Err(packages::InstallError::Executor(why)) => Err(Failure::Crashed(why)),
        Err(packages::InstallError::Stopped) => {
            Err(Failure::Crashed("stopped while installing packages".into()))
        }
    }
}

/// The job's inputs linked (or copied) into the slot's `inputs/data`.
fn inputs_in_place(role: &Role, ws: &Workspace) -> Result<PathBuf, Failure> {
    let input_dir = ws.inputs().join("data");
    std::fs::create_dir_all(&input_dir).map_err(Failure::crashed)?;
    for (i, url) in role.assignment.spec.inputs.iter().enumerate() {
        let file = fetch(role, url, &format!("inputs[{i}]"))?;
        let to = input_dir.join(input_name(url));
        if to.exists() {
            continue;
        }
        if std::fs::hard_link(&file.path, &to).is_err() {
            std::fs::copy(&file.path, &to)
                .map_err(|e| Failure::Crashed(format!("inputs[{i}]: {e}")))?;
        }
    }
    Ok(input_dir)
}

/// The slot's checkpoint folder, holding exactly the job's latest
/// committed checkpoint (or, before its first, the one `resume_from`
/// names); rank 0's committer with it.
fn restored_checkpoints(
    role: &Role,
    rank: u32,
    slot: u32,
) -> Result<(PathBuf, Option<checkpoints::Committer>), Failure> {
    let a = &role.assignment;
    let job = a.key.job_id;
    let checkpoints = role
        .ctx
        .sandbox
        .job_folder(job, &format!("checkpoints-{slot}"))
        .map_err(Failure::crashed)?;
    let store = role
        .storage
        .as_ref()
        .map_err(|e| Failure::Crashed(format!("cannot open the object store: {e}")))?;
    let latest = checkpoints::latest(store, job).map_err(Failure::crashed)?;
    // Before its own first commit, a job with `resume_from` starts from
    // that script job's checkpoint (at whatever world size it had).
    let (source, from) = match (&latest, a.spec.resume_from) {
        (None, Some(r)) => {
            let m = checkpoints::numbered(store, r.job_id, r.step).map_err(Failure::crashed)?;
            if m.is_none() {
                return Err(Failure::Refused(format!(
                    "resume_from: job {} has no such committed checkpoint",
                    r.job_id
                )));
            }
            (r.job_id, m)
        }
        _ => (job, latest.clone()),
    };
    let restored = checkpoints::restore(store, source, from.as_ref(), &checkpoints)
        .map_err(Failure::crashed)?;
    let whose = if source == job {
        String::new()
    } else {
        format!(" of job {source}")
    };
    role.log(LogLevel::Info, format!("rank {rank}: {restored}{whose}"));
    let committer = (rank == 0).then(|| {
        checkpoints::Committer::new(
            job,
            a.key.generation as u64,
            latest.as_ref(),
            a.spec.checkpoint.keep,
            checkpoints::scan(&checkpoints),
        )
    });
    Ok((checkpoints, committer))
}

/// The rank's network namespace (`--sandbox on`): the slot's, whose only
/// way out is the relay to this generation's ranks; `None` unconfined.
fn network(
    role: &Role,
    rank: u32,
    slot: u32,
    peers: &[&WorkerPeer],
) -> Result<Option<PathBuf>, Failure> {
    let sandbox = &role.ctx.sandbox;
    match sandbox.mode() {
        crate::sandbox::Mode::On => {
            if let Some(why) = sandbox.script_refusal() {
                return Err(Failure::Refused(why));
            }
            let relayed =
                relay::slot(role.assignment.key.job_id, slot).map_err(Failure::crashed)?;
            relayed.serve(role, rank, peers).map_err(Failure::crashed)?;
            Ok(Some(relayed.netns_path()))
        }
        crate::sandbox::Mode::Off => Ok(None),
    }
}

/// Who the rank is: its rank among `peers`, run by `python`.
struct Rank<'a> {
    rank: u32,
    peers: &'a [&'a WorkerPeer],
    python: &'a Path,
}

/// Starts the rank's process (in the slot's spare interpreter when one is
/// ready for exactly this task), and asks for the next generation's spare.
fn launch(
    role: &Role,
    script: &ScriptSpec,
    who: Rank<'_>,
    slot: &Slot,
    folders: &env::Folders<'_>,
    entrypoint: &str,
    netns: Option<PathBuf>,
) -> Result<trainyard_sandbox::spawn::Child, Failure> {
    let a = &role.assignment;
    let sandbox: &Sandbox = &role.ctx.sandbox;
    let Rank {
        rank,
        peers,
        python,
    } = who;
    let job = a.key.job_id;
    let mut runtime = runtime_folders(python).map_err(Failure::refused)?;
    runtime.extend(network_folders());
    // torch.compile's inductor runs the host's C++ compiler on the headers
    // of the compiler, the system and Python (all read-only).
    runtime.extend(toolchain::folders().iter().cloned());
    let interface = match netns {
        Some(_) => Some(trainyard_sandbox::netns::INTERFACE.to_owned()),
        None => env::interface_of(env::host_of(&peers[rank as usize].address)),
    };
    // An API that does not count them: every generation was a restart.
    let restarts = a
        .restarts
        .unwrap_or(u32::try_from(a.key.generation.saturating_sub(1)).unwrap_or(u32::MAX));
    let place = env::Place {
        job,
        generation: a.key.generation as u64,
        peers,
        rank,
        max_restarts: script.max_restarts(),
        restarts,
        threads: sandbox.torch_threads(),
        interface,
        relayed: netns.is_some(),
    };
    let library_path = std::env::var("LD_LIBRARY_PATH").ok();
    let task = ScriptTask {
        program: python.to_owned(),
        args: std::iter::once(entrypoint.to_owned())
            .chain(script.args.iter().cloned())
            .collect(),
        env: env::environment(&place, folders, &script.env, library_path.as_deref()),
        cwd: folders.code.to_owned(),
    };
    let limits = Limits {
        memory_mb: a.spec.resources.memory_mb + RUNTIME_MB,
        ..Limits::default()
    };
    let device = role.device().map_err(Failure::refused)?;
    let read_write = vec![folders.checkpoints.to_owned()];
    let fingerprint = warm::fingerprint(
        &[
            format!("{:?} {:?} {:?}", task.program, task.args, task.cwd),
            format!("{limits:?} {runtime:?} {read_write:?} {device:?}"),
        ],
        &task.env,
    );
    let spares = warm::spares();
    let key = (job, slot.index);
    let go = trainyard_confined::protocol::spare::go_line(&task.env, &task.args, &task.cwd);
    let (child, warm_start) = match spares.take(key, fingerprint, &go, &|| role.stopping()) {
        Some(child) => (child, true),
        None => (
            sandbox
                .start_script(
                    &slot.ws,
                    &task,
                    limits,
                    runtime.clone(),
                    read_write.clone(),
                    device,
                    netns.clone(),
                )
                .map_err(Failure::crashed)?,
            false,
        ),
    };
    role.log(
        LogLevel::Info,
        format!(
            "rank {rank} of {} runs {entrypoint} (generation {}, restart {})",
            peers.len(),
            a.key.generation,
            restarts
        ),
    );
    if warm_start {
        role.log(
            LogLevel::Info,
            format!("rank {rank}: started in a warm interpreter (PyTorch already imported)"),
        );
    }
    // The next generation's interpreter, started while this one runs.
    let spare = ScriptTask {
        args: warm::spare_args(&task.args),
        ..task.clone()
    };
    match sandbox.script_launch(&slot.ws, &spare, limits, runtime, read_write, device, netns) {
        Ok((line, spec)) => spares.want(key, fingerprint, spec, line),
        Err(e) => tracing::debug!(error = %e, "no spare interpreter"),
    }
    Ok(child)
}

/// What gloo reads to pick its interface and transport: the network
/// interfaces and the PCI devices (each listing's entries are links into
/// `/sys/devices`, whose folders it reads), nothing else of `/sys`.
fn network_folders() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for listing in ["/sys/class/net", "/sys/bus/pci/devices"] {
        let listing = PathBuf::from(listing);
        for e in std::fs::read_dir(&listing).into_iter().flatten().flatten() {
            if let Ok(real) = std::fs::canonicalize(e.path()) {
                out.push(real);
            }
        }
        if listing.exists() {
            out.push(listing);
        }
    }
    out
}
