//! The network wall of script ranks, attacked as a plain user would: a
//! one-file script (`tests/python/scripts/netscan.py`) runs beside another
//! user's 2-rank DDP script job on the same executors and tries every way
//! out — every TCP port of the loopback addresses and of the host's own
//! addresses, the platform's Postgres by its port and by its socket path,
//! the API, the object store, a metadata listener this test stands up at
//! 169.254.169.254, the victim's TCPStore (by the host's addresses and by
//! the job block's rank addresses), UDP and raw sockets. Every attempt is
//! refused; the victim trains to within 1.5 points of torchrun's run of
//! the same script, judged by PyTorch on digits no job saw; and nothing of
//! the platform changes (no token or job the attacker made). The same
//! attack runs again with the victim's ranks on two other hosts (network
//! namespaces as hosts, `trainyard_e2e::Lab`), aimed at every host's
//! address, every data plane and the API.

use serde_json::{json, Value};
use std::time::Duration;
use trainyard_common::spec::script::rendezvous_port;
use trainyard_common::JobState;
use trainyard_e2e::script_jobs::{
    ddp_accuracy as accuracy, download, scripts_dir as scripts, split_digits as digits, torchrun,
    torchrun_model,
};
use trainyard_e2e::{eventually, ApiClient, Metadata, Platform, TestS3};

const ADMIN: &str = "e2e-netwall-admin";

/// This host's own addresses (global scope, v4 and v6).
fn host_addresses() -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["-o", "addr", "show", "scope", "global"])
        .output()
        .expect("ip");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l
                .split_whitespace()
                .skip_while(|w| *w != "inet" && *w != "inet6");
            w.next()?;
            Some(w.next()?.split('/').next()?.to_owned())
        })
        // The test's own metadata veth is not the host's.
        .filter(|a| !a.starts_with("169.254."))
        .collect()
}

fn with_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Host and port of a Postgres URL, and its Unix socket's path (where the
/// server keeps one that this host can see).
fn postgres_of(url: &str) -> (String, u16, Option<String>) {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let at = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let hostport = at.split(['/', '?']).next().unwrap_or("");
    let (host, port) = hostport
        .rsplit_once(':')
        .map_or((hostport, 5432), |(h, p)| (h, p.parse().unwrap_or(5432)));
    let query_host = url
        .split_once('?')
        .and_then(|(_, q)| q.split('&').find_map(|kv| kv.strip_prefix("host=")))
        .map(str::to_owned);
    let name = format!(".s.PGSQL.{port}");
    let socket = query_host
        .into_iter()
        .chain(std::env::var("TRAINYARD_TEST_PG_SOCKET_DIR").ok())
        .chain(["/var/run/postgresql".into(), "/tmp".into()])
        .map(|d| format!("{d}/{name}"))
        .find(|p| std::path::Path::new(p).exists());
    (host.to_owned(), port, socket)
}

fn refused(what: &str, v: &Value) {
    let s = v.as_str().unwrap_or_default();
    assert!(s.starts_with("refused"), "{what}: {v}");
}

/// Alice's 2-rank DDP job (4 epochs of digits) and torchrun's run of the
/// same script beside it, once both of the job's ranks run.
struct Victim {
    id: String,
    reference: std::process::Child,
    test: std::path::PathBuf,
    store_port: u16,
    /// Its ranks' addresses in their namespaces (`MASTER_ADDR` first).
    ranks: [std::net::Ipv4Addr; 2],
}

impl Victim {
    fn start(p: &Platform, alice: &ApiClient) -> Victim {
        let (train, test) = digits(p);
        alice.upload("train.py", &scripts().join("ddp_digits.py"));
        alice.upload("digits-train.npz", &train);
        let id = alice.submit(&json!({
            "name": "victim",
            "script": {"code": "artifact:train.py", "args": ["--epochs", "4"]},
            "inputs": ["artifact:digits-train.npz"],
            "workers": {"min": 2, "max": 2},
            "resources": {"memory_mb": 1024},
        }));
        let reference = torchrun(p, "torchrun", &train, 2, &["--epochs", "4"]);
        let running = eventually(Duration::from_secs(180), || {
            let lines = alice.log_messages(&id);
            (lines.iter().filter(|l| l.contains("runs train.py")).count() >= 2).then_some(())
        });
        assert!(running.is_some(), "{}", alice.log_messages(&id).join("\n"));
        let generation = alice.get(&format!("/v1/jobs/{id}"))["generation"]
            .as_u64()
            .unwrap_or(1);
        let store_port = rendezvous_port(id.parse().unwrap(), generation);
        let ranks = [0, 1].map(|r| trainyard_sandbox::netns::rank_address(generation, r));
        Victim {
            id,
            reference,
            test,
            store_port,
            ranks,
        }
    }

    /// It succeeded, and PyTorch judges its downloaded model within 1.5
    /// points of torchrun's on the held-out digits.
    fn trained_like_torchrun(self, p: &Platform, alice: &ApiClient, what: &str) {
        let id = &self.id;
        let job = alice.wait_end(id, Duration::from_secs(600));
        assert_eq!(
            job.state,
            JobState::Succeeded,
            "{job:?}\n{}",
            alice.log_messages(id).join("\n")
        );
        let ours = p.file("victim.pt");
        download(alice, &format!("/v1/jobs/{id}/outputs/model.pt"), &ours);
        let (a, b) = (
            accuracy(&ours, &self.test),
            accuracy(&torchrun_model(p, "torchrun", self.reference), &self.test),
        );
        eprintln!("{what} {a:.4}, torchrun {b:.4}");
        assert!(
            a > 0.9 && (a - b).abs() <= 0.015,
            "{what} {a:.4}, torchrun {b:.4}"
        );
    }
}

/// Runs `netscan.py` as `mallory` with `targets`; its report.
fn attack(p: &Platform, mallory: &ApiClient, targets: &Value) -> Value {
    mallory.upload("netscan.py", &scripts().join("netscan.py"));
    let attacker = mallory.submit(&json!({
        "name": "netscan",
        "script": {"code": "artifact:netscan.py", "args": [targets.to_string()], "max_restarts": 0},
        "workers": {"min": 1, "max": 1},
        "resources": {"memory_mb": 1024},
    }));
    let started = std::time::Instant::now();
    let job = mallory.wait_end(&attacker, Duration::from_secs(600));
    eprintln!("the attack took {:?}", started.elapsed());
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{job:?}\n{}",
        mallory.log_messages(&attacker).join("\n")
    );
    let file = p.file("netscan.json");
    download(
        mallory,
        &format!("/v1/jobs/{attacker}/outputs/report.json"),
        &file,
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    eprintln!("{report:#}");
    report
}

/// Every attempt of the report was refused: on its own loopback only the
/// relay answers (and names nothing), elsewhere nothing at all.
fn assert_all_refused(report: &Value, pg_socket: &Option<String>) {
    for (host, found) in report["open"].as_object().unwrap() {
        let open: Vec<u64> = found["open"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        let expected: &[u64] = if host == "127.0.0.1" { &[999] } else { &[] };
        assert_eq!(open, expected, "{host}: {found}");
    }
    for section in ["tcp", "http", "postgres", "udp", "store"] {
        for (what, result) in report[section].as_object().unwrap() {
            refused(&format!("{section} {what}"), result);
        }
    }
    refused("raw socket", &report["raw"]);
    if let Some(path) = pg_socket {
        assert!(report["postgres"][path].is_string(), "{report}");
    }
}

#[test]
fn a_script_reaches_only_its_own_job() {
    let s3 = TestS3::from_env();
    let p = Platform::builder("netwall")
        .admin_token(ADMIN)
        .no_provisioner()
        .s3(&s3)
        .executor_env("TRAINYARD_TORCH_THREADS", "1")
        .start();
    let mut execs = [p.executor("a"), p.executor("b")];
    let admin = p.with_token(ADMIN);
    let alice: ApiClient = admin.new_user("alice");
    let mallory: ApiClient = admin.new_user("mallory");
    let metadata = Metadata::start().expect("a metadata listener (needs root and ip netns)");
    // Control: this host reaches it.
    let control = reqwest::blocking::get(metadata.url()).expect("the host reaches the metadata");
    assert_eq!(control.status(), 200);

    // The victim: a 2-rank DDP job, and torchrun's run beside it.
    let v = Victim::start(&p, &alice);
    let (store_port, victim_ranks) = (v.store_port, v.ranks);

    let tokens = || {
        let out = std::process::Command::new("psql")
            .args([&p.db, "-Atc", "select count(*) from api_tokens"])
            .output()
            .expect("psql");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let tokens_before = tokens();

    // The attacker.
    let hosts = host_addresses();
    let (pg_host, pg_port, pg_socket) = postgres_of(&p.db);
    if std::env::var_os("TRAINYARD_TEST_PG_SOCKET_DIR").is_some() {
        assert!(
            pg_socket.is_some(),
            "the test database's socket is not where scripts/test says"
        );
    }
    let api = p.client.base.clone();
    let api_addr = api.trim_start_matches("http://").to_owned();
    let s3_addr = s3.endpoint().trim_start_matches("http://").to_owned();
    let data_planes: Vec<String> = admin
        .executors(None)
        .executors
        .iter()
        .map(|e| e.address.clone())
        .collect();
    let mut scan: Vec<String> = vec!["127.0.0.1".into(), "::1".into()];
    scan.extend(hosts.iter().cloned());
    let mut tcp = vec![api_addr, s3_addr, format!("{pg_host}:{pg_port}")];
    tcp.extend(data_planes.iter().cloned());
    let mut stores: Vec<String> = hosts.iter().map(|h| with_port(h, store_port)).collect();
    stores.push(format!("127.0.0.1:{store_port}"));
    // By the victim's rank addresses: the attacker's own relay carries
    // them to its own job only (world 1), never the victim's ranks.
    stores.extend(victim_ranks.map(|a| format!("{a}:{store_port}")));
    let mut udp: Vec<String> = hosts.iter().map(|h| with_port(h, 53)).collect();
    udp.push("169.254.169.254:53".into());
    let targets = json!({
        "scan": scan,
        "tcp": tcp,
        "http": [format!("{api}/v1/executors"), s3.endpoint(), metadata.url()],
        "postgres_tcp": [format!("{pg_host}:{pg_port}"), format!("127.0.0.1:{pg_port}")],
        "postgres_socket": pg_socket,
        "udp": udp,
        "store": stores,
    });
    let report = attack(&p, &mallory, &targets);
    assert_all_refused(&report, &pg_socket);

    // The victim, undisturbed: within 1.5 points of torchrun's run.
    v.trained_like_torchrun(&p, &alice, "victim");

    // Nothing of the platform changed.
    assert_eq!(tokens(), tokens_before, "a token appeared");
    let jobs = admin.get("/v1/jobs?limit=100");
    let names: Vec<&str> = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| j["name"].as_str())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    for e in &mut execs {
        assert!(e.running(), "an executor died: {}", e.output());
    }
}

#[test]
fn a_script_reaches_only_its_own_job_across_hosts() {
    let lab = trainyard_e2e::Lab::new(3)
        .expect("the multi-host lab needs root and network namespaces (ip netns)");
    let p = Platform::builder("netwall-lab")
        .admin_token(ADMIN)
        .no_provisioner()
        .listen_host(&lab.gateway().to_string())
        .start();
    let mut execs: Vec<_> = (0..3)
        .map(|i| {
            lab.executor(
                i,
                &p.client.base,
                p.join_token(),
                &format!("host{i}"),
                3072,
                &[("TRAINYARD_TORCH_THREADS", "1")],
            )
            .unwrap()
        })
        .collect();
    let admin = p.with_token(ADMIN);
    let ready = eventually(Duration::from_secs(60), || {
        (admin.live_executors().len() == 3).then_some(())
    });
    assert!(ready.is_some(), "the three lab executors register");
    let alice: ApiClient = admin.new_user("alice");
    let mallory: ApiClient = admin.new_user("mallory");

    // The victim, one rank on each of two hosts; torchrun's run beside it.
    let v = Victim::start(&p, &alice);
    let (victim, store_port, victim_ranks) = (v.id.clone(), v.store_port, v.ranks);

    // The attacker, on the third executor (the only one with room):
    // every lab host, the gateway (where the API listens), every data
    // plane, the victim's store by every host's address and by the block.
    let mut hosts: Vec<String> = lab.hosts().iter().map(|h| h.addr.to_string()).collect();
    hosts.push(lab.gateway().to_string());
    let mut scan = vec!["127.0.0.1".to_owned(), "::1".to_owned()];
    scan.extend(hosts.iter().cloned());
    let mut tcp: Vec<String> = admin
        .executors(None)
        .executors
        .iter()
        .map(|e| e.address.clone())
        .collect();
    tcp.push(p.client.base.trim_start_matches("http://").to_owned());
    let mut stores: Vec<String> = hosts.iter().map(|h| format!("{h}:{store_port}")).collect();
    stores.extend(victim_ranks.map(|a| format!("{a}:{store_port}")));
    let targets = json!({
        "scan": scan,
        "tcp": tcp,
        "http": [format!("{}/v1/executors", p.client.base)],
        "udp": hosts.iter().map(|h| format!("{h}:53")).collect::<Vec<_>>(),
        "store": stores,
    });
    let report = attack(&p, &mallory, &targets);
    assert_all_refused(&report, &None);

    // The victim ran across two hosts and trained as torchrun did.
    v.trained_like_torchrun(&p, &alice, "victim across hosts");
    let ran_on: std::collections::BTreeSet<String> = alice
        .logs(&victim)
        .iter()
        .filter(|l| l.message.contains("runs train.py"))
        .map(|l| l.executor_id.to_string())
        .collect();
    assert_eq!(ran_on.len(), 2, "the victim's ranks on two hosts");
    for e in &mut execs {
        assert!(e.running(), "an executor died: {}", e.output());
    }
}
