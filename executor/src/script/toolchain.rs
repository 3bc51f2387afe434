//! The host's C++ toolchain, as a script rank sees it: `torch.compile`'s
//! inductor writes C++ for the CPU and builds it with the compiler on the
//! `PATH`, against the compiler's, the system's and Python's headers. The
//! sandbox lets a rank read and run exactly these (never write them); the
//! kernels it builds land in the rank's scratch (`TORCHINDUCTOR_CACHE_DIR`)
//! and are loaded from there. A host without a compiler, or an executor
//! whose admin withheld it (`--script-compiler off`, [`withhold`]: a
//! compiler is code a script may run), gets a job failure that says so
//! ([`wanted_by`], [`missing`]), not inductor's traceback. Withholding is
//! not a confinement layer: a rank may still run what it writes in its
//! scratch or installs as a package, as confined as itself.

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

static FOUND: OnceLock<Vec<PathBuf>> = OnceLock::new();
static WITHHELD: OnceLock<bool> = OnceLock::new();

/// The toolchain's files and folders (empty: no C++ compiler on this
/// host, or withheld), found once.
pub fn folders() -> &'static [PathBuf] {
    FOUND.get_or_init(find)
}

/// Scripts on this executor see no compiler, whatever the host has; called
/// once at start, before any script runs.
pub fn withhold() {
    let _ = WITHHELD.set(true);
    let _ = FOUND.set(Vec::new());
}

/// Why a script that wanted a compiler found none, for its job's failure.
pub fn missing() -> &'static str {
    if WITHHELD.get().copied().unwrap_or(false) {
        "torch.compile needs a C++ compiler on the executor, and this one offers none to scripts (its admin started it with --script-compiler off)"
    } else {
        "torch.compile needs a C++ compiler on the executor, and this one has none (no c++ or g++ on its PATH)"
    }
}

/// Whether a script's last lines show it wanted a C++ compiler (inductor
/// looked for one and failed).
///
/// Inductor 2.11 searches with `cpp_compiler_search` (`c++ --version`):
/// a compiler that is not there ends in `FileNotFoundError: 'g++'`, one
/// the sandbox withholds in `PermissionError: 'g++'`, either inside an
/// `InductorError`.
pub fn wanted_by(lines: &[String]) -> bool {
    const SEARCH: [&str; 4] = [
        "InvalidCxxCompiler",
        "get_compiler_version_info",
        "cpp_compiler_search",
        "get_cpp_compiler",
    ];
    lines.iter().any(|l| {
        SEARCH.iter().any(|s| l.contains(s))
            || (l.contains("InductorError")
                && ["'g++'", "'c++'", "'clang++'"]
                    .iter()
                    .any(|c| l.contains(c)))
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
        // What inductor 2.11 prints where g++ is withheld (and, with
        // FileNotFoundError, where there is none).
        assert!(wanted_by(&lines(
            "[rank1]:   File \".../torch/_inductor/cpp_builder.py\", line 101, in cpp_compiler_search"
        )));
        assert!(wanted_by(&lines(
            "[rank1]: torch._inductor.exc.InductorError: PermissionError: [Errno 13] Permission denied: 'g++'"
        )));
        assert!(wanted_by(&lines(
            "torch._inductor.exc.InductorError: FileNotFoundError: [Errno 2] No such file or directory: 'c++'"
        )));
        assert!(!wanted_by(&lines("ValueError: bad shape\nexit 1")));
        assert!(!wanted_by(&lines(
            "torch._inductor.exc.InductorError: RuntimeError: shapes do not match"
        )));
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
