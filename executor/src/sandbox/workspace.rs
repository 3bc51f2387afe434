//! A child's folders ([`Workspace`]): `inputs/`, which the executor fills
//! and the child only reads, and `scratch/`, the child's own.

use super::SandboxError;
use std::path::{Path, PathBuf};

/// One child's folders: `inputs/` (read-only to it) and `scratch/`.
pub struct Workspace {
    pub(super) dir: PathBuf,
    /// A job's (removed with the job, not when dropped).
    pub(super) keep: bool,
}

impl Workspace {
    /// Its inputs folder.
    pub fn inputs(&self) -> PathBuf {
        self.dir.join("inputs")
    }

    /// Its scratch folder.
    pub fn scratch(&self) -> PathBuf {
        self.dir.join("scratch")
    }

    /// Puts a copy of `src` (a hard link where the file system allows)
    /// into its inputs as `name`; the path the child reads it at.
    pub fn input(&self, name: &str, src: &Path) -> Result<PathBuf, SandboxError> {
        let dst = self.inputs().join(name);
        if std::fs::hard_link(src, &dst).is_err() {
            std::fs::copy(src, &dst).map_err(SandboxError::io(format!(
                "copying {} into the sandbox",
                src.display()
            )))?;
        }
        Ok(dst)
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
