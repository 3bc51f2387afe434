//! The host's C++ toolchain, as a script rank sees it: `torch.compile`'s
//! inductor writes C++ for the CPU and builds it with the compiler on the
//! `PATH`, against the compiler's, the system's and Python's headers. The
//! sandbox lets a rank read and run exactly these (never write them); the
//! kernels it builds land in the rank's scratch (`TORCHINDUCTOR_CACHE_DIR`)
//! and are loaded from there. A host without a compiler gets a job failure
//! that says so ([`wanted_by`]), not inductor's traceback.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Where a rank looks for programs (its `PATH`).
const BIN: [&str; 3] = ["/usr/local/bin", "/usr/bin", "/bin"];
/// The programs a C++ build runs (the drivers, the assembler, the
/// linker) and what inductor runs beside them (`openssl sha512` hashes its
/// precompiled headers; AOTInductor's `objcopy`).
const PROGRAMS: [&str; 9] = [
    "c++", "g++", "gcc", "cc", "cpp", "as", "ld", "openssl", "objcopy",
];

/// The toolchain's files and folders (empty: no C++ compiler on this
/// host), found once.
pub fn folders() -> &'static [PathBuf] {
    static FOUND: OnceLock<Vec<PathBuf>> = OnceLock::new();
    FOUND.get_or_init(find)
}

/// Whether a script's last lines show it wanted a C++ compiler (inductor
/// looked for one and failed).
pub fn wanted_by(lines: &[String]) -> bool {
    lines.iter().any(|l| {
        l.contains("InvalidCxxCompiler")
            || l.contains("get_compiler_version_info")
            || (l.contains("torch._inductor") && l.to_lowercase().contains("compiler"))
    })
}

fn on_path(name: &str) -> Option<PathBuf> {
    BIN.iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

fn find() -> Vec<PathBuf> {
    let Some(compiler) = on_path("c++").or_else(|| on_path("g++")) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = Vec::new();
    for name in PROGRAMS {
        if let Some(p) = on_path(name) {
            if let Ok(real) = std::fs::canonicalize(&p) {
                out.push(real);
            }
            out.push(p);
        }
    }
    // Its header search path, as it prints it.
    let preprocess = Command::new(&compiler)
        .args(["-xc++", "-E", "-v", "-"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output();
    if let Ok(o) = preprocess {
        out.extend(include_dirs(&String::from_utf8_lossy(&o.stderr)));
    }
    // Its own programs (cc1plus, collect2) and libraries.
    if let Ok(o) = Command::new(&compiler).arg("-print-search-dirs").output() {
        out.extend(search_dirs(&String::from_utf8_lossy(&o.stdout)));
    }
    let mut found: Vec<PathBuf> = out
        .into_iter()
        .filter(|p| p.exists() && p != Path::new("/") && p != Path::new("/usr"))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The folders between `#include <...> search starts here:` and `End of
/// search list.` in a compiler's `-v` output.
fn include_dirs(verbose: &str) -> Vec<PathBuf> {
    verbose
        .lines()
        .skip_while(|l| !l.starts_with("#include <...>"))
        .skip(1)
        .take_while(|l| !l.starts_with("End of search list"))
        .filter_map(|l| std::fs::canonicalize(l.trim()).ok())
        .collect()
}

/// The `install:` and `programs:` folders of `-print-search-dirs`.
fn search_dirs(printed: &str) -> Vec<PathBuf> {
    printed
        .lines()
        .filter_map(|l| {
            l.strip_prefix("install: ")
                .or_else(|| l.strip_prefix("programs: ="))
        })
        .flat_map(|l| l.split(':'))
        .filter_map(|d| std::fs::canonicalize(d.trim()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compilers_verbose_output_names_its_include_folders() {
        let printed = "ignoring nonexistent directory \"/nope\"\n#include \"...\" search starts here:\n#include <...> search starts here:\n /usr/include\n /tmp\nEnd of search list.\n /etc\n";
        assert_eq!(
            include_dirs(printed),
            vec![PathBuf::from("/usr/include"), PathBuf::from("/tmp")]
                .into_iter()
                .filter_map(|p| std::fs::canonicalize(p).ok())
                .collect::<Vec<_>>()
        );
        let dirs =
            search_dirs("install: /usr/lib/\nprograms: =/usr/bin:/nope/x\nlibraries: =/etc\n");
        assert_eq!(
            dirs,
            vec![PathBuf::from("/usr/lib"), PathBuf::from("/usr/bin")]
        );
    }

    #[test]
    fn inductors_failures_to_find_a_compiler_are_recognised() {
        let lines = |s: &str| s.lines().map(str::to_owned).collect::<Vec<_>>();
        assert!(wanted_by(&lines(
            "  File \".../cpp_builder.py\", line 330, in get_compiler_version_info\nFileNotFoundError"
        )));
        assert!(wanted_by(&lines(
            "torch._inductor.exc.InductorError: InvalidCxxCompiler: No working C++ compiler found"
        )));
        assert!(!wanted_by(&lines("ValueError: bad shape\nexit 1")));
    }

    #[test]
    fn this_host_has_a_compiler_and_its_headers() {
        // The test machine has g++ (inductor's default); where it is, the
        // toolchain names the driver and the C++ standard headers.
        if on_path("g++").is_none() {
            return;
        }
        let f = folders();
        assert!(f.iter().any(|p| p.ends_with("g++")), "{f:?}");
        assert!(f.iter().any(|p| p.starts_with("/usr/include")), "{f:?}");
    }
}
