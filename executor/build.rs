//! Link flags for libtorch.
//!
//! tch's own flags let the linker drop `libtorch_cuda` because no symbol of
//! it is referenced directly; without it CUDA is never registered and a GPU
//! machine trains on CPU. `--no-as-needed` keeps it (and `libtorch_cpu`)
//! linked. An rpath to the libtorch folder lets the binary start without
//! `LD_LIBRARY_PATH` on the machine that built it.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_LIB_DIR");
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    let Some(lib) = libtorch_lib_dir() else {
        println!("cargo:warning=libtorch folder not found; relying on tch's defaults");
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-ltorch_cuda");
    }
    println!("cargo:rustc-link-arg=-ltorch_cpu");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
}

fn libtorch_lib_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("LIBTORCH_LIB_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Ok(dir) = std::env::var("LIBTORCH") {
        return Some(PathBuf::from(dir).join("lib"));
    }
    if std::env::var_os("LIBTORCH_USE_PYTORCH").is_some() {
        let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python3".into());
        let out = std::process::Command::new(python)
            .args([
                "-c",
                "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))",
            ])
            .output()
            .ok()?;
        if out.status.success() {
            return Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        }
    }
    None
}
