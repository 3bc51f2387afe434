//! uv, run confined: each run a sandboxed child (Landlock, seccomp,
//! limits) in the install's own network namespace, whose only way out is
//! [`super::super::proxy`] to the package index; its output goes to the
//! job's log and its failure names what the proxy refused.

use super::super::proxy::Proxy;
use super::{Config, InstallError, Run};
use crate::sandbox::{Sandbox, Workspace};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use trainyard_confined::protocol::ScriptTask;
use trainyard_sandbox::{Ending, Limits};

/// The proxy's port on the install namespace's loopback.
const PROXY_PORT: u16 = 998;
/// Longest one uv run may take.
const UV_LIMIT: Duration = Duration::from_secs(30 * 60);
/// Memory of one uv run (and the builds it starts), MiB.
const UV_MEMORY_MB: u64 = 4096;
/// Lines of uv's output a failure quotes.
const TAIL: usize = 25;

impl Config {
    /// Runs uv confined with `args` in `work`; its output goes to the log,
    /// its failure (uv's own message, and any destination the proxy
    /// refused) fails the install.
    pub(super) fn uv_confined(
        &self,
        run: &Run<'_>,
        uv: &Path,
        work: &Path,
        net: &Network,
        args: Vec<String>,
    ) -> Result<(), InstallError> {
        let d = |p: &Path| p.display().to_string();
        let mut env: Vec<(String, String)> = vec![
            ("HOME".into(), d(&work.join("home"))),
            ("TMPDIR".into(), d(&work.join("tmp"))),
            ("UV_CACHE_DIR".into(), d(&work.join("cache"))),
            ("UV_NO_CONFIG".into(), "1".into()),
            ("UV_PYTHON_DOWNLOADS".into(), "never".into()),
            ("UV_NO_PROGRESS".into(), "1".into()),
            ("UV_SYSTEM_CERTS".into(), "1".into()),
            ("UV_LINK_MODE".into(), "copy".into()),
            ("UV_HTTP_TIMEOUT".into(), "120".into()),
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
            ("NO_PROXY".into(), String::new()),
        ];
        if let Some(proxy) = &net.proxy_url {
            for k in ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"] {
                env.push((k.into(), proxy.clone()));
            }
        }
        for k in ["SSL_CERT_FILE", "SSL_CERT_DIR", "LD_LIBRARY_PATH"] {
            if let Ok(v) = std::env::var(k) {
                env.push((k.into(), v));
            }
        }
        let task = ScriptTask {
            program: uv.to_owned(),
            args,
            env,
            cwd: work.to_owned(),
        };
        let mut read_only: Vec<PathBuf> = run.runtime.to_vec();
        read_only.push(uv.to_owned());
        read_only.extend(
            [
                "/etc/ssl",
                "/etc/ca-certificates",
                "/usr/share/ca-certificates",
                "/usr/local/share/ca-certificates",
                "/etc/pki",
            ]
            .iter()
            .map(PathBuf::from)
            .filter(|p| p.exists()),
        );
        read_only.extend(super::super::toolchain::folders().iter().cloned());
        if let Ok(v) = std::env::var("SSL_CERT_FILE") {
            read_only.push(PathBuf::from(v));
        }
        let limits = Limits {
            memory_mb: UV_MEMORY_MB,
            ..Limits::default()
        };
        let ws: &Workspace = &net.ws;
        let mut child = run
            .sandbox
            .start_script(
                ws,
                &task,
                limits,
                read_only,
                vec![work.to_owned()],
                tch::Device::Cpu,
                net.netns.as_ref().map(|n| n.path().to_owned()),
            )
            .map_err(|e| InstallError::Executor(e.to_string()))?;
        let (ending, lines) = wait_with_output(&mut child, run.stopping);
        for l in lines.iter().take(50) {
            (run.log)(format!("packages: {l}"));
        }
        if ending == Ending::Exited(0) {
            return Ok(());
        }
        if ending == Ending::Killed || (run.stopping)() {
            return Err(InstallError::Stopped);
        }
        let refused = net.proxy.as_ref().map(Proxy::refused).unwrap_or_default();
        let mut why = format!("installing the script's packages failed: uv {ending}");
        if !refused.is_empty() {
            why.push_str(&format!(
                "; it tried to reach {}, which is not the package index (refused)",
                refused
                    .iter()
                    .map(|(h, p)| format!("{h}:{p}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let start = lines.len().saturating_sub(TAIL);
        Err(InstallError::Refused(format!(
            "{why}; its last lines:\n{}",
            lines[start..].join("\n")
        )))
    }
}

/// Waits (at most [`UV_LIMIT`], or until `stopping`) for `child` to end
/// while reading its stdout and stderr; how it ended, and the last 200
/// lines it wrote (each cut at the log's longest line).
fn wait_with_output(
    child: &mut trainyard_sandbox::spawn::Child,
    stopping: &(dyn Fn() -> bool + Sync),
) -> (Ending, Vec<String>) {
    let tail: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut readers = Vec::new();
    for stream in [
        child.stdout().map(|o| Box::new(o) as Box<dyn Read + Send>),
        child.stderr().map(|e| Box::new(e) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tail = tail.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let line: String = line.chars().take(super::super::MAX_LINE_CHARS).collect();
                if let Ok(mut t) = tail.lock() {
                    t.push(line);
                    let over = t.len().saturating_sub(200);
                    t.drain(..over);
                }
            }
        }));
    }
    let ending = child.wait(Some(UV_LIMIT), stopping);
    for r in readers {
        let _ = r.join();
    }
    let lines = tail.lock().map(|t| t.clone()).unwrap_or_default();
    (ending, lines)
}

/// The network of one install: with the sandbox on, a namespace of its
/// own whose only way out is the proxy to the index.
pub(super) struct Network {
    ws: Workspace,
    netns: Option<trainyard_sandbox::netns::Netns>,
    proxy: Option<Proxy>,
    proxy_url: Option<String>,
}

impl Network {
    pub(super) fn open(config: &Config, sandbox: &Sandbox) -> Result<Network, InstallError> {
        let ws = sandbox
            .workspace("packages")
            .map_err(|e| InstallError::Executor(e.to_string()))?;
        if sandbox.mode() == crate::sandbox::Mode::Off {
            return Ok(Network {
                ws,
                netns: None,
                proxy: None,
                proxy_url: None,
            });
        }
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let netns = trainyard_sandbox::netns::Netns::create(&format!("pkg{n}"), None)
            .map_err(|e| InstallError::Executor(format!("the install's network namespace: {e}")))?;
        let addr = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, PROXY_PORT);
        let listener = netns
            .listen(addr)
            .map_err(|e| InstallError::Executor(format!("the install's proxy: {e}")))?;
        let proxy = Proxy::serve(listener, config.allowed.clone())
            .map_err(|e| InstallError::Executor(format!("the install's proxy: {e}")))?;
        Ok(Network {
            ws,
            netns: Some(netns),
            proxy: Some(proxy),
            proxy_url: Some(format!("http://{addr}")),
        })
    }
}
