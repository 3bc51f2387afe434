//! A script job's own Python packages: resolved and installed by uv into
//! an environment layered over the executor's runtime, confined like the
//! script itself, cached by content and shared by every job that asks for
//! the same set.
//!
//! What a job asks for ([`wanted()`], in [`mod@wanted`]): its spec's `script.requirements` (a
//! requirements file or a list of lines), else the code archive's own
//! `requirements.txt`, else the dependencies its `pyproject.toml`
//! declares. Each line names a package of the index, nothing else
//! ([`trainyard_common::spec::script::requirement_problem`]).
//!
//! How it is installed ([`Config::ensure`]), before the rank starts:
//! 1. **Resolve** with `uv pip compile`, preferring the versions the
//!    runtime already has and constrained to the runtime's torch, so torch
//!    is never installed twice and a requirement for another torch fails
//!    naming it.
//! 2. **Key** the environment by the resolved set and the runtime
//!    (SHA-256): the same set is one environment on this executor.
//! 3. **Install** what the runtime lacks (`uv pip install --no-deps`) into
//!    a virtual environment of uv's whose `.pth` puts the runtime's
//!    site-packages after its own: the job's packages win, the runtime's
//!    fill in.
//!
//! Every uv run is a confined child ([`crate::sandbox::Sandbox::start_script`]):
//! Landlock (read the runtime and uv, write only the install's own
//! folder), seccomp, limits, and a network namespace of its own whose only
//! way out is [`super::proxy`], which carries connections to the package
//! index and nothing else. A build step (an sdist's `setup.py`) runs code:
//! it reads no host file, reaches neither the API nor the database, and
//! writes nowhere but its environment. A resolution or build that fails
//! fails the job at once with uv's own message: another try would fail
//! the same way.
//!
//! The cache (`--env-dir`, [`cache`]) is bounded (`--env-cache-mb`) and
//! evicts the least recently used environments that no rank is using. A rank reads
//! its environment; it cannot write it (Landlock), so no job changes
//! another's packages.
//!
//! The parts: [`mod@wanted`] reads what a job asks for, [`uv`] runs uv
//! confined behind the install's proxy, [`cache`] keeps the environments.

mod cache;
mod uv;
mod wanted;

pub use cache::cache_report;
pub use wanted::{
    normalize, pins, to_install, wanted, LinesProblem, PyprojectProblem, RequirementsError, Wanted,
    MAX_LOCK_FILE, MAX_REQUIREMENTS_FILE,
};

use super::proxy::{self, Destination};
use crate::sandbox::Sandbox;
use cache::{cache_changed, in_use};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use trainyard_common::cluster::{PackagesPhase, PackagesStage};
use trainyard_common::spec::script::{requirement_lines, requirement_problem};
use uv::Network;
use wanted::unpinned;

/// The public index.
pub const DEFAULT_INDEX: &str = "https://pypi.org/simple";

/// How this executor installs scripts' packages.
#[derive(Debug, Clone)]
pub struct Config {
    /// The uv binary (`None`: none found; a job that asks for packages
    /// fails, saying so).
    pub uv: Option<PathBuf>,
    /// The package index's URL.
    pub index: String,
    /// Where the index and its files are served from (what the proxy
    /// carries).
    pub allowed: Vec<Destination>,
    /// The environments' folder.
    pub dir: PathBuf,
    /// Most bytes the environments may take.
    pub budget: u64,
}

impl Config {
    /// A configuration: `index` (and its hosts, plus `extra_hosts`), the
    /// environments under `dir` bounded by `budget_mb`, `uv` as given or
    /// found beside `python` or on the `PATH`.
    pub fn new(
        uv: Option<PathBuf>,
        python: &Path,
        index: &str,
        extra_hosts: &[String],
        dir: PathBuf,
        budget_mb: u64,
    ) -> Result<Config, proxy::IndexUrlError> {
        let mut allowed = proxy::index_destinations(index)?;
        for h in extra_hosts {
            allowed.extend(proxy::index_destinations(&format!("https://{h}/"))?);
        }
        let uv = uv.or_else(|| find_uv(python));
        Ok(Config {
            uv,
            index: index.trim_end_matches('/').to_owned(),
            allowed,
            dir,
            budget: budget_mb << 20,
        })
    }
}

/// This executor's configuration, set once at its start ([`configure`]).
static CONFIG: std::sync::OnceLock<Config> = std::sync::OnceLock::new();

/// Sets how this executor installs scripts' packages (once, before any
/// job; later calls change nothing).
pub fn configure(config: Config) {
    let _ = CONFIG.set(config);
}

/// How this executor installs scripts' packages: as [`configure`]d, or
/// from the public index into `python-envs/` in `sandbox`'s folder.
pub fn config(sandbox: &Sandbox) -> &'static Config {
    CONFIG.get_or_init(|| {
        let python = sandbox.python(None).map(Path::to_owned).unwrap_or_default();
        Config::new(
            None,
            &python,
            DEFAULT_INDEX,
            &[],
            sandbox.folder().join("python-envs"),
            20 * 1024,
        )
        .expect("the public index's URL is valid")
    })
}

/// `uv` beside the Python runtime (a virtual environment's), else on the
/// `PATH`.
fn find_uv(python: &Path) -> Option<PathBuf> {
    let beside = python.parent().map(|d| d.join("uv"));
    beside
        .into_iter()
        .chain(
            std::env::var_os("PATH")
                .into_iter()
                .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .map(|d| d.join("uv")),
        )
        .find(|p| p.is_file())
}

/// An environment a rank runs in; counted as in use while held.
#[derive(Debug)]
pub struct Env {
    /// Its interpreter.
    pub python: PathBuf,
    /// Whether it was there already (no install).
    pub cached: bool,
    /// Packages installed over the runtime's.
    pub packages: usize,
    key: String,
}

impl Env {
    /// The environment's key as events show it (a prefix of its SHA-256).
    pub fn key(&self) -> &str {
        &self.key[..self.key.len().min(ENV_KEY_SHOWN)]
    }
}

/// Hex digits of an environment's key that logs and events show.
const ENV_KEY_SHOWN: usize = 12;

impl Drop for Env {
    fn drop(&mut self) {
        if let Ok(mut u) = in_use().lock() {
            if let Some(n) = u.get_mut(&self.key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    u.remove(&self.key);
                    cache_changed();
                }
            }
        }
    }
}

/// Why an environment could not be made.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The job's requirements cannot be installed here (a resolution or
    /// build failure, no uv): another try would fail the same way.
    #[error("{0}")]
    Refused(String),
    /// This executor failed (its disk, its namespaces).
    #[error("{0}")]
    Executor(String),
    /// The role was stopped meanwhile.
    #[error("stopped")]
    Stopped,
}

/// What one install may do and must say, from its role.
pub struct Run<'a> {
    /// The sandbox that confines uv.
    pub sandbox: &'a Sandbox,
    /// The runtime's interpreter.
    pub python: &'a Path,
    /// The runtime's folders (read-only to uv).
    pub runtime: &'a [PathBuf],
    /// A line for the job's log.
    pub log: &'a (dyn Fn(String) + Sync),
    /// A phase for the job's events.
    pub phase: &'a (dyn Fn(PackagesPhase) + Sync),
    /// Whether to give up.
    pub stopping: &'a (dyn Fn() -> bool + Sync),
}

/// What the runtime has: its site-packages folders and installed
/// distributions (normalized name → version), asked of it once.
#[derive(Debug, Clone)]
struct Runtime {
    site: Vec<String>,
    installed: BTreeMap<String, String>,
    id: String,
}

fn runtime_of(python: &Path) -> Result<Runtime, super::runtime::RuntimeError> {
    static KNOWN: Mutex<BTreeMap<PathBuf, Runtime>> = Mutex::new(BTreeMap::new());
    if let Some(r) = KNOWN.lock().ok().and_then(|k| k.get(python).cloned()) {
        return Ok(r);
    }
    let text = super::runtime::ask_python(
        python,
        "import site, sys, importlib.metadata as m\n\
         print(sys.version.split()[0])\n\
         for p in site.getsitepackages(): print('site', p)\n\
         for d in m.distributions():\n\
         \x20   print('dist', d.metadata['Name'], d.version)",
    )?;
    let mut r = Runtime {
        site: Vec::new(),
        installed: BTreeMap::new(),
        id: String::new(),
    };
    let mut lines = text.lines();
    let version = lines.next().unwrap_or_default().to_owned();
    for l in lines {
        if let Some(p) = l.strip_prefix("site ") {
            r.site.push(p.to_owned());
        } else if let Some(d) = l.strip_prefix("dist ") {
            if let Some((name, v)) = d.rsplit_once(' ') {
                r.installed.entry(normalize(name)).or_insert(v.to_owned());
            }
        }
    }
    let real = std::fs::canonicalize(python).unwrap_or_else(|_| python.to_owned());
    let mut h = Sha256::new();
    h.update(format!("{}\n{version}\n", real.display()));
    for (n, v) in &r.installed {
        h.update(format!("{n}=={v}\n"));
    }
    r.id = hex::encode(h.finalize());
    if let Ok(mut k) = KNOWN.lock() {
        k.insert(python.to_owned(), r.clone());
    }
    Ok(r)
}

fn sha(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    hex::encode(h.finalize())
}

/// One lock per key: two ranks of a job on this executor install once.
fn key_lock(key: &str) -> Arc<Mutex<()>> {
    static LOCKS: Mutex<BTreeMap<String, Arc<Mutex<()>>>> = Mutex::new(BTreeMap::new());
    let mut l = LOCKS.lock().unwrap_or_else(|p| p.into_inner());
    if l.len() > 1024 {
        l.retain(|_, m| Arc::strong_count(m) > 1);
    }
    l.entry(key.to_owned()).or_default().clone()
}

impl Config {
    fn envs(&self) -> PathBuf {
        self.dir.join("envs")
    }

    /// The environment for `wanted` over `run`'s runtime: from the cache,
    /// or resolved and installed now (logging the phase and its time).
    pub fn ensure(&self, run: &Run<'_>, wanted: &Wanted) -> Result<Env, InstallError> {
        let runtime = runtime_of(run.python).map_err(|e| InstallError::Executor(e.to_string()))?;
        let input_key = sha(&[
            "v1",
            &runtime.id,
            &self.index,
            wanted.kind(),
            &asked_text(wanted)?,
        ]);
        let lock = key_lock(&input_key);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        for d in ["envs", "inputs", "work"] {
            std::fs::create_dir_all(self.dir.join(d)).map_err(exec)?;
        }
        // What these inputs resolved to last time.
        let input_file = self.dir.join("inputs").join(&input_key);
        if let Ok(key) = std::fs::read_to_string(&input_file) {
            if let Some(env) = self.cached(key.trim()) {
                return Ok(env);
            }
        }
        let started = Instant::now();
        let Some(uv) = self.uv.as_ref() else {
            return Err(InstallError::Refused(
                "the job asks for packages, and this executor has no uv to install them (its admin installs uv, or names it with --uv)".into(),
            ));
        };
        let resolving = format!(
            "resolving {} from {} (uv, confined)",
            wanted.describe(),
            self.index
        );
        (run.log)(format!("packages: {resolving}"));
        (run.phase)(PackagesPhase {
            stage: PackagesStage::Resolving,
            detail: resolving,
            packages: None,
            seconds: None,
            environment: None,
        });
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let work =
            self.dir
                .join("work")
                .join(format!("{}-{}-{n}", &input_key[..16], std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        let _cleanup = RemoveOnDrop(work.clone());
        let input = stage(run, &runtime, wanted, &work)?;
        let net = Network::open(self, run.sandbox)?;
        let uv_run = |args: Vec<String>| self.uv_confined(run, uv, &work, &net, args);
        let resolved = self.resolve(run, &uv_run, wanted, &input, &work)?;
        let pinned: Vec<String> = resolved.iter().map(|(n, v)| format!("{n}=={v}")).collect();
        let key = sha(&["v1", &runtime.id, &pinned.join("\n")]);
        std::fs::write(&input_file, &key).map_err(exec)?;
        if let Some(env) = self.cached(&key) {
            (run.log)(format!(
                "packages: resolved in {:.1} s to an environment this executor has",
                started.elapsed().as_secs_f64()
            ));
            return Ok(env);
        }
        let install = to_install(&resolved, &runtime.installed);
        // A phase of this environment's install: to the log and the events.
        let announce = |stage: PackagesStage, detail: String| {
            (run.log)(format!("packages: {detail}"));
            (run.phase)(PackagesPhase {
                stage,
                detail,
                packages: Some(u32::try_from(install.len()).unwrap_or(u32::MAX)),
                seconds: Some(started.elapsed().as_secs_f64()),
                environment: Some(key[..ENV_KEY_SHOWN].to_owned()),
            });
        };
        let env_dir = self.build(run, &uv_run, &runtime, &install, &work, &announce)?;
        drop(net);
        std::fs::write(env_dir.join(".trainyard-ready"), pinned.join("\n")).map_err(exec)?;
        let target = self.envs().join(&key);
        if std::fs::rename(&env_dir, &target).is_err() && !target.join(".trainyard-ready").exists()
        {
            return Err(InstallError::Executor(format!(
                "cannot keep the environment in {}",
                target.display()
            )));
        }
        let ready = format!(
            "environment {} ready in {:.1} s ({} installed over the runtime)",
            &key[..ENV_KEY_SHOWN],
            started.elapsed().as_secs_f64(),
            install.len()
        );
        announce(PackagesStage::Ready, ready);
        let mut env = self.cached(&key).ok_or_else(|| {
            InstallError::Executor("the environment vanished as it was made".into())
        })?;
        self.evict(&key);
        cache_changed();
        env.cached = false;
        env.packages = install.len();
        Ok(env)
    }

    /// The pins `wanted` resolves to over the runtime (whose versions are
    /// the resolver's preferences and whose torch is a constraint), from
    /// the staged `input` in `work`: a lock's own set, else uv's
    /// resolution from the index.
    fn resolve(
        &self,
        run: &Run<'_>,
        uv_run: &dyn Fn(Vec<String>) -> Result<(), InstallError>,
        wanted: &Wanted,
        input: &Path,
        work: &Path,
    ) -> Result<Vec<(String, String)>, InstallError> {
        if let Wanted::Locked { .. } = wanted {
            // The lock's own set, for this platform's markers to pick from;
            // offline: it names every version already.
            uv_run(args(&[
                "export",
                "--frozen",
                "--offline",
                "--no-hashes",
                "--no-emit-project",
                "--no-header",
                "--project",
                "project",
                "--output-file",
                "exported.txt",
            ]))?;
            let text = std::fs::read_to_string(work.join("exported.txt")).map_err(exec)?;
            let lines = requirement_lines(&text);
            for l in &lines {
                if let Some(why) = requirement_problem(l) {
                    return Err(InstallError::Refused(format!(
                        "uv.lock in script.code: {l:?} {why}"
                    )));
                }
            }
            std::fs::write(input, lines.join("\n") + "\n").map_err(exec)?;
        }
        let mut compile = args(&["pip", "compile"]);
        compile.push(input.display().to_string());
        compile.extend(args(&[
            "--constraint",
            "constraints.txt",
            "--output-file",
            "resolved.txt",
            "--python",
        ]));
        compile.push(run.python.display().to_string());
        compile.push("--index-url".into());
        compile.push(self.index.clone());
        // Sources are refused when the project is read (`Pyproject`); uv
        // ignores any it would still find. (Not on `export`: a frozen lock
        // is read as it is, and its lines are checked.)
        compile.extend(args(&["--no-sources", "--no-header", "--no-annotate"]));
        uv_run(compile)?;
        let text = std::fs::read_to_string(work.join("resolved.txt")).map_err(exec)?;
        if let Some(l) = unpinned(&text) {
            return Err(InstallError::Refused(format!(
                "the resolved set has {l:?}, which is not a package of the index at a version (direct references, file: and VCS URLs are not taken)"
            )));
        }
        Ok(pins(&text))
    }

    /// A virtual environment in `work/env` over the runtime, with
    /// `install` (what of the resolved set the runtime lacks) installed
    /// from the index; its folder.
    fn build(
        &self,
        run: &Run<'_>,
        uv_run: &dyn Fn(Vec<String>) -> Result<(), InstallError>,
        runtime: &Runtime,
        install: &[(String, String)],
        work: &Path,
        announce: &dyn Fn(PackagesStage, String),
    ) -> Result<PathBuf, InstallError> {
        let env_dir = work.join("env");
        let mut venv = args(&["venv", "--relocatable", "--quiet", "--python"]);
        venv.push(run.python.display().to_string());
        venv.push(env_dir.display().to_string());
        uv_run(venv)?;
        // The runtime's packages after the environment's own.
        let site =
            env_site_packages(&env_dir).map_err(|e| InstallError::Executor(e.to_string()))?;
        std::fs::write(
            site.join("_trainyard_runtime.pth"),
            runtime.site.join("\n") + "\n",
        )
        .map_err(exec)?;
        if install.is_empty() {
            return Ok(env_dir);
        }
        let listed: Vec<String> = install.iter().map(|(n, v)| format!("{n}=={v}")).collect();
        announce(
            PackagesStage::Installing,
            format!(
                "installing {} over the runtime: {}",
                install.len(),
                listed.join(", ")
            ),
        );
        std::fs::write(work.join("install.txt"), listed.join("\n") + "\n").map_err(exec)?;
        let mut pip = args(&["pip", "install", "--python"]);
        pip.push(env_dir.join("bin/python").display().to_string());
        pip.extend(args(&[
            "--requirement",
            "install.txt",
            "--no-deps",
            "--no-sources",
            "--index-url",
        ]));
        pip.push(self.index.clone());
        uv_run(pip)?;
        Ok(env_dir)
    }
}

/// This executor's failure to keep its environments (its disk).
fn exec(e: std::io::Error) -> InstallError {
    InstallError::Executor(format!("python environments: {e}"))
}

/// Owned command-line arguments.
fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

/// What the job asked, as text (its lines, or its project and lock
/// files): with the runtime and the index, what names its resolution.
fn asked_text(wanted: &Wanted) -> Result<String, InstallError> {
    Ok(match wanted {
        Wanted::Lines(l) => l.join("\n"),
        Wanted::Pyproject(p) => std::fs::read_to_string(p).map_err(exec)?,
        Wanted::Locked { pyproject, lock } => {
            std::fs::read_to_string(pyproject).map_err(exec)?
                + "\n\0\n"
                + &std::fs::read_to_string(lock).map_err(exec)?
        }
    })
}

/// `work` made for uv (its home, temporary folder and cache, the sandbox
/// user's), with what `wanted` gives it to resolve and the runtime's
/// preferences and constraints; the input uv compiles.
fn stage(
    run: &Run<'_>,
    runtime: &Runtime,
    wanted: &Wanted,
    work: &Path,
) -> Result<PathBuf, InstallError> {
    for d in ["home", "tmp", "cache"] {
        std::fs::create_dir_all(work.join(d)).map_err(exec)?;
    }
    let input = match wanted {
        Wanted::Lines(l) => {
            let p = work.join("requirements.in");
            std::fs::write(&p, l.join("\n") + "\n").map_err(exec)?;
            p
        }
        Wanted::Pyproject(p) => {
            let dir = work.join("project");
            std::fs::create_dir_all(&dir).map_err(exec)?;
            let to = dir.join("pyproject.toml");
            std::fs::copy(p, &to).map_err(exec)?;
            to
        }
        Wanted::Locked { pyproject, lock } => {
            // Exported by `resolve`, once uv can run confined.
            let dir = work.join("project");
            std::fs::create_dir_all(&dir).map_err(exec)?;
            std::fs::copy(pyproject, dir.join("pyproject.toml")).map_err(exec)?;
            std::fs::copy(lock, dir.join("uv.lock")).map_err(exec)?;
            work.join("requirements.in")
        }
    };
    // The runtime's versions are the resolver's preferences (uv reads an
    // existing output file as such); its torch is a constraint.
    let preferred: String = runtime
        .installed
        .iter()
        .map(|(n, v)| format!("{n}=={v}\n"))
        .collect();
    std::fs::write(work.join("resolved.txt"), preferred).map_err(exec)?;
    let constraints = runtime
        .installed
        .get("torch")
        .map(|v| format!("torch=={v}\n"))
        .unwrap_or_default();
    std::fs::write(work.join("constraints.txt"), constraints).map_err(exec)?;
    for d in [
        work.to_owned(),
        work.join("home"),
        work.join("tmp"),
        work.join("cache"),
    ] {
        run.sandbox
            .give(&d)
            .map_err(|e| InstallError::Executor(e.to_string()))?;
    }
    Ok(input)
}

/// The site-packages folder of the virtual environment at `env`.
fn env_site_packages(env: &Path) -> Result<PathBuf, std::io::Error> {
    let lib = env.join("lib");
    let in_lib =
        |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", lib.display()));
    std::fs::read_dir(&lib)
        .map_err(in_lib)?
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no site-packages in {}", lib.display()),
            )
        })
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
