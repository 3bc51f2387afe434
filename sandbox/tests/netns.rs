//! The network layer of script ranks against the real kernel: a probe in a
//! rank's namespace tries every way out a script could, and the same
//! attempt outside the namespace is the control that shows the refusal
//! comes from the layer. Then the one way that is meant to work: a
//! connection to the job's block lands on the relay, which learns where
//! it was headed, and the executor's marked connection reaches the rank.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::time::Duration;
use trainyard_sandbox::netns::{self, Hub, Netns};
use trainyard_sandbox::spawn::{run, Spec};
use trainyard_sandbox::{Confinement, Limits};

const PROBE: &str = env!("CARGO_BIN_EXE_trainyard-sandbox-probe");

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Files as a script's confinement would have them, the network left to
/// the namespace (no Landlock TCP rules), capabilities dropped.
fn confinement() -> Confinement {
    Confinement {
        read_only: vec![],
        read_write: vec![std::env::temp_dir()],
        connect_tcp: None,
        bind_tcp: None,
        limits: Limits::default(),
    }
}

fn probe(ns: Option<&Netns>, attempt: Value) -> (bool, String) {
    let spec = Spec {
        program: PROBE.into(),
        args: vec![],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        identity: None,
        limits: Limits::default(),
        name: "netns-probe".into(),
        fd3: None,
        netns: ns.map(|n| n.path().to_owned()),
        private_shm_mb: None,
        private_tmp: None,
    };
    let task = json!({ "confinement": confinement(), "attempt": attempt }).to_string() + "\n";
    let (_, out, err) = run(
        &spec,
        task.as_bytes(),
        Some(Duration::from_secs(30)),
        &|| false,
        1 << 16,
    )
    .expect("the probe starts");
    let v: Value = serde_json::from_slice(&out).unwrap_or(Value::Null);
    (
        v["ok"].as_bool().unwrap_or(false),
        v["detail"]
            .as_str()
            .map_or_else(|| format!("no answer; stderr: {err}"), str::to_owned),
    )
}

/// This host's first address that is not a loopback one.
fn host_address() -> Option<std::net::IpAddr> {
    nix::ifaddrs::getifaddrs().ok()?.find_map(|i| {
        let a = i.address?;
        let v4 = a.as_sockaddr_in().map(|s| std::net::IpAddr::V4(s.ip()));
        v4.filter(|ip| !ip.is_loopback())
    })
}

#[test]
fn without_root_the_layer_says_why_it_is_missing() {
    if root() {
        assert_eq!(netns::probe(), Ok(()), "the executor's host must offer it");
    } else {
        assert!(netns::probe().is_err());
    }
}

#[test]
fn a_rank_namespace_has_no_way_out() {
    if !root() {
        return;
    }
    let ns = Netns::create("test-out", None).unwrap();
    ns.set_rank(1, 1).unwrap();
    // The host's services: on its loopback (v4 and v6) and its own address.
    let v4 = TcpListener::bind("127.0.0.1:0").unwrap();
    let v6 = TcpListener::bind("[::1]:0").unwrap();
    let any = TcpListener::bind("0.0.0.0:0").unwrap();
    let mut targets = vec![
        v4.local_addr().unwrap().to_string(),
        v6.local_addr().unwrap().to_string(),
    ];
    if let Some(ip) = host_address() {
        targets.push(std::net::SocketAddr::new(ip, any.local_addr().unwrap().port()).to_string());
    }
    for t in &targets {
        let (ok, detail) = probe(None, json!({ "connect": t }));
        assert!(ok, "control: the host's {t} is reachable outside: {detail}");
        let (ok, detail) = probe(Some(&ns), json!({ "connect": t }));
        assert!(!ok, "a rank reached the host's {t}");
        assert!(
            detail.contains("refused") || detail.contains("unreachable"),
            "{t}: {detail}"
        );
    }
    // Metadata, another host, the executors' network; UDP; raw and ICMP.
    for t in ["169.254.169.254:80", "10.0.0.1:5432", "[2001:db8::1]:80"] {
        let (ok, detail) = probe(Some(&ns), json!({ "connect": t }));
        assert!(!ok && detail.contains("unreachable"), "{t}: {detail}");
    }
    for t in ["169.254.169.254:53", "8.8.8.8:53", "[2001:db8::1]:53"] {
        let (ok, detail) = probe(Some(&ns), json!({ "udp": t }));
        assert!(!ok && detail.contains("unreachable"), "udp {t}: {detail}");
    }
    if let Some(ip) = host_address() {
        let t = std::net::SocketAddr::new(ip, 53).to_string();
        let (ok, detail) = probe(Some(&ns), json!({ "udp": t }));
        assert!(!ok && detail.contains("unreachable"), "udp {t}: {detail}");
    }
    let (ok, detail) = probe(Some(&ns), json!("raw"));
    assert!(!ok, "a raw socket: {detail}");
    let (ok, detail) = probe(Some(&ns), json!("ping"));
    assert!(!ok, "an ICMP echo left: {detail}");
}

#[test]
fn the_relay_learns_where_a_rank_connection_was_headed_and_reaches_the_rank() {
    if !root() {
        return;
    }
    let ns = Netns::create("test-relay", None).unwrap();
    ns.set_rank(1, 0).unwrap();
    let relay = ns
        .listen(SocketAddrV4::new(Ipv4Addr::LOCALHOST, netns::RELAY_PORT))
        .unwrap();
    let peer = netns::rank_address(1, 8);
    let t = std::thread::spawn(move || {
        probe(Some(&ns), json!({ "connect": format!("{peer}:4321") })).0
    });
    let (s, _) = relay.accept().unwrap();
    assert_eq!(
        netns::original_destination(&s).unwrap(),
        SocketAddrV4::new(peer, 4321)
    );
    assert!(
        t.join().unwrap(),
        "the rank's connection landed on the relay"
    );

    // The executor's own (marked) connection into the namespace passes the
    // redirect and reaches what the rank listens on at its address.
    let ns = Netns::create("test-in", None).unwrap();
    ns.set_rank(1, 2).unwrap();
    let me = SocketAddrV4::new(netns::rank_address(1, 2), 5555);
    let rank = ns.listen(me).unwrap();
    let _relay = ns
        .listen(SocketAddrV4::new(Ipv4Addr::LOCALHOST, netns::RELAY_PORT))
        .unwrap();
    let mut c = ns.connect(me).unwrap();
    c.write_all(b"hello").unwrap();
    let (mut r, _) = rank.accept().unwrap();
    let mut got = [0u8; 5];
    r.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello");
}

/// A connection that went to the relay because its peer was not here yet
/// (a rank's TCPStore connection, when rank 0's slot starts later) stays
/// on the relay once the peer is here: the redirect is kept per connection
/// by connection tracking, so no later packet of it may skip tracking.
#[test]
fn a_relayed_connection_stays_relayed_when_its_peer_arrives() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    if !root() {
        return;
    }
    let ns = Netns::create("test-late", None).unwrap();
    ns.set_rank(1, 0).unwrap();
    let relay = ns
        .listen(SocketAddrV4::new(Ipv4Addr::LOCALHOST, netns::RELAY_PORT))
        .unwrap();
    let peer = netns::rank_address(1, 1);
    // The rank: a plain (unmarked) connection to its peer, echoing lines.
    let mut rank = Command::new("ip")
        .args(["netns", "exec", ns.name(), "python3", "-c"])
        .arg(
            "import socket, sys\n\
             c = socket.create_connection((sys.argv[1], 4321))\n\
             for line in sys.stdin:\n    \
                 c.sendall(line.encode())\n    \
                 print(c.recv(100).decode().strip(), flush=True)\n",
        )
        .arg(peer.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut s, _) = relay.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut to_rank = rank.stdin.take().unwrap();
    let mut from_rank = std::io::BufReader::new(rank.stdout.take().unwrap());
    let mut round_trip = |word: &str| -> String {
        writeln!(to_rank, "{word}").unwrap();
        let mut got = [0u8; 64];
        let n = s
            .read(&mut got)
            .unwrap_or_else(|e| panic!("the relay did not get {word:?}: {e}"));
        s.write_all(&got[..n]).unwrap();
        let mut line = String::new();
        from_rank.read_line(&mut line).unwrap();
        line.trim().to_owned()
    };
    assert_eq!(round_trip("before"), "before");
    ns.add_here(&[peer]).unwrap();
    assert_eq!(
        round_trip("after"),
        "after",
        "the connection left the relay"
    );
    let _ = rank.kill();
    let _ = rank.wait();
}

/// A hub just made is empty until its maker attaches a slot: a sweep by
/// another executor (or its probe) in that moment leaves it alone, so the
/// slot still joins it. (Sweeping every empty hub took such a hub away
/// under a concurrent test: `Invalid "netns" value`.)
#[test]
fn a_sweep_leaves_a_hub_just_made_to_its_maker() {
    if !root() {
        return;
    }
    let tag = format!("s{}", std::process::id());
    let hub = Hub::ensure(&tag).unwrap();
    netns::sweep_stale();
    let slot = Netns::create(&format!("{tag}-0"), Some(&hub)).expect("the hub survived the sweep");
    drop(slot);
    assert!(Hub::remove_if_empty(&tag, Duration::from_secs(5)));
}

#[test]
fn ranks_of_one_generation_on_one_host_meet_over_their_jobs_hub_and_no_one_else_does() {
    if !root() {
        return;
    }
    let tag = format!("t{}", std::process::id());
    let hub = Hub::ensure(&tag).unwrap();
    let a = Netns::create(&format!("{tag}-0"), Some(&hub)).unwrap();
    let b = Netns::create(&format!("{tag}-1"), Some(&hub)).unwrap();
    let (ga, gb) = (a.set_rank(3, 0).unwrap(), b.set_rank(3, 1).unwrap());
    assert_eq!(netns::job_slots(&tag).len(), 2);
    assert_eq!(netns::address_of(b.name()), Some(gb));
    a.add_here(&[gb]).unwrap();
    b.add_here(&[ga]).unwrap();
    // Rank 1 listens on its address; rank 0's connection goes straight
    // over the hub (no relay listens in rank 0's namespace).
    let listener = b.listen(SocketAddrV4::new(gb, 7000)).unwrap();
    let target = format!("{gb}:7000");
    let t = std::thread::spawn(move || listener.accept().map(|_| ()));
    let (ok, detail) = probe(Some(&a), json!({ "connect": target }));
    assert!(ok, "over the hub: {detail}");
    t.join().unwrap().unwrap();

    // Another job's slot on this host (its own hub): nothing but its relay.
    let other_hub = Hub::ensure(&format!("{tag}x")).unwrap();
    let c = Netns::create(&format!("{tag}x-0"), Some(&other_hub)).unwrap();
    c.set_rank(3, 2).unwrap();
    let second = b.listen(SocketAddrV4::new(gb, 7001)).unwrap();
    let (ok, detail) = probe(Some(&c), json!({ "connect": format!("{gb}:7001") }));
    assert!(!ok, "another job reached rank 1: {detail}");
    // Even told the address is here, it has no path to it.
    c.add_here(&[gb]).unwrap();
    let (ok, detail) = probe(Some(&c), json!({ "connect": format!("{gb}:7001") }));
    assert!(!ok, "another job reached rank 1 over its own hub: {detail}");

    // Generation 4 on the same hub has no route to generation 3's ranks.
    let d = Netns::create(&format!("{tag}-2"), Some(&hub)).unwrap();
    d.set_rank(4, 0).unwrap();
    d.add_here(&[gb]).unwrap();
    let (ok, detail) = probe(Some(&d), json!({ "connect": format!("{gb}:7001") }));
    assert!(!ok, "a later generation reached an earlier one: {detail}");
    // A hub goes with its job's last slot here (a socket keeps its
    // namespace, and so its port, alive).
    drop((second, a, b, d));
    assert!(!Hub::remove_if_empty(&format!("{tag}x"), Duration::ZERO));
    drop(c);
    for t in [tag.clone(), format!("{tag}x")] {
        assert!(Hub::remove_if_empty(&t, Duration::from_secs(5)), "{t}");
        let left: Vec<_> = std::fs::read_dir(netns::NETNS_DIR)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&format!("{}hub-{t}-", netns::PREFIX)))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
