//! The admin's Python runtime, asked (unconfined: it is the admin's) what
//! it is: the folders its interpreter reads, which a confined rank or
//! install may read too ([`runtime_folders`]), and what it prints
//! ([`ask_python`]: its site folders and installed distributions, for the
//! job's own packages).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The folders the interpreter at `python` reads: its own file, its
/// prefix and every folder on its module search path (asked of it,
/// unconfined: the runtime is the admin's).
pub fn runtime_folders(python: &Path) -> Result<Vec<PathBuf>, RuntimeError> {
    static KNOWN: Mutex<Vec<(PathBuf, Vec<PathBuf>)>> = Mutex::new(Vec::new());
    if let Some((_, f)) = KNOWN
        .lock()
        .ok()
        .and_then(|k| k.iter().find(|(p, _)| p == python).cloned())
    {
        return Ok(f);
    }
    let out = ask_python(
        python,
        "import sys, os, sysconfig; i = sysconfig.get_paths(); print('\\n'.join([os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, i['include'], i['platinclude']] + [p for p in sys.path if p]))",
    )?;
    let mut folders: Vec<PathBuf> = vec![python.to_owned()];
    for line in out.lines() {
        let p = PathBuf::from(line.trim());
        // The base prefix of a system Python is `/usr`: its library
        // folder is the runtime's, not the whole of `/usr`.
        if p.is_absolute() && p.exists() && p != Path::new("/usr") && p != Path::new("/") {
            folders.push(p);
        }
    }
    // A virtual environment's prefix is its own folder (its config file).
    folders.sort();
    folders.dedup();
    if let Ok(mut k) = KNOWN.lock() {
        k.push((python.to_owned(), folders.clone()));
    }
    Ok(folders)
}

/// Why the admin's Python runtime could not be asked what it has.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// It could not be run at all.
    #[error("cannot run the Python runtime {}: {source}", .python.display())]
    Spawn {
        /// The interpreter.
        python: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It ran and failed.
    #[error("the Python runtime {} does not start: {stderr}", .python.display())]
    Failed {
        /// The interpreter.
        python: PathBuf,
        /// What it wrote on stderr.
        stderr: String,
    },
}

/// What the interpreter at `python` prints running `code` isolated (`-I`,
/// no environment): the admin's runtime, asked unconfined.
pub fn ask_python(python: &Path, code: &str) -> Result<String, RuntimeError> {
    let out = std::process::Command::new(python)
        .args(["-I", "-c", code])
        .env_clear()
        .output()
        .map_err(|source| RuntimeError::Spawn {
            python: python.to_owned(),
            source,
        })?;
    if !out.status.success() {
        return Err(RuntimeError::Failed {
            python: python.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
