//! How a confined child starts: it reads its [`Envelope`] on stdin,
//! confines itself ([`trainyard_sandbox::enter`]) before it reads a byte
//! of the user's, and then works: [`child`] answers one line, [`session`]
//! converses, [`exec_script`] becomes the script's interpreter.

use crate::protocol::{Envelope, ScriptTask};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

/// The child's side of a script: reads the envelope on stdin, confines
/// itself, asks to be killed with the thread that started it (its role's,
/// which waits for it), and replaces itself with the interpreter. Returns
/// an exit code only when that fails.
pub fn exec_script() -> i32 {
    let envelope: Envelope<ScriptTask> = match read_envelope(&mut std::io::stdin().lock()) {
        Ok(e) => e,
        Err(code) => return code,
    };
    // Before the confinement: it survives exec, and the role's thread
    // lives exactly as long as the script should.
    if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL) {
        eprintln!("cannot tie the script to its executor: {e}");
        return 3;
    }
    if envelope
        .parent
        .is_some_and(|p| p != std::os::unix::process::parent_id())
    {
        eprintln!("the executor is gone");
        return 3;
    }
    if let Some(c) = &envelope.confinement {
        if let Err(e) = trainyard_sandbox::enter(c) {
            eprintln!("cannot confine this process: {e}");
            return 3;
        }
    }
    let task = envelope.task;
    if let Err(e) = std::env::set_current_dir(&task.cwd) {
        eprintln!("cannot enter the script's folder: {e}");
        return 3;
    }
    let cstr = |s: &str| std::ffi::CString::new(s).map_err(|e| e.to_string());
    let built = (|| {
        let program = cstr(&task.program.to_string_lossy())?;
        let mut args = vec![program.clone()];
        for a in &task.args {
            args.push(cstr(a)?);
        }
        let env = task
            .env
            .iter()
            .map(|(k, v)| cstr(&format!("{k}={v}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok::<_, String>((program, args, env))
    })();
    let (program, args, env) = match built {
        Ok(b) => b,
        Err(e) => {
            eprintln!("the script's command line: {e}");
            return 2;
        }
    };
    let e = nix::unistd::execve(&program, &args, &env).unwrap_err();
    eprintln!("cannot run {}: {e}", task.program.display());
    126
}

/// Reads the envelope's line from `input`: its task, or the exit code.
fn read_envelope<T: DeserializeOwned>(
    input: &mut dyn std::io::BufRead,
) -> Result<Envelope<T>, i32> {
    let mut line = String::new();
    if let Err(e) = input.read_line(&mut line) {
        eprintln!("reading the task: {e}");
        return Err(2);
    }
    serde_json::from_str(&line).map_err(|e| {
        eprintln!("reading the task: {e}");
        2
    })
}

/// Reads the envelope, confines this process as it says, ties it to its
/// executor and sizes libtorch's threads: the task, or the exit code.
fn begin<T: DeserializeOwned>(input: &mut dyn std::io::BufRead) -> Result<T, i32> {
    let envelope: Envelope<T> = read_envelope(input)?;
    if let Some(c) = &envelope.confinement {
        if let Err(e) = trainyard_sandbox::enter(c) {
            eprintln!("cannot confine this process: {e}");
            return Err(3);
        }
    }
    exit_with_parent(envelope.parent);
    if let Some(n) = envelope.torch_threads {
        tch::set_num_threads(n);
    }
    Ok(envelope.task)
}

/// The child's side: reads the envelope on stdin, confines itself, runs
/// `work` on the task and prints its answer. Returns the exit code.
pub fn child<T: DeserializeOwned, R: Serialize>(work: impl FnOnce(T) -> R) -> i32 {
    use std::io::Write;
    let task = match begin(&mut std::io::stdin().lock()) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let answer = work(task);
    let mut out = std::io::stdout().lock();
    match serde_json::to_writer(&mut out, &answer) {
        Ok(()) => {
            let _ = out.write_all(b"\n");
            let _ = out.flush();
            0
        }
        Err(e) => {
            eprintln!("writing the answer: {e}");
            4
        }
    }
}

/// The child's side of a conversation: reads the envelope's line on
/// stdin, confines itself, then hands the task, the rest of stdin and
/// stdout to `work`. Returns the exit code.
pub fn session<T: DeserializeOwned>(
    work: impl FnOnce(T, &mut dyn std::io::BufRead, &mut dyn std::io::Write) -> i32,
) -> i32 {
    let mut input = std::io::BufReader::new(std::io::stdin());
    let task = match begin(&mut input) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let mut output = std::io::BufWriter::new(std::io::stdout().lock());
    work(task, &mut input, &mut output)
}

/// Ends this child when its executor is gone. Its stdin's end would tell
/// it, but only once it reads again: a module busy in a forward (or one
/// that never returns) would outlive the executor. The thread starts after
/// the confinement, which it inherits.
fn exit_with_parent(expected: Option<u32>) {
    // Expected, not read: the executor may already be gone by now.
    let parent = expected.unwrap_or_else(std::os::unix::process::parent_id);
    let _ = std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(move || loop {
            if std::os::unix::process::parent_id() != parent {
                eprintln!("the executor is gone");
                // Not exit(): libtorch's static destructors can wait on
                // the very thread that is busy.
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(500));
        });
}
