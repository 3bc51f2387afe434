//! Link flags for libtorch, as `trainyard-confined`'s build script found
//! them (its `links` metadata): the executor's binary trains the built-in
//! models with libtorch itself, and must keep `libtorch_cuda` linked and
//! find the library without `LD_LIBRARY_PATH` just as the confined child.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TRAINYARD_TORCH_LINK_ARGS");
    if let Ok(args) = std::env::var("DEP_TRAINYARD_TORCH_LINK_ARGS") {
        for a in args.split('\t').filter(|a| !a.is_empty()) {
            println!("cargo:rustc-link-arg={a}");
        }
    }
}
