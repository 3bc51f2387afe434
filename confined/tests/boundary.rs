//! The trust boundary holds in what is built, not only in what is
//! written: the code that runs confined reaches no network client, object
//! store, data plane, database or API.
//!
//! Two checks, one on the dependency graph and one on the binary:
//! - the lockfile's graph from `trainyard-confined` (workspace crates by
//!   their manifests' non-optional dependencies, since a feature another
//!   crate turns on is not this crate's) reaches none of the platform's
//!   networked crates;
//! - the built `trainyard-confined` defines no function of those crates:
//!   what the linker kept is what a module that escaped libtorch could
//!   call.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Crates whose code must not be on the confined side.
const FORBIDDEN: &[&str] = &[
    "trainyard-client",
    "trainyard-store",
    "trainyard-dataplane",
    "trainyard-executor",
    "trainyard-api",
    "trainyard-scheduler",
    "trainyard-cli",
    "reqwest",
    "hyper",
    "h2",
    "sqlx",
    "sqlx-core",
    "sqlx-postgres",
    "object_store",
    "axum",
    "tokio",
    "rustls",
];

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Each package of `Cargo.lock` and the names of its dependencies.
fn lock_graph() -> BTreeMap<String, BTreeSet<String>> {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).expect("Cargo.lock");
    let mut graph = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let mut name = None;
        let mut deps = BTreeSet::new();
        let mut in_deps = false;
        for line in block.lines() {
            let line = line.trim();
            if let Some(n) = line.strip_prefix("name = ") {
                name = Some(n.trim_matches('"').to_owned());
            } else if line.starts_with("dependencies = [") {
                in_deps = true;
            } else if in_deps && line.starts_with(']') {
                in_deps = false;
            } else if in_deps {
                // `"name"` or `"name version"` (several versions locked).
                let d = line.trim_end_matches(',').trim_matches('"');
                deps.insert(d.split(' ').next().unwrap_or(d).to_owned());
            }
        }
        if let Some(n) = name {
            graph.entry(n).or_insert_with(BTreeSet::new).extend(deps);
        }
    }
    graph
}

/// The non-optional `[dependencies]` of the workspace crate in `dir`.
fn manifest_deps(dir: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).expect("a manifest");
    let mut deps = BTreeSet::new();
    let mut in_deps = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if !in_deps || line.is_empty() || line.starts_with('#') || line.contains("optional = true")
        {
            continue;
        }
        if let Some((name, _)) = line.split_once(['=', '.']) {
            deps.insert(name.trim().to_owned());
        }
    }
    deps
}

/// The workspace's crates by package name, with their folders.
fn workspace_crates() -> BTreeMap<String, std::path::PathBuf> {
    let mut crates = BTreeMap::new();
    for entry in walk(root()) {
        let text = std::fs::read_to_string(&entry).unwrap_or_default();
        if let Some(name) = text
            .lines()
            .skip_while(|l| l.trim() != "[package]")
            .find_map(|l| l.trim().strip_prefix("name = "))
        {
            crates.insert(
                name.trim_matches('"').to_owned(),
                entry.parent().unwrap().to_owned(),
            );
        }
    }
    crates
}

/// Every `Cargo.toml` two folders deep at most (the workspace's layout).
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for depth1 in std::fs::read_dir(dir).unwrap().flatten() {
        let p = depth1.path();
        if !p.is_dir()
            || p.ends_with("target")
            || p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            continue;
        }
        found.push(p.join("Cargo.toml"));
        for depth2 in std::fs::read_dir(&p).into_iter().flatten().flatten() {
            found.push(depth2.path().join("Cargo.toml"));
        }
    }
    found.retain(|p| p.is_file());
    found
}

#[test]
fn the_confined_crate_reaches_no_networked_crate() {
    let lock = lock_graph();
    let members = workspace_crates();
    assert!(members.contains_key("trainyard-confined"), "{members:?}");
    let mut seen = BTreeSet::new();
    let mut path_to: BTreeMap<String, String> = BTreeMap::new();
    let mut todo = vec!["trainyard-confined".to_owned()];
    while let Some(c) = todo.pop() {
        if !seen.insert(c.clone()) {
            continue;
        }
        let deps = match members.get(&c) {
            Some(dir) => manifest_deps(dir),
            None => lock.get(&c).cloned().unwrap_or_default(),
        };
        for d in deps {
            path_to.entry(d.clone()).or_insert_with(|| c.clone());
            todo.push(d);
        }
    }
    assert!(
        seen.contains("tch") && seen.contains("trainyard-sandbox"),
        "{seen:?}"
    );
    let reached: Vec<String> = FORBIDDEN
        .iter()
        .filter(|f| seen.contains(**f))
        .map(|f| format!("{f} (through {})", path_to[*f]))
        .collect();
    assert!(reached.is_empty(), "trainyard-confined reaches {reached:?}");
}

#[test]
fn the_confined_binary_defines_no_function_of_a_networked_crate() {
    let binary = env!("CARGO_BIN_EXE_trainyard-confined");
    let out = std::process::Command::new("nm")
        .args(["--defined-only", "--demangle"])
        .arg(binary)
        .output()
        .expect("nm (binutils) reads the binary's symbols");
    assert!(
        out.status.success(),
        "nm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let symbols = String::from_utf8_lossy(&out.stdout);
    assert!(
        symbols.contains("trainyard_confined::enter::"),
        "the binary's own functions are listed"
    );
    let found: Vec<&str> = FORBIDDEN
        .iter()
        .map(|f| f.replace('-', "_"))
        .filter_map(|f| {
            symbols
                .lines()
                .find(|l| l.contains(&format!(" {f}::")) || l.contains(&format!("<{f}::")))
        })
        .collect();
    assert!(found.is_empty(), "the binary has {found:?}");
}

#[test]
fn started_without_a_kind_it_says_who_starts_it() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard-confined"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("started by an executor"), "{err}");
}
