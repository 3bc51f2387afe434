//! The web UI, end to end: a real `trainyard` server with real executor
//! processes, driven by headless Chromium (Debian's `chromium`) through
//! `playwright-core` running `tests/web/ui.cjs` under Node. The script
//! submits through the form and watches a job train to `succeeded` without
//! reloading, reads the loss curve, sees an invalid spec's field errors
//! beside the fields, asks this driver to SIGKILL the executor under a
//! running job and watches the timeline record the recovery, and takes a
//! screenshot of every page (into `<target>/web-screenshots/`; with
//! `TRAINYARD_UPDATE_SCREENSHOTS=1` the guides' pictures also go to `docs/`).
//! `tests/web/runs.cjs` compares runs and follows a sweep on its pages.
//!
//! The browser and `playwright-core` must be installed (`scripts/test` does
//! it through `ensure_browser_tests` in `scripts/common.sh`): when they are
//! missing these tests fail, they never skip. The HTTP-level checks of the
//! event stream and the assignments endpoint need no browser.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use trainyard_e2e::{eventually, kill9, repo_root, sse_events, tail, target_dir, Platform, Proc};

/// `playwright-core`'s `node_modules` folder.
fn node_modules() -> PathBuf {
    let dir = std::env::var_os("TRAINYARD_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache")
                });
            cache.join("trainyard/node/node_modules")
        });
    assert!(
        dir.join("playwright-core/package.json").exists(),
        "playwright-core is not installed in {}: run ./scripts/test, or `source scripts/common.sh && ensure_browser_tests`",
        dir.display()
    );
    dir
}

/// The Chromium binary.
fn chromium() -> PathBuf {
    let path = std::env::var_os("TRAINYARD_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.exists(),
        "Chromium is not installed at {}: run ./scripts/test, or `source scripts/common.sh && ensure_browser_tests`",
        path.display()
    );
    path
}

/// A server for the browser; `admin` is the token it requires. Executors
/// are lost after 25 silent heartbeats (5 s): quick enough to see a
/// SIGKILL, slow enough for a loaded 2-core machine that also runs
/// Chromium.
fn platform(admin: Option<&str>) -> Platform {
    let mut b = Platform::builder("web");
    if let Some(token) = admin {
        b = b.admin_token(token);
    }
    b.start()
}

#[test]
fn browser_submits_watches_a_job_train_and_recover_and_shows_field_errors() {
    let (modules, browser) = (node_modules(), chromium());
    let started = Instant::now();
    let p = platform(None);
    let mut executors: BTreeMap<String, Proc> = (1..=4)
        .map(|i| (format!("ex{i}"), p.executor(&format!("ex{i}"))))
        .collect();
    eventually(Duration::from_secs(60), || {
        (p.live_executors().len() == 4).then_some(())
    })
    .expect("4 executors register");

    let shots = target_dir().join("web-screenshots");
    let docs = std::env::var_os("TRAINYARD_UPDATE_SCREENSHOTS").map(|_| repo_root().join("docs"));
    let mut node = Command::new("node");
    node.arg(repo_root().join("tests/web/ui.cjs"))
        .env("NODE_PATH", &modules)
        .env("TY_BASE", &p.base)
        .env("TY_CHROMIUM", &browser)
        .env(
            "TY_DIGITS",
            format!("file://{}", repo_root().join("data/digits.npz").display()),
        )
        .env("TY_EXAMPLES", repo_root().join("examples"))
        .env("TY_SHOTS", &shots)
        .env(
            "TY_DOCS",
            docs.map(|d| d.into_os_string()).unwrap_or_default(),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = node.spawn().expect("node runs (install nodejs)");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (err_tx, err_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let text: Vec<String> = BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect();
        let _ = err_tx.send(text.join("\n"));
    });

    let mut transcript = String::new();
    let mut next = 5;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        eprintln!("ui: {line}");
        transcript.push_str(&line);
        transcript.push('\n');
        let Some(job) = line.strip_prefix("@@kill-executor-of ") else {
            continue;
        };
        // SIGKILL the executor holding the job's worker, and start a fresh
        // one so the cluster keeps four executors for the later jobs.
        let a = p.assignments(job);
        let victim = a
            .workers
            .first()
            .map(|w| w.executor.name.clone())
            .unwrap_or_else(|| panic!("job {job} has no worker: {a:?}"));
        let proc = executors.remove(&victim).expect("an executor of ours");
        kill9(proc.pid());
        drop(proc);
        let name = format!("ex{next}");
        next += 1;
        executors.insert(name.clone(), p.executor(&name));
        writeln!(stdin, "killed {victim}; started {name}").unwrap();
        stdin.flush().unwrap();
    }
    let status = child.wait().unwrap();
    let errors = err_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_default();
    let server = p.server.output();
    let server_tail = tail(&server, 40);
    let executor_logs: String = executors
        .iter()
        .map(|(name, e)| format!("--- {name} ---\n{}\n", tail(&e.output(), 15)))
        .collect();
    assert!(
        status.success(),
        "the browser test failed ({status}):\n{errors}\n--- transcript ---\n{transcript}\n--- server (last lines) ---\n{server_tail}\n{executor_logs}"
    );
    for page in [
        "executors",
        "submit-invalid",
        "job-succeeded",
        "jobs",
        "job-recovered",
        "job-ps-running",
        "job-ring-running",
        "usage",
    ] {
        let f = shots.join(format!("{page}.png"));
        let len = std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0);
        assert!(len > 10_000, "screenshot {} missing or empty", f.display());
    }
    eprintln!(
        "browser test passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Runs `tests/web/SCRIPT` under Node against `p`; panics with its output,
/// the server's last lines and the executors' when it fails.
fn run_browser_script(p: &Platform, script: &str, executors: &[Proc]) {
    let (modules, browser) = (node_modules(), chromium());
    let out = Command::new("node")
        .arg(repo_root().join("tests/web").join(script))
        .env("NODE_PATH", &modules)
        .env("TY_BASE", &p.base)
        .env("TY_CHROMIUM", &browser)
        .env(
            "TY_DIGITS",
            format!("file://{}", repo_root().join("data/digits.npz").display()),
        )
        .env("TY_EXAMPLES", repo_root().join("examples"))
        .env("TY_SHOTS", target_dir().join("web-screenshots"))
        .env(
            "TY_DOCS",
            std::env::var_os("TRAINYARD_UPDATE_SCREENSHOTS")
                .map(|_| repo_root().join("docs").into_os_string())
                .unwrap_or_default(),
        )
        .output()
        .expect("node runs (install nodejs)");
    let transcript = String::from_utf8_lossy(&out.stdout);
    eprintln!("{transcript}");
    let executor_logs: String = executors
        .iter()
        .enumerate()
        .map(|(i, e)| format!("--- executor {i} ---\n{}\n", tail(&e.output(), 15)))
        .collect();
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{}\n--- transcript ---\n{transcript}\n--- server (last lines) ---\n{}\n{executor_logs}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        tail(&p.server.output(), 40),
    );
}

/// Comparing runs and the sweep pages (`tests/web/runs.cjs`): two jobs
/// ticked in the jobs list and compared (curves, the differing spec field,
/// results); a sweep with early stopping followed on its page to the end
/// (trials, rungs, a stopped trial, the best), and another cancelled from
/// its page.
#[test]
fn browser_compares_runs_and_follows_a_sweep() {
    let p = platform(None);
    let executors: Vec<Proc> = (1..=2).map(|i| p.executor(&format!("cmp{i}"))).collect();
    eventually(Duration::from_secs(60), || {
        (p.live_executors().len() == 2).then_some(())
    })
    .expect("2 executors register");
    run_browser_script(&p, "runs.cjs", &executors);
    for page in ["compare", "sweep", "sweep-compare", "sweeps"] {
        let f = target_dir().join(format!("web-screenshots/{page}.png"));
        let len = std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0);
        assert!(len > 10_000, "screenshot {} missing or empty", f.display());
    }
}

#[test]
fn browser_asks_for_the_token_when_the_api_needs_one() {
    let (modules, browser) = (node_modules(), chromium());
    let p = platform(Some("page-secret"));
    let (status, _) = p.with_token("page-secret").post(
        "/v1/jobs",
        &json!({
            "name": "token-job",
            "model": {"kind": "mlp", "inputs": 8, "hidden": [8], "outputs": 2},
            "dataset": {"kind": "classification", "samples": 100, "features": 8, "classes": 2},
            "loss": "cross_entropy", "optimizer": {"kind": "sgd", "lr": 0.1},
            "batch_size": 10, "steps": 5
        }),
    );
    assert_eq!(status, 201);
    let out = Command::new("node")
        .arg(repo_root().join("tests/web/token.cjs"))
        .env("NODE_PATH", &modules)
        .env("TY_BASE", &p.base)
        .env("TY_CHROMIUM", &browser)
        .env("TY_SHOTS", target_dir().join("web-screenshots"))
        .env("TY_TOKEN", "page-secret")
        .output()
        .expect("node runs (install nodejs)");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn wait_event(
    rx: &mpsc::Receiver<(String, Value)>,
    want: impl Fn(&str, &Value) -> bool,
) -> (String, Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (k, d) = rx
            .recv_timeout(left)
            .expect("the awaited event arrives within 20 s");
        if want(&k, &d) {
            return (k, d);
        }
    }
}

#[test]
fn event_stream_announces_changes_needs_the_token_and_ends_at_shutdown() {
    let mut p = platform(Some("ui-secret"));
    let admin = p.with_token("ui-secret");
    let denied = p.event_stream().unwrap();
    assert_eq!(denied.status(), 401);
    assert_eq!(denied.headers()["content-type"], "application/problem+json");
    let ok = admin.event_stream().unwrap();
    assert_eq!(ok.status(), 200);
    assert!(ok.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let rx = sse_events(ok);
    wait_event(&rx, |k, _| k == "ready");

    // A submit is announced with the job's id.
    let spec = json!({
        "name": "streamed",
        "model": {"kind": "mlp", "inputs": 8, "hidden": [8], "outputs": 2},
        "dataset": {"kind": "classification", "samples": 100, "features": 8, "classes": 2},
        "loss": "cross_entropy", "optimizer": {"kind": "sgd", "lr": 0.1},
        "batch_size": 10, "steps": 5, "strategy": "allreduce"
    });
    let (_, job) = admin.post("/v1/jobs", &spec);
    let id = job["id"].as_str().unwrap().to_owned();
    wait_event(&rx, |k, d| k == "job" && d["id"] == id.as_str());

    // The assignments of a job nobody holds yet; bad ids name the field.
    let get = |path: &str| admin.get_response(path);
    let a: Value = get(&format!("/v1/jobs/{id}/assignments")).json().unwrap();
    assert_eq!(a["generation"], 0, "{a}");
    assert_eq!(a["workers"], json!([]));
    assert_eq!(a["parameter_servers"], json!([]));
    assert_eq!(a["strategy"], "allreduce");
    let bad = get("/v1/jobs/42/assignments");
    assert_eq!(bad.status(), 400);
    let problem: Value = bad.json().unwrap();
    assert_eq!(problem["errors"][0]["field"], "id", "{problem}");
    let unknown = get(&format!("/v1/jobs/{}/assignments", uuid::Uuid::new_v4()));
    assert_eq!(unknown.status(), 404);

    // A cancel is announced too, and the stream ends when the server stops
    // (a graceful shutdown is not held open by the page).
    admin.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
    wait_event(&rx, |k, d| k == "job" && d["id"] == id.as_str());
    p.server.terminate().unwrap();
    let code = p.server.wait_exit(Duration::from_secs(10)).unwrap();
    assert_eq!(code, Some(0), "{}", p.server.output());
}

#[test]
fn the_page_and_its_assets_are_served_from_the_binary() {
    let p = platform(None);
    for (path, kind, needle) in [
        ("/", "text/html", "/assets/app.js"),
        ("/assets/app.js", "text/javascript", "/v1/events/stream"),
        ("/assets/app.css", "text/css", ".field-error"),
    ] {
        let r = p.get_response(path);
        assert_eq!(r.status(), 200, "{path}");
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind),
            "{path}"
        );
        assert!(r.text().unwrap().contains(needle), "{path}");
    }

    // The entry's modules, followed import by import as the browser does:
    // each is served as JavaScript with the page's headers, and together
    // they are every script in web/ (a module not routed fails here).
    let base = reqwest::Url::parse(&format!("{}/", p.base)).unwrap();
    let mut todo = vec![base.join("assets/app.js").unwrap()];
    let mut served = std::collections::BTreeSet::new();
    while let Some(url) = todo.pop() {
        if !served.insert(url.path().to_owned()) {
            continue;
        }
        let r = p.get_response(url.path());
        assert_eq!(r.status(), 200, "{url}");
        let h = r.headers();
        assert!(
            h["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/javascript"),
            "{url}"
        );
        assert_eq!(h["cache-control"], "no-cache", "{url}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{url}");
        let js = r.text().unwrap();
        for line in js.lines().filter(|l| l.starts_with("import ")) {
            let spec = line
                .rsplit('"')
                .nth(1)
                .unwrap_or_else(|| panic!("{url}: {line}"));
            todo.push(url.join(spec).unwrap());
        }
    }
    let mut on_disk = std::collections::BTreeSet::new();
    let mut dirs = vec![repo_root().join("web")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "js") {
                let rel = path.strip_prefix(repo_root().join("web")).unwrap();
                on_disk.insert(format!("/assets/{}", rel.to_str().unwrap()));
            }
        }
    }
    assert_eq!(served, on_disk, "the modules reached from /assets/app.js");
    assert!(served.len() > 10, "{served:?}");
    assert_eq!(p.get_response("/assets/js/missing.js").status(), 404);
    assert_eq!(p.get_response("/assets/web.rs").status(), 404);
}
