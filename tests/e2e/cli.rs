//! The command-line client (`trainyard submit|jobs|job|cancel|executors|logs`,
//! `trainyard sweep create|list|show|cancel`) as users run it: the real binary against a real server, Postgres and
//! executor. It submits a spec file, follows the job to `succeeded` (exit
//! 0) with a progress bar and the loss, follows a job that fails (exit 1),
//! cancels a running job (which a concurrent `trainyard job` reports with
//! exit 3), and fails with one
//! clear line and a non-zero exit for an unreachable API, a rejected spec
//! (every field error printed), a missing token and an unknown job.

use serde_json::{json, Value};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use trainyard_e2e::{binary, eventually, example_digits, free_port, Platform, Proc};

/// Steps of the job that must succeed: a second or more of training, so
/// that the follower shows it `running` with a moving bar before it ends (a
/// few hundred steps of digits take well under a second).
const STEPS: u64 = 3000;

/// A server for the CLI to talk to; `admin` is the token it requires.
fn server(admin: Option<&str>) -> Platform {
    let mut b = Platform::builder("cli");
    if let Some(token) = admin {
        b = b.admin_token(token);
    }
    b.start()
}

/// What these tests do with a platform.
trait CliPlatform {
    /// `trainyard ARGS…` against this server (through `TRAINYARD_API`).
    fn cli(&self, args: &[&str]) -> Output;
    /// Writes `spec` to a file `NAME.json` in the data folder; its path.
    fn spec_file(&self, name: &str, spec: &Value) -> PathBuf;
}

impl CliPlatform for Platform {
    fn cli(&self, args: &[&str]) -> Output {
        cli_at(&self.base, args, None)
    }

    fn spec_file(&self, name: &str, spec: &Value) -> PathBuf {
        let path = self.file(&format!("{name}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(spec).unwrap()).unwrap();
        path
    }
}

/// Longest any one CLI command may take here (`job` follows a whole run,
/// which takes minutes when other training tests share the 2 cores).
const CLI_LIMIT: Duration = Duration::from_secs(480);

fn cli_at(api: &str, args: &[&str], token: Option<&str>) -> Output {
    let mut cmd = Command::new(binary("trainyard").unwrap());
    cmd.args(args)
        .env("TRAINYARD_API", api)
        .env_remove("TRAINYARD_API_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(t) = token {
        cmd.env("TRAINYARD_API_TOKEN", t);
    }
    let mut child = cmd.spawn().unwrap();
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = r.read_to_end(&mut b);
            b
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > CLI_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`trainyard {}` still running after {CLI_LIMIT:?}:\n{}\n{}",
                args.join(" "),
                text(&out.join().unwrap_or_default()),
                text(&err.join().unwrap_or_default())
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

fn show(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
        o.status.code(),
        text(&o.stdout),
        text(&o.stderr)
    )
}

/// The job id in `submit`'s answer ("submitted job ID (…)").
fn submitted_id(o: &Output) -> String {
    let out = text(&o.stdout);
    out.split_whitespace()
        .nth(2)
        .filter(|id| id.len() == 36)
        .unwrap_or_else(|| panic!("no job id in: {}", show(o)))
        .to_owned()
}

/// The quick start's demo job, named `name`, for `steps` steps.
fn digits(name: &str, steps: u64) -> Value {
    let mut spec = example_digits();
    spec["name"] = json!(name);
    spec["steps"] = json!(steps);
    spec
}

fn state_of(server: &Platform, id: &str) -> String {
    let o = server.cli(&["jobs", "--limit", "500"]);
    text(&o.stdout)
        .lines()
        .find(|l| l.starts_with(id))
        .and_then(|l| l.split_whitespace().nth(3)) // ID NAME OWNER STATE …
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn cli_submits_follows_to_success_lists_and_cancels() {
    let started = Instant::now();
    let server = server(None);
    let _exec = server.executor("cli-ex1");

    // submit FILE, then follow it: exit 0 once it succeeded.
    let file = server.spec_file("digits", &digits("cli-digits", STEPS));
    let submit = server.cli(&["submit", file.to_str().unwrap()]);
    assert!(submit.status.success(), "{}", show(&submit));
    let id = submitted_id(&submit);
    assert!(
        text(&submit.stdout).contains("(cli-digits, allreduce, queued)"),
        "{}",
        show(&submit)
    );
    let follow = server.cli(&["job", &id]);
    assert_eq!(follow.status.code(), Some(0), "{}", show(&follow));
    let (out, err) = (text(&follow.stdout), text(&follow.stderr));
    assert!(
        err.contains(&format!("job {id}: succeeded")),
        "{}",
        show(&follow)
    );
    assert!(
        err.contains(&format!("[{}] 100% {STEPS}/{STEPS}", "#".repeat(30))),
        "a full progress bar: {}",
        show(&follow)
    );
    assert!(err.contains("loss "), "{}", show(&follow));
    assert!(out.contains("weights: file://"), "{}", show(&follow));
    assert!(
        out.contains(&format!("job {id} succeeded: trained {STEPS} steps")),
        "{}",
        show(&follow)
    );

    // jobs, executors, logs.
    let jobs = server.cli(&["jobs"]);
    assert!(jobs.status.success(), "{}", show(&jobs));
    let row = text(&jobs.stdout)
        .lines()
        .find(|l| l.starts_with(&id))
        .map(str::to_owned);
    let row = row.unwrap_or_else(|| panic!("{}", show(&jobs)));
    assert!(
        row.contains("cli-digits") && row.contains("succeeded"),
        "{row}"
    );
    let only_running = server.cli(&["jobs", "--state", "running"]);
    assert!(
        !text(&only_running.stdout).contains(&id),
        "{}",
        show(&only_running)
    );
    let execs = server.cli(&["executors"]);
    assert!(execs.status.success(), "{}", show(&execs));
    assert!(
        text(&execs.stdout)
            .lines()
            .any(|l| l.contains("cli-ex1") && l.contains("live")),
        "{}",
        show(&execs)
    );
    let logs = server.cli(&["logs", &id]);
    assert!(logs.status.success(), "{}", show(&logs));
    let api_lines = server.log_page(&id, None, Some(1000)).lines.len();
    assert!(api_lines > 0);
    assert!(
        text(&logs.stdout).lines().count() == api_lines
            && text(&logs.stdout)
                .lines()
                .all(|l| l.contains(" worker0 g1: ")),
        "{}",
        show(&logs)
    );

    // A job that fails: `submit --follow` exits 1 and says why.
    let mut broken = digits("cli-broken", 100);
    broken["dataset"]["url"] = json!("file:///nonexistent/trainyard/digits.npz");
    let file = server.spec_file("broken", &broken);
    let failed = server.cli(&["submit", "--follow", file.to_str().unwrap()]);
    assert_eq!(failed.status.code(), Some(1), "{}", show(&failed));
    assert!(
        text(&failed.stdout)
            .contains("failed: cannot read dataset file:///nonexistent/trainyard/digits.npz"),
        "{}",
        show(&failed)
    );

    // cancel ID while a follower watches: the follower exits 3.
    let long = server.spec_file("long", &digits("cli-long", 1_000_000));
    let submit = server.cli(&["submit", long.to_str().unwrap()]);
    let long_id = submitted_id(&submit);
    eventually(Duration::from_secs(180), || {
        (state_of(&server, &long_id) == "running").then_some(())
    })
    .unwrap_or_else(|| {
        let jobs = server.cli(&["jobs"]);
        panic!("the long job never ran:\n{}", show(&jobs))
    });
    let mut follower = Command::new(binary("trainyard").unwrap());
    follower
        .args(["job", &long_id])
        .env("TRAINYARD_API", &server.base);
    let mut follower = Proc::spawn(follower).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let cancel = server.cli(&["cancel", &long_id]);
    assert!(cancel.status.success(), "{}", show(&cancel));
    assert!(
        text(&cancel.stdout).contains(&format!("job {long_id} cancelled (cancelled by user)")),
        "{}",
        show(&cancel)
    );
    let code = follower.wait_exit(Duration::from_secs(60)).unwrap();
    assert_eq!(code, Some(3), "{}", follower.output());
    assert!(
        follower
            .output()
            .contains(&format!("job {long_id} cancelled: cancelled by user")),
        "{}",
        follower.output()
    );
    // Cancelling again is idempotent; following a cancelled job says so at once.
    assert!(server.cli(&["cancel", &long_id]).status.success());
    assert_eq!(server.cli(&["job", &long_id]).status.code(), Some(3));
    eprintln!(
        "CLI success/cancel test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn cli_errors_are_one_clear_line_and_a_non_zero_exit() {
    // Nothing listens on this port.
    let dead = format!("http://127.0.0.1:{}", free_port().unwrap());
    let o = cli_at(&dead, &["jobs"], None);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with(&format!(
            "error: cannot reach the Trainyard API at {dead}: "
        )),
        "{err}"
    );
    assert!(err.contains("(set --api or TRAINYARD_API)"), "{err}");
    // --api wins over the environment.
    let o = cli_at("http://127.0.0.1:9", &["executors", "--api", &dead], None);
    assert!(text(&o.stderr).contains(&dead), "{}", show(&o));

    let server = server(Some("cli-secret"));
    // A missing token: the 401, and what to do about it.
    let o = server.cli(&["jobs"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(
        err.starts_with("error: 401 Unauthorized: missing or invalid bearer token"),
        "{err}"
    );
    assert!(err.contains("TRAINYARD_API_TOKEN"), "{err}");
    let ok = cli_at(&server.base, &["jobs"], Some("cli-secret"));
    assert!(ok.status.success(), "{}", show(&ok));

    // The admin makes a user token; the user is who it says, may not
    // manage tokens, and the admin revokes it.
    let made = cli_at(
        &server.base,
        &["token", "create", "--owner", "erin", "--label", "cli test"],
        Some("cli-secret"),
    );
    assert!(made.status.success(), "{}", show(&made));
    let erin = text(&made.stdout).trim().to_owned();
    assert!(erin.starts_with("ty_"), "{}", show(&made));
    assert!(
        text(&made.stderr).contains("shown only now"),
        "{}",
        show(&made)
    );
    let me = cli_at(&server.base, &["whoami"], Some(&erin));
    assert_eq!(text(&me.stdout).trim(), "erin (user)", "{}", show(&me));
    let o = cli_at(&server.base, &["token", "list"], Some(&erin));
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(
        text(&o.stderr).starts_with("error: 403 Forbidden:"),
        "{}",
        show(&o)
    );
    let list = cli_at(&server.base, &["token", "list"], Some("cli-secret"));
    let listed = text(&list.stdout);
    assert!(
        listed.contains("erin") && !listed.contains(&erin),
        "{listed}"
    );
    let id = listed
        .lines()
        .find(|l| l.contains("erin"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_owned();
    let o = cli_at(&server.base, &["token", "revoke", &id], Some("cli-secret"));
    assert!(o.status.success(), "{}", show(&o));
    let o = cli_at(&server.base, &["whoami"], Some(&erin));
    assert_eq!(o.status.code(), Some(2), "a revoked token: {}", show(&o));

    // A rejected spec: the problem on the first line, then every field.
    let mut bad = digits("bad", 100);
    bad["optimizer"]["lr"] = json!(0);
    bad["batch_size"] = json!(0);
    let file = server.spec_file("bad", &bad);
    let o = cli_at(
        &server.base,
        &["submit", file.to_str().unwrap(), "--token", "cli-secret"],
        None,
    );
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = text(&o.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines[0], "error: 422 Invalid request: 2 invalid field(s)",
        "{err}"
    );
    assert!(
        lines.contains(&"  optimizer.lr: must be greater than 0 and at most 10, got 0"),
        "{err}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("  batch_size: must be between 1 and 65536")),
        "{err}"
    );
    assert!(
        text(&o.stdout).is_empty(),
        "nothing submitted: {}",
        show(&o)
    );
    // Malformed JSON and a missing file are one line too.
    std::fs::write(&file, "{\"name\": ").unwrap();
    let o = cli_at(
        &server.base,
        &["submit", file.to_str().unwrap(), "--token", "cli-secret"],
        None,
    );
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(
        text(&o.stderr).starts_with("error: 400 Malformed JSON"),
        "{}",
        show(&o)
    );
    let o = cli_at(
        &server.base,
        &["submit", "/no/such/spec.json"],
        Some("cli-secret"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(
        text(&o.stderr).starts_with("error: cannot read /no/such/spec.json"),
        "{}",
        show(&o)
    );

    // `model`: an unknown --format is refused before any request; a
    // TorchScript module of a built-in model is the API's 400 naming
    // `format`; weights not written yet are its 404 with the reason.
    let file = server.spec_file("queued", &digits("cli-queued", 100));
    let o = cli_at(
        &server.base,
        &["submit", file.to_str().unwrap()],
        Some("cli-secret"),
    );
    assert!(o.status.success(), "{}", show(&o));
    let queued = submitted_id(&o);
    let out = server.file("model.out");
    let out = out.to_str().unwrap();
    let o = cli_at(
        &server.base,
        &["model", &queued, "--format", "onnx", "-o", out],
        Some("cli-secret"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains("--format")
            && err.contains("must be safetensors or torchscript, got \"onnx\""),
        "{}",
        show(&o)
    );
    let o = cli_at(
        &server.base,
        &["model", &queued, "--format", "torchscript", "-o", out],
        Some("cli-secret"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(
        err.starts_with("error: 400 Bad request:")
            && err.contains("  format: the job's model is built-in (mlp)"),
        "{}",
        show(&o)
    );
    let o = cli_at(
        &server.base,
        &["model", &queued, "-o", out],
        Some("cli-secret"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(
        text(&o.stderr).starts_with("error: 404 Not found: job ")
            && text(&o.stderr).contains("has no final weights (it is queued)"),
        "{}",
        show(&o)
    );
    assert!(!std::path::Path::new(out).exists(), "nothing written");

    // Unknown and malformed job ids.
    let unknown = uuid::Uuid::new_v4().to_string();
    for cmd in ["job", "cancel", "logs"] {
        let o = cli_at(&server.base, &[cmd, &unknown], Some("cli-secret"));
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", show(&o));
        assert!(
            text(&o.stderr).starts_with("error: 404 Not found: no job with id"),
            "{cmd}: {}",
            show(&o)
        );
    }
    let o = cli_at(&server.base, &["job", "../executors"], Some("cli-secret"));
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(text(&o.stderr).contains("is not a job id"), "{}", show(&o));
}

/// A TLS server in Python that answers every GET with a `whoami` body
/// naming the bearer token it was sent.
const TLS_SERVER: &str = r#"
import http.server, json, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"user": "via-tls", "role": "user", "token_id": None, "open": False,
                           "seen": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", int(sys.argv[3])), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
s.socket = ctx.wrap_socket(s.socket, server_side=True)
s.serve_forever()
"#;

/// The client speaks TLS to an `https://` API (behind a TLS-terminating
/// proxy, tokens do not cross the network in clear) and checks the
/// server's certificate against the system's roots, or `SSL_CERT_FILE`.
#[test]
fn cli_reaches_an_https_api_and_checks_its_certificate() {
    let dir = std::env::temp_dir().join(format!("trainyard-cli-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let openssl = |args: &[&str]| {
        let o = Command::new("openssl")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("openssl (scripts/test installs it)");
        assert!(o.status.success(), "openssl {args:?}: {}", show(&o));
    };
    // A private CA, and a certificate it signs for 127.0.0.1.
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=trainyard-test-ca",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "leaf.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    let port = free_port().unwrap();
    let mut cmd = Command::new("python3");
    cmd.args(["-c", TLS_SERVER, "leaf.pem", "leaf.key", &port.to_string()])
        .current_dir(&dir);
    let _server = Proc::spawn(cmd).unwrap();
    let api = format!("https://127.0.0.1:{port}");
    let whoami = |ca: Option<&str>| {
        let mut cmd = Command::new(binary("trainyard").unwrap());
        cmd.args(["whoami", "--api", &api, "--token", "tls-token"])
            .env_remove("SSL_CERT_FILE");
        if let Some(ca) = ca {
            cmd.env("SSL_CERT_FILE", dir.join(ca));
        }
        cmd.output().unwrap()
    };
    // Trusting the private CA: the request goes through, token and all.
    let ok = eventually(Duration::from_secs(30), || {
        let o = whoami(Some("ca.pem"));
        o.status.success().then_some(o)
    })
    .expect("whoami over TLS");
    assert_eq!(text(&ok.stdout).trim(), "via-tls (user)", "{}", show(&ok));
    // Without it the certificate is refused, and the error says so.
    let o = whoami(None);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(text(&o.stderr).contains("certificate"), "{}", show(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `trainyard sweep create --follow` runs a small grid with early stopping
/// to its end (exit 0, a line per trial, the table with the best marked);
/// `sweep list` and `sweep show` print what the API says; `sweep cancel`
/// cancels a sweep whose trials wait in the queue; a bad sweep spec and a
/// bad id are one clear error and exit 2.
#[test]
fn cli_runs_lists_shows_and_cancels_sweeps() {
    let p = server(None);
    let _executors: Vec<Proc> = (1..=2).map(|i| p.executor(&format!("sw{i}"))).collect();
    eventually(Duration::from_secs(60), || {
        (p.live_executors().len() == 2).then_some(())
    })
    .expect("2 executors register");
    // Long enough (seconds) that the sweep's controller, which looks every
    // half second, judges the trials at their rungs while they run.
    let mut base = digits("cli-sweep", 12_000);
    base.as_object_mut().unwrap().remove("checkpoint");
    let spec = json!({
        "name": "cli-sweep",
        "base": base,
        "parameters": {"optimizer.lr": {"values": [0.0001, 0.001, 0.003, 0.01]}},
        "search": "grid", "metric": "eval_accuracy", "goal": "maximize",
        "concurrency": 2,
        "early_stopping": {"asha": {"reduction_factor": 2, "min_steps": 300}},
    });
    let file = p.spec_file("sweep", &spec);
    let o = p.cli(&["sweep", "create", file.to_str().unwrap(), "--follow"]);
    eprintln!("{}", show(&o));
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = text(&o.stdout);
    let id = out
        .split_whitespace()
        .nth(2)
        .filter(|id| id.len() == 36)
        .unwrap_or_else(|| panic!("no sweep id in: {}", show(&o)))
        .to_owned();
    let api: Value = p.get(&format!("/v1/sweeps/{id}"));
    assert_eq!(api["state"], "succeeded", "{api}");
    let err = text(&o.stderr);
    for t in 0..4 {
        assert!(err.contains(&format!("trial {t} running")), "{}", show(&o));
    }
    // The table: a row per trial with the API's state, `*` on the best.
    let best = api["best"]["index"].as_u64().expect("a best trial");
    for t in api["trials"].as_array().unwrap() {
        let i = t["index"].as_u64().unwrap();
        let row = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&i.to_string()))
            .unwrap_or_else(|| panic!("no row of trial {i}: {}", show(&o)));
        assert!(row.contains(t["state"].as_str().unwrap()), "{row}");
        assert_eq!(
            row.contains(" * ") || row.starts_with(&format!("{i} *")),
            i == best,
            "{row}"
        );
    }
    assert!(out.contains("TRIAL  optimizer.lr  STATE"), "{}", show(&o));
    assert!(
        out.contains(&format!("best: trial {best} eval_accuracy ")),
        "{}",
        show(&o)
    );
    let stopped = api["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "stopped")
        .count();
    assert!(stopped >= 1, "ASHA stopped a trial: {api}");

    let shown = p.cli(&["sweep", "show", &id]);
    assert_eq!(shown.status.code(), Some(0), "{}", show(&shown));
    assert!(
        text(&shown.stdout).contains(&format!("sweep {id} (cli-sweep): succeeded")),
        "{}",
        show(&shown)
    );

    // A sweep whose trials no executor can take, cancelled.
    let mut held = spec.clone();
    held["name"] = json!("cli-held");
    held["base"]["resources"] = json!({"memory_mb": 1u64 << 20});
    held.as_object_mut().unwrap().remove("early_stopping");
    let file = p.spec_file("held", &held);
    let o = p.cli(&["sweep", "create", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let held_id = text(&o.stdout)
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_owned();
    let list = p.cli(&["sweep", "list"]);
    let lines: Vec<String> = text(&list.stdout).lines().map(str::to_owned).collect();
    assert!(lines[0].starts_with("ID"), "{}", show(&list));
    assert!(
        lines[1].starts_with(&held_id) && lines[1].contains("running"),
        "newest first: {}",
        show(&list)
    );
    assert!(
        lines[2].starts_with(&id) && lines[2].contains("succeeded"),
        "{}",
        show(&list)
    );
    let o = p.cli(&["sweep", "cancel", &held_id]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        text(&o.stdout).starts_with(&format!("sweep {held_id} cancelled")),
        "{}",
        show(&o)
    );

    // Errors: one line naming the field, exit 2.
    let mut bad = spec.clone();
    bad["parameters"] = json!({"optimizer.lr": {"uniform": [0.1, 0.01]}});
    let file = p.spec_file("bad", &bad);
    let o = p.cli(&["sweep", "create", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(text(&o.stderr).contains("error: 422"), "{}", show(&o));
    assert!(text(&o.stderr).contains("  parameters."), "{}", show(&o));
    let o = p.cli(&["sweep", "show", "../jobs"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("is not a sweep id"),
        "{}",
        show(&o)
    );
    let o = p.cli(&["sweep", "show", &uuid::Uuid::new_v4().to_string()]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(text(&o.stderr).contains("404"), "{}", show(&o));
}
