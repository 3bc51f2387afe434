//! A script job's rank: the user's own PyTorch training script, unmodified,
//! run in a sandboxed process under torchrun's environment contract.
//!
//! Each worker role of a script job is one rank. Its thread ([`start`])
//! puts the code ([`code`]) and the job's inputs into a sandbox workspace (inputs
//! read-only, the code read-only), gives the rank a checkpoint folder kept
//! across the job's generations on this executor and an output folder,
//! computes torchrun's variables ([`env`]) and starts the executor's
//! Python runtime on the entrypoint in a confined child
//! ([`crate::sandbox::Sandbox::start_script`]). The rank's stdout and
//! stderr become the job's log, bounded and tagged by rank. A new
//! generation (a join, a loss, a restart) stops the role, which kills the
//! process; the next generation's role starts it again with the new world
//! and `TORCHELASTIC_RESTART_COUNT` + 1 (a generation that only released
//! the job's roles, while it waited for executors, is not a restart), in
//! the slot's spare interpreter
//! when one is ready ([`warm`]: PyTorch already imported). A slot's
//! folders (code, inputs, scratch, checkpoints) live as long as the job
//! has a role on this executor.
//!
//! How it ends: rank 0's exit 0 uploads its output folder to the object
//! store and reports the job's result; another rank's exit 0 reports
//! nothing (rank 0's is the job's). A non-zero exit, a signal or a limit is
//! reported as a crash, which the API turns into a restart of every rank
//! until the spec's `max_restarts` are used up; when a peer may be the
//! cause (the script exited with an error: its collective may have broken
//! because a peer's executor died), the rank first asks for its peers to
//! be checked and gives the scheduler a moment to change the generation,
//! so that a lost executor does not spend a restart. A rank killed by a
//! signal or a limit is reported at once. A script still running after
//! its `script.max_seconds` (a day by default) is killed and fails the job
//! outright, naming the limit: a restart would meet the same limit.

pub mod checkpoints;
pub mod code;
pub mod env;
pub mod packages;
pub mod proxy;
pub mod relay;
pub mod repeats;
pub mod reports;
pub mod runtime;
mod start;
pub mod toolchain;
pub mod warm;

use crate::role::Role;
use crate::sandbox::RUNTIME_MB;
pub use runtime::{ask_python, runtime_folders, RuntimeError};
use start::{prepare, Started};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use trainyard_common::checkpoint::output_key;
use trainyard_common::cluster::{LogLevel, RoleOutcome, WorkerPeer};
use trainyard_common::spec::script::DEFAULT_SCRIPT_SECONDS;
use trainyard_common::spec::ScriptSpec;
use trainyard_sandbox::Ending;

/// Longest log line kept from a script, characters.
pub const MAX_LINE_CHARS: usize = 2000;
/// Lines a rank may log per second; more are counted and dropped.
pub const LINES_PER_SECOND: u32 = 200;
/// Lines of a failed rank's output its failure reason quotes.
pub const TAIL_LINES: usize = 20;
/// Most output files a job keeps.
pub const MAX_OUTPUT_FILES: usize = 1000;
/// Largest output file, bytes.
pub const MAX_OUTPUT_FILE: u64 = 1 << 30;
/// How long a rank whose script failed waits for the generation to
/// change (a peer's executor lost) before it reports a crash.
pub const PEER_GRACE: Duration = Duration::from_secs(10);

/// Runs rank `rank` of the script job `role` is assigned to, among
/// `peers`, until its script ends or its generation does.
pub fn run(role: &Role, rank: u32, peers: &[&WorkerPeer]) {
    let a = &role.assignment;
    let Some(script) = a.spec.script.as_ref() else {
        return role.fail("a script role's job has no script".into());
    };
    // The workspace (its output folder) lives until the outputs are stored.
    let mut started = None;
    let ended = prepare(role, script, rank, peers).and_then(|p| {
        let s = started.insert(p);
        watch(role, rank, s, peers.len())
    });
    match ended {
        Ok(Ended::Finished(outputs)) if rank == 0 => finish(role, &outputs),
        Ok(Ended::Finished(_)) => {
            role.log(LogLevel::Info, format!("rank {rank}'s script finished"))
        }
        Ok(Ended::Stopped) => {}
        Err(Failure::Refused(reason) | Failure::OutOfTime(reason)) => role.fail(reason),
        Err(Failure::Crashed(reason)) => {
            role.log(LogLevel::Error, reason.clone());
            let _ = role
                .tx
                .send(crate::reports::Item::Outcome(RoleOutcome::Crashed {
                    reason,
                }));
        }
    }
}

/// How a rank ended.
enum Ended {
    /// Its script exited 0; its output folder.
    Finished(PathBuf),
    /// Its generation ended (it was killed; nothing to report).
    Stopped,
}

/// Why a rank did not finish (or was not started): what the job does next
/// follows from the kind, and the text is the reason users read.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// The job cannot run here at all (its code refused, no such runtime):
    /// a restart would not help.
    #[error("{0}")]
    Refused(String),
    /// Its script failed: the job may restart it.
    #[error("{0}")]
    Crashed(String),
    /// Its script ran past `script.max_seconds` and was killed: the job
    /// fails (a restart would run into the same limit, and a script that
    /// never ends must not hold its executors through every restart).
    #[error("{0}")]
    OutOfTime(String),
}

impl Failure {
    /// A failure of this executor or of the script: a restart may help.
    fn crashed(e: impl std::fmt::Display) -> Failure {
        Failure::Crashed(e.to_string())
    }

    /// What no restart can cure.
    fn refused(e: impl std::fmt::Display) -> Failure {
        Failure::Refused(e.to_string())
    }
}

/// Waits for the rank's script to end, passing its output to the log; how
/// it ended.
fn watch(role: &Role, rank: u32, s: &mut Started, world: usize) -> Result<Ended, Failure> {
    let tail = Arc::new(Mutex::new(VecDeque::new()));
    let mut readers = Vec::new();
    for (stream, level) in [
        (
            s.child
                .stdout()
                .map(|o| Box::new(o) as Box<dyn Read + Send>),
            LogLevel::Info,
        ),
        (
            s.child
                .stderr()
                .map(|e| Box::new(e) as Box<dyn Read + Send>),
            LogLevel::Warn,
        ),
    ] {
        let Some(stream) = stream else { continue };
        let (tx, tail) = (role.tx.clone(), tail.clone());
        let job = role.assignment.key.job_id;
        readers.push(std::thread::spawn(move || {
            forward(stream, rank, level, &tail, |level, line| {
                tracing::debug!(%job, rank, "{line}");
                let _ = tx.send(crate::reports::Item::Log(level, line));
            })
        }));
    }
    let limit = role.assignment.spec.script.as_ref().map_or(
        Duration::from_secs(DEFAULT_SCRIPT_SECONDS),
        ScriptSpec::time_limit,
    );
    let ending = run_to_end(role, s, limit);
    for r in readers {
        let _ = r.join();
    }
    if ending == Ending::Exited(0) {
        // The folder as the script left it, before the outputs.
        commit_now(role, s);
    }
    if role.stopping() || ending == Ending::Killed {
        return Ok(Ended::Stopped);
    }
    if ending == Ending::Exited(0) {
        return Ok(Ended::Finished(s.outputs.clone()));
    }
    let last: Vec<String> = tail
        .lock()
        .map(|t| t.iter().cloned().collect())
        .unwrap_or_default();
    let what = match &ending {
        Ending::TimedOut(t) => format!(
            "rank {rank}'s script ran past its time limit (script.max_seconds: {} s) and was killed; the job fails without a restart",
            t.as_secs()
        ),
        Ending::Memory { .. } => format!(
            "rank {rank}'s script {ending} ({} MiB asked by resources.memory_mb, {RUNTIME_MB} MiB for the runtime)",
            role.assignment.spec.resources.memory_mb
        ),
        other => format!("rank {rank}'s script {other}"),
    };
    let reason = if last.is_empty() {
        what
    } else {
        format!("{what}; its last lines:\n{}", last.join("\n"))
    };
    if matches!(ending, Ending::TimedOut(_)) {
        return Err(Failure::OutOfTime(reason));
    }
    if toolchain::folders().is_empty() && toolchain::wanted_by(&last) {
        return Err(Failure::Refused(format!(
            "{}; {reason}",
            toolchain::missing()
        )));
    }
    // A rank killed by a signal or a limit failed by itself: restart at
    // once. One that exited with an error may have seen its collective
    // break because a peer's executor died.
    let own = matches!(
        ending,
        Ending::Signal(_) | Ending::Memory { .. } | Ending::FileSize { .. }
    );
    if world > 1 && !own {
        // The peers are checked, and a generation change in the meantime
        // means the loss, not the script, ended it.
        role.ctx
            .suspects
            .check(&role.assignment, format!("rank {rank}'s script failed"));
        let until = Instant::now() + PEER_GRACE;
        while Instant::now() < until {
            if role.stop.sleep(Duration::from_millis(100)) {
                return Ok(Ended::Stopped);
            }
        }
    }
    // Not a peer's loss: the script's own failure, which may be the one
    // it had last time.
    let job = role.assignment.key.job_id;
    let slot = role.assignment.device.unwrap_or(0);
    if let Some(twice) = repeats::same_again((job, slot), s.reported, &ending, &last) {
        return Err(Failure::Refused(format!("{twice}; {reason}")));
    }
    Err(Failure::Crashed(reason))
}

/// Waits for the script to end (killing it when the role stops, or when
/// it has run for `limit`: then [`Ending::TimedOut`]), reading its reports
/// and looking at rank 0's checkpoint folder every [`checkpoints::POLL`].
fn run_to_end(role: &Role, s: &mut Started, limit: Duration) -> Ending {
    let deadline = Instant::now() + limit;
    let mut next_look = Instant::now() + checkpoints::POLL;
    loop {
        if let Some(e) = s.child.try_ending() {
            read_reports(role, s);
            return e;
        }
        if role.stopping() {
            s.child.kill();
            return s.child.wait(None, &|| false);
        }
        if Instant::now() >= deadline {
            s.child.kill();
            let _ = s.child.wait(None, &|| false);
            read_reports(role, s);
            return Ending::TimedOut(limit);
        }
        let asked = read_reports(role, s);
        if asked || Instant::now() >= next_look {
            look(role, s, asked);
            next_look = Instant::now() + checkpoints::POLL;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Passes on what the script reported since the last call; whether it
/// asked for a checkpoint commit.
fn read_reports(role: &Role, s: &mut Started) -> bool {
    let (got, bad) = s.reports.poll();
    if let Some(why) = bad.first().filter(|_| !s.reports.complained) {
        s.reports.complained = true;
        role.log(
            LogLevel::Warn,
            format!(
                "rank {}: trainyard.report: {why} (ignored; said once)",
                s.rank
            ),
        );
    }
    let mut asked = false;
    s.reported |= !got.is_empty();
    for r in got {
        role.ctx.progress.step_done(r.step, 0.0);
        if let Some(c) = s.committer.as_mut() {
            c.step = Some(r.step);
        }
        asked |= r.checkpoint;
        if s.rank != 0 {
            continue;
        }
        for name in r.unknown {
            if s.unknown.len() < 32 && s.unknown.insert(name.clone()) {
                role.log(
                    LogLevel::Info,
                    format!("reported metric {name:?} is not stored (the job's metrics are loss, lr, eval_loss, eval_accuracy and samples_per_sec)"),
                );
            }
        }
        if let Some(p) = r.point {
            let _ = role.tx.send(crate::reports::Item::Metric(p));
        }
    }
    asked
}

/// One look at rank 0's checkpoint folder (a commit when it is due, or at
/// once when `asked`).
fn look(role: &Role, s: &mut Started, asked: bool) {
    let (Some(c), Ok(store)) = (s.committer.as_mut(), role.storage.as_ref()) else {
        return;
    };
    match c.look(store, &s.checkpoints, &|| role.stopping(), asked) {
        Ok(Some(line)) => role.log(LogLevel::Info, line),
        Ok(None) => {}
        Err(e) => role.log(LogLevel::Warn, format!("checkpoint not committed: {e}")),
    }
}

/// Commits rank 0's folder as its script left it (it has ended).
fn commit_now(role: &Role, s: &mut Started) {
    look(role, s, true);
}

/// Passes `stream`'s lines to `emit` tagged with the rank, at most
/// [`LINES_PER_SECOND`] a second, each cut at [`MAX_LINE_CHARS`]; keeps
/// the last [`TAIL_LINES`] in `tail`.
fn forward(
    stream: impl Read,
    rank: u32,
    level: LogLevel,
    tail: &Mutex<VecDeque<String>>,
    emit: impl Fn(LogLevel, String),
) {
    let mut second = Instant::now();
    let (mut sent, mut dropped) = (0u32, 0u64);
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.by_ref().take(1 << 20).read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&buf);
        let mut line: String = text.trim_end().chars().take(MAX_LINE_CHARS).collect();
        if text.trim_end().chars().count() > MAX_LINE_CHARS {
            line.push('…');
        }
        if let Ok(mut t) = tail.lock() {
            t.push_back(line.clone());
            if t.len() > TAIL_LINES {
                t.pop_front();
            }
        }
        if second.elapsed() >= Duration::from_secs(1) {
            if dropped > 0 {
                emit(
                    LogLevel::Warn,
                    format!("[rank {rank}] … {dropped} lines dropped (more than {LINES_PER_SECOND} a second)"),
                );
            }
            second = Instant::now();
            sent = 0;
            dropped = 0;
        }
        if sent < LINES_PER_SECOND {
            sent += 1;
            emit(level, format!("[rank {rank}] {line}"));
        } else {
            dropped += 1;
        }
    }
    if dropped > 0 {
        emit(
            LogLevel::Warn,
            format!(
                "[rank {rank}] … {dropped} lines dropped (more than {LINES_PER_SECOND} a second)"
            ),
        );
    }
}

/// Why rank 0's outputs were not stored: the job fails with it.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The object store could not be opened.
    #[error("cannot open the object store: {0}")]
    Store(Arc<crate::storage::StorageError>),
    /// More than [`MAX_OUTPUT_FILES`].
    #[error("more than {MAX_OUTPUT_FILES} output files")]
    TooMany,
    /// A name the store would keep under another.
    #[error("output {0:?}: a name of letters, digits and . _ - + = @ , only")]
    Name(String),
    /// A file over [`MAX_OUTPUT_FILE`].
    #[error("output {rel} is larger than {mib} MiB", mib = MAX_OUTPUT_FILE >> 20)]
    TooLarge {
        /// Its path under the outputs folder.
        rel: String,
    },
    /// A file could not be read.
    #[error("reading output {rel}: {source}")]
    Read {
        /// Its path under the outputs folder.
        rel: String,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be stored.
    #[error("storing output {rel}: {source}")]
    Put {
        /// Its path under the outputs folder.
        rel: String,
        /// Why.
        source: crate::storage::StorageError,
    },
}

/// Rank 0's end: its outputs to the object store, then the job's result.
fn finish(role: &Role, outputs: &Path) {
    let job = role.assignment.key.job_id;
    let stored = role
        .storage
        .as_ref()
        .map_err(|e| OutputError::Store(e.clone()))
        .and_then(|s| {
            let files = output_files(outputs)?;
            let mut bytes = 0u64;
            for (path, rel) in &files {
                let data = std::fs::read(path).map_err(|source| OutputError::Read {
                    rel: rel.clone(),
                    source,
                })?;
                bytes += data.len() as u64;
                s.put(&output_key(job, rel), data.into())
                    .map_err(|source| OutputError::Put {
                        rel: rel.clone(),
                        source,
                    })?;
            }
            Ok((files.len() as u64, bytes))
        });
    let outcome = match stored {
        Ok((files, bytes)) => {
            role.log(
                LogLevel::Info,
                format!("the script finished on rank 0; {files} output file(s), {bytes} bytes"),
            );
            RoleOutcome::Ran {
                outputs: files,
                bytes,
            }
        }
        Err(e) => {
            let reason = e.to_string();
            role.log(LogLevel::Error, reason.clone());
            RoleOutcome::Failed { reason }
        }
    };
    let _ = role.tx.send(crate::reports::Item::Outcome(outcome));
}

/// The regular files under `dir` with their paths relative to it, in
/// order; links and special files are left out. Bounded in count and size,
/// and named as the store keeps names.
pub fn output_files(dir: &Path) -> Result<Vec<(PathBuf, String)>, OutputError> {
    let files = checkpoints::scan(dir);
    if files.len() > MAX_OUTPUT_FILES {
        return Err(OutputError::TooMany);
    }
    let mut out = Vec::new();
    for (rel, (size, _)) in files {
        // Names the store keeps as they are: others would list under an
        // escaped name.
        let plain = rel.split('/').all(|seg| {
            !seg.is_empty()
                && seg.len() <= 255
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-+=@,".contains(c))
        });
        if !plain {
            return Err(OutputError::Name(rel));
        }
        if size > MAX_OUTPUT_FILE {
            return Err(OutputError::TooLarge { rel });
        }
        out.push((dir.join(&rel), rel));
    }
    Ok(out)
}
