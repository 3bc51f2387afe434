//! A multi-host lab on one machine: N network namespaces as hosts, joined
//! by a bridge, each with an address of its own, an optional link rate,
//! and faults injected and healed on a clock.
//!
//! Topology: a bridge `tyb…` in the root namespace holds the lab's gateway
//! address `10.A.B.1/24` (A, B from this process's id and a counter, so
//! parallel labs never share a subnet); host `i` is the namespace
//! `tyh-<pid>-<n>-<i>` with `eth0` (a veth whose other end `tyv…` is on
//! the bridge) at `10.A.B.(10+i)`. The API runs in the root namespace,
//! bound to the gateway address (it reaches the tests' Postgres on
//! loopback there); executors run in the hosts (`ip netns exec`), bound to
//! their host's address. Every address a lab test uses is one the lab made.
//!
//! Faults (each a [`Fault`] that heals when dropped, when
//! [`Fault::heal`] is called, or by itself after the duration it was given,
//! whichever comes first — a fault never outlives its bound):
//!
//! * [`Lab::link_down`] — a host's link goes down (the bridge side of its
//!   veth): cut from everyone, the API included;
//! * [`Lab::cut`] — two hosts cannot reach each other (a `blackhole` route
//!   to the other's address in each; the kernel here has no `tc` drop
//!   action and no `netem`);
//! * [`Lab::cut_from_gateway`] — a host and the API's address cannot reach
//!   each other, its peers still can;
//! * [`Lab::set_rate`] — a host's link rate in both directions (`tbf` on
//!   each end of its veth), or back to unlimited.
//!
//! Namespaces and links are removed when the [`Lab`] is dropped (also when
//! the test panics); ones left by a process that died (SIGKILLed tests)
//! are swept by the next [`Lab::new`]. The lab needs root and network
//! namespaces ([`Lab::available`] says whether this machine has them).

use anyhow::{bail, Context};
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

static LABS: AtomicU32 = AtomicU32::new(0);

/// Runs `ip ARGS` (or another program), failing with its stderr.
fn sh(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// One host of a lab.
#[derive(Debug, Clone)]
pub struct Host {
    /// Its network namespace.
    pub netns: String,
    /// The bridge side of its veth (in the root namespace).
    pub veth: String,
    /// Its address.
    pub addr: Ipv4Addr,
}

/// A lab of hosts (see the module docs).
pub struct Lab {
    bridge: String,
    gateway: Ipv4Addr,
    hosts: Vec<Host>,
}

impl Lab {
    /// Whether this machine can make labs: root, `ip netns` and veths.
    pub fn available() -> bool {
        let name = format!("tyh-probe-{:x}", std::process::id());
        let ok = sh("ip", &["netns", "add", &name]).is_ok();
        let _ = sh("ip", &["netns", "del", &name]);
        ok
    }

    /// Removes the namespaces and bridges of labs whose process is gone.
    fn sweep() {
        let alive = |pid: &str| {
            u32::from_str_radix(pid, 16)
                .is_ok_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
        };
        if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let name = line.split_whitespace().next().unwrap_or_default();
                if let Some(rest) = name.strip_prefix("tyh-") {
                    let pid = rest.split('-').next().unwrap_or_default();
                    if pid != "probe" && !alive(pid) {
                        let _ = sh("ip", &["netns", "del", name]);
                    }
                }
            }
        }
        if let Ok(out) = Command::new("ip")
            .args(["-o", "link", "show", "type", "bridge"])
            .output()
        {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let name = line.split(':').nth(1).unwrap_or_default().trim();
                // tyb<pid hex>x<n>
                if let Some(rest) = name.strip_prefix("tyb") {
                    if let Some((pid, _)) = rest.split_once('x') {
                        if !alive(pid) {
                            let _ = sh("ip", &["link", "del", name]);
                        }
                    }
                }
            }
        }
    }

    /// Builds a lab of `hosts` hosts (at most 200).
    pub fn new(hosts: usize) -> anyhow::Result<Lab> {
        anyhow::ensure!(hosts <= 200, "at most 200 hosts");
        Lab::sweep();
        let pid = std::process::id();
        let n = LABS.fetch_add(1, Ordering::Relaxed);
        // 10.A.B.0/24: A in 128..=191 and B from the pid and the counter.
        let a = 128 + (pid % 64) as u8;
        let b = ((pid / 64 + n * 37) % 256) as u8;
        let gateway = Ipv4Addr::new(10, a, b, 1);
        let mut lab = Lab {
            bridge: format!("tyb{pid:x}x{n:x}"),
            gateway,
            hosts: Vec::new(),
        };
        sh("ip", &["link", "add", &lab.bridge, "type", "bridge"])?;
        sh(
            "ip",
            &["addr", "add", &format!("{gateway}/24"), "dev", &lab.bridge],
        )?;
        sh("ip", &["link", "set", &lab.bridge, "up"])?;
        for i in 0..hosts {
            let host = Host {
                netns: format!("tyh-{pid:x}-{n:x}-{i}"),
                veth: format!("tyv{pid:x}x{n:x}h{i:x}"),
                addr: Ipv4Addr::new(10, a, b, 10 + i as u8),
            };
            anyhow::ensure!(
                host.veth.len() <= 15,
                "interface name {} too long",
                host.veth
            );
            sh("ip", &["netns", "add", &host.netns])?;
            // Pushed before the links so that Drop removes whatever exists.
            lab.hosts.push(host.clone());
            sh(
                "ip",
                &[
                    "link",
                    "add",
                    &host.veth,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    &host.netns,
                ],
            )?;
            sh(
                "ip",
                &["link", "set", &host.veth, "master", &lab.bridge, "up"],
            )?;
            let ns = |args: &[&str]| {
                let mut all = vec!["-n", host.netns.as_str()];
                all.extend_from_slice(args);
                sh("ip", &all)
            };
            ns(&["addr", "add", &format!("{}/24", host.addr), "dev", "eth0"])?;
            ns(&["link", "set", "eth0", "up"])?;
            ns(&["link", "set", "lo", "up"])?;
        }
        Ok(lab)
    }

    /// The gateway's address (in the root namespace: where the API binds).
    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    /// Host `i`.
    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// The hosts.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// A command that runs `program` inside host `i`.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.hosts[i].netns])
            .arg(program);
        cmd
    }

    /// Starts `trainyard-executor` named `name` in host `i`, its data plane
    /// bound to the host's address, registering with the API at `api` with
    /// `join`, offering `ram_mb`, with `env` added.
    pub fn executor(
        &self,
        i: usize,
        api: &str,
        join: &str,
        name: &str,
        ram_mb: u32,
        env: &[(&str, &str)],
    ) -> anyhow::Result<crate::Proc> {
        let mut cmd = self.command(i, crate::binary("trainyard-executor")?);
        cmd.args([
            "--api",
            api,
            "--join-token",
            join,
            "--name",
            name,
            "--ram-mb",
            &ram_mb.to_string(),
            "--torch-threads",
            "1",
            "--data-listen",
            &format!("{}:0", self.hosts[i].addr),
        ]);
        cmd.env(
            "TRAINYARD_CACHE_DIR",
            std::env::temp_dir().join(format!("ty-lab-cache-{}-{name}", std::process::id())),
        );
        for (k, v) in env {
            cmd.env(k, v);
        }
        crate::Proc::spawn(cmd)
    }

    /// Sets host `i`'s link rate in both directions (`None`: unlimited).
    pub fn set_rate(&self, i: usize, mbit: Option<u64>) -> anyhow::Result<()> {
        let h = &self.hosts[i];
        let ends: [(&[&str], &str); 2] = [(&["-n", &h.netns], "eth0"), (&[], &h.veth)];
        for (prefix, dev) in ends {
            let run = |args: &[&str]| {
                let mut all: Vec<&str> = prefix.to_vec();
                all.extend_from_slice(args);
                sh("tc", &all)
            };
            let _ = run(&["qdisc", "del", "dev", dev, "root"]);
            if let Some(m) = mbit {
                // A burst of 1 ms at the rate (at least 64 KiB), queueing
                // at most 50 ms.
                let burst = (m * 1_000_000 / 8 / 1000).max(64 * 1024);
                run(&[
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    &format!("{m}mbit"),
                    "burst",
                    &burst.to_string(),
                    "latency",
                    "50ms",
                ])?;
            }
        }
        Ok(())
    }

    /// Host `i`'s link is down for at most `bound`.
    pub fn link_down(&self, i: usize, bound: Duration) -> anyhow::Result<Fault> {
        let veth = self.hosts[i].veth.clone();
        sh("ip", &["link", "set", &veth, "down"])?;
        Ok(Fault::new(
            format!("host {i}'s link down"),
            bound,
            vec![vec![
                "ip".into(),
                "link".into(),
                "set".into(),
                veth,
                "up".into(),
            ]],
        ))
    }

    /// Hosts `i` and `j` cannot reach each other, for at most `bound`.
    pub fn cut(&self, i: usize, j: usize, bound: Duration) -> anyhow::Result<Fault> {
        let (hi, hj) = (&self.hosts[i], &self.hosts[j]);
        let mut heal = Vec::new();
        for (from, to) in [(hi, hj), (hj, hi)] {
            let target = format!("{}/32", to.addr);
            sh(
                "ip",
                &["-n", &from.netns, "route", "add", "blackhole", &target],
            )?;
            heal.push(
                [
                    "ip",
                    "-n",
                    &from.netns,
                    "route",
                    "del",
                    "blackhole",
                    &target,
                ]
                .map(String::from)
                .to_vec(),
            );
        }
        Ok(Fault::new(format!("hosts {i} and {j} cut"), bound, heal))
    }

    /// Host `i` and the gateway (the API) cannot reach each other, for at
    /// most `bound`; its peers still reach it.
    pub fn cut_from_gateway(&self, i: usize, bound: Duration) -> anyhow::Result<Fault> {
        let h = &self.hosts[i];
        let gw = format!("{}/32", self.gateway);
        let host = format!("{}/32", h.addr);
        sh("ip", &["-n", &h.netns, "route", "add", "blackhole", &gw])?;
        let mut heal = vec![["ip", "-n", &h.netns, "route", "del", "blackhole", &gw]
            .map(String::from)
            .to_vec()];
        sh("ip", &["route", "add", "blackhole", &host])?;
        heal.push(
            ["ip", "route", "del", "blackhole", &host]
                .map(String::from)
                .to_vec(),
        );
        Ok(Fault::new(
            format!("host {i} cut from the API"),
            bound,
            heal,
        ))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for h in &self.hosts {
            // Removing the namespace removes its veth pair.
            let _ = sh("ip", &["netns", "del", &h.netns]);
            let _ = sh("ip", &["link", "del", &h.veth]);
            let _ = sh(
                "ip",
                &["route", "del", "blackhole", &format!("{}/32", h.addr)],
            );
        }
        let _ = sh("ip", &["link", "del", &self.bridge]);
    }
}

/// An injected fault; healed once, at the first of: [`Fault::heal`], drop,
/// or its bound running out (a thread of its own heals it then).
pub struct Fault {
    what: String,
    heal: Arc<Mutex<Option<Vec<Vec<String>>>>>,
}

impl Fault {
    fn new(what: String, bound: Duration, heal: Vec<Vec<String>>) -> Fault {
        let heal = Arc::new(Mutex::new(Some(heal)));
        let timer = heal.clone();
        let label = what.clone();
        std::thread::spawn(move || {
            std::thread::sleep(bound);
            if run_heal(&timer) {
                eprintln!("lab: {label} healed by its bound ({bound:?})");
            }
        });
        Fault { what, heal }
    }

    /// What the fault is.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// Heals it now (nothing if it already healed).
    pub fn heal(&self) {
        run_heal(&self.heal);
    }
}

/// Runs the healing commands once; whether this call ran them.
fn run_heal(heal: &Mutex<Option<Vec<Vec<String>>>>) -> bool {
    let Some(cmds) = heal.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return false;
    };
    for c in cmds {
        let args: Vec<&str> = c[1..].iter().map(String::as_str).collect();
        if let Err(e) = sh(&c[0], &args) {
            eprintln!("lab: healing failed: {e}");
        }
    }
    true
}

impl Drop for Fault {
    fn drop(&mut self) {
        self.heal();
    }
}
