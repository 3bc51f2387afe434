//! Link flags for libtorch.
//!
//! tch's own flags let the linker drop `libtorch_cuda` because no symbol of
//! it is referenced directly; without it CUDA is never registered and a GPU
//! machine trains on CPU. `--no-as-needed` keeps it (and `libtorch_cpu`)
//! linked. An rpath to the libtorch folder lets the binary start without
//! `LD_LIBRARY_PATH` on the machine that built it.
//!
//! The same flags go to the executor's build script (this crate's
//! `links` metadata, `DEP_TRAINYARD_TORCH_LINK_ARGS`), whose binary links
//! libtorch too.
//!
//! It also compiles `csrc/module.cpp` against the same libtorch headers:
//! the TorchScript calls tch does not wrap (buffers, train/eval, the
//! forward's schema, saving a trained module).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_LIB_DIR");
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    let Some(lib) = libtorch_lib_dir() else {
        println!("cargo:warning=libtorch folder not found; relying on tch's defaults");
        return;
    };
    compile_shim(&lib);
    let mut args = vec![
        format!("-Wl,-rpath,{}", lib.display()),
        "-Wl,--no-as-needed".to_owned(),
    ];
    if lib.join("libtorch_cuda.so").exists() {
        args.push("-ltorch_cuda".into());
    }
    args.extend(["-ltorch_cpu".into(), "-Wl,--as-needed".into()]);
    for a in &args {
        println!("cargo:rustc-link-arg={a}");
    }
    // Folder names with spaces are not expected of libtorch; a tab keeps
    // them apart all the same.
    println!("cargo:link_args={}", args.join("\t"));
}

/// Builds `csrc/module.cpp` with the flags torch-sys builds its own C++
/// with (C++17, libtorch's C++ ABI, its two include folders).
fn compile_shim(lib: &std::path::Path) {
    println!("cargo:rerun-if-changed=csrc/module.cpp");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let include = lib.parent().map(|p| p.join("include")).unwrap_or_default();
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .file("csrc/module.cpp")
        .compile("trainyard_module");
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
