//! The network layer of script ranks: a network namespace per rank slot,
//! joined on one host by a bridge of the job's own, and a relay the
//! executor owns for everything else.
//!
//! A script rank speaks gloo (and its TCPStore) to its peers, on ports it
//! picks, so rules by port (Landlock's) cannot confine it. Instead it runs
//! in a network namespace of its own ([`Netns`]) that holds a loopback and
//! `ty0`, one end of a veth pair whose other end is a port of the job's
//! hub on this host ([`Hub`]: a namespace holding only a bridge). There is
//! no route to the host, its loopback services, its other addresses, other
//! jobs (whose hubs are others), link-local or metadata addresses, over
//! IPv4 or IPv6, by TCP, UDP or raw sockets: nothing leads out.
//!
//! A job's ranks are addressed in [`BLOCK`], one `/16` per generation
//! ([`rank_address`]: generation `g`, rank `r` is `10.(64 + g mod 64).0.0 +
//! r + 1`), so a rank of one generation has no route to another's. Ranks
//! of the same generation whose slots are on this host reach each other
//! over the hub, kernel to kernel, at loopback speed; each slot's nftables
//! set `here` lists their addresses ([`Netns::add_here`]). Every other TCP
//! connection to the block is redirected to the relay's listener on the
//! namespace's loopback ([`RELAY_PORT`]), which the executor opened inside
//! the namespace ([`Netns::listen`]). The executor reads where the
//! connection was headed ([`original_destination`]), checks that it names
//! a rank of the same job's current generation, and carries it there:
//! through the peer executor's data plane, whose handshake proves the job's
//! secret and generation, and into the peer rank's namespace by a
//! connection the peer executor opens there ([`Netns::connect`], marked
//! with [`MARK`] so that the redirect lets it pass). So a rank reaches its
//! own job's ranks of its own generation and nothing else, on one host and
//! across hosts, and nothing reaches it but them.
//!
//! The namespaces are made and configured with `ip` and `nft` (the same
//! kernel interfaces an admin would use, and readable as such in the
//! docs); the child joins its slot's namespace before it executes
//! anything ([`crate::spawn::Spec::netns`]).

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The block a job's ranks are addressed in, inside their namespaces.
pub const BLOCK: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 0);
/// Its prefix length.
pub const BLOCK_BITS: u8 = 10;
/// Generations the block tells apart (one `/16` each, in turn).
pub const GENERATIONS: u64 = 64;
/// Most ranks a generation's `/16` addresses.
pub const MAX_RANKS: u32 = (1 << 16) - 2;
/// The relay's port on each namespace's loopback: below 1024, so that the
/// rank (without `CAP_NET_BIND_SERVICE`) cannot take it first.
pub const RELAY_PORT: u16 = 999;
/// The mark of the executor's own connections into a namespace, which the
/// redirect lets pass (setting a mark needs `CAP_NET_ADMIN`; a rank has
/// none).
pub const MARK: u32 = 0x7479_0001;
/// The interface that carries the rank's address (what gloo binds).
pub const INTERFACE: &str = "ty0";
/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";
/// The prefix of the namespaces' names (then the executor's pid, or `hub`).
pub const PREFIX: &str = "trainyard-";
/// The bridge in a hub.
const BRIDGE: &str = "br0";

/// The address of rank `rank` of generation `generation` inside its job's
/// namespaces.
pub fn rank_address(generation: u64, rank: u32) -> Ipv4Addr {
    let g = ((generation % GENERATIONS) as u32) << 16;
    Ipv4Addr::from(u32::from(BLOCK) + g + rank.min(MAX_RANKS - 1) + 1)
}

/// The generation (modulo [`GENERATIONS`]) and rank an address inside the
/// block names (`None`: not one).
pub fn rank_of(addr: Ipv4Addr) -> Option<(u64, u32)> {
    let a = u32::from(addr);
    let base = u32::from(BLOCK);
    let mask = !0u32 << (32 - BLOCK_BITS as u32);
    if a & mask != base {
        return None;
    }
    let off = a - base;
    let (g, r) = (u64::from(off >> 16), (off & 0xffff).checked_sub(1)?);
    (r < MAX_RANKS).then_some((g, r))
}

/// The nftables rules of a rank's namespace.
fn ruleset() -> String {
    format!(
        "table ip trainyard {{\n\
         \tset here {{\n\
         \t\ttype ipv4_addr;\n\
         \t}}\n\
         \tchain relay {{\n\
         \t\ttype nat hook output priority -100; policy accept;\n\
         \t\tmeta mark {MARK:#x} accept\n\
         \t\tip daddr {BLOCK}/{BLOCK_BITS} ip daddr != @here meta l4proto tcp redirect to :{RELAY_PORT}\n\
         \t}}\n\
         }}\n"
    )
}

/// A program of the admin's (`ip`, `nft`): the first found in the usual
/// system folders, which a service's `PATH` may lack.
fn tool(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<(), String> {
    let path = tool(program).ok_or_else(|| format!("`{program}` is not installed"))?;
    let mut cmd = Command::new(&path);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        pipe.write_all(text.as_bytes())
            .map_err(|e| format!("{program}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A job's hub on this host: a namespace holding only a bridge, to which
/// every slot of the job here is attached. Shared by the executors of
/// one host (named after the job alone), made by the first that needs it
/// and removed by the last that leaves it ([`Hub::remove_if_empty`]).
#[derive(Debug, Clone)]
pub struct Hub {
    name: String,
}

/// This process's view of the named namespaces: its mount namespace. A
/// namespace made from another mount namespace (another host of a test
/// lab, a container) has its name in `/run/netns` but is not mounted here.
fn view() -> String {
    std::fs::read_link("/proc/self/ns/mnt")
        .ok()
        .and_then(|l| {
            let l = l.to_string_lossy().into_owned();
            let inner = l.strip_prefix("mnt:[")?.strip_suffix(']')?.to_owned();
            Some(inner)
        })
        .unwrap_or_else(|| "0".into())
}

/// Whether some process still lives in mount namespace `inode`.
fn view_alive(inode: &str) -> bool {
    let wanted = format!("mnt:[{inode}]");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .any(|e| {
            std::fs::read_link(e.path().join("ns/mnt")).is_ok_and(|l| l.to_string_lossy() == wanted)
        })
}

/// The name of the hub of the job tagged `tag` in this view.
fn hub_name(tag: &str) -> String {
    format!("{PREFIX}hub-{tag}-{}", view())
}

impl Hub {
    /// The hub of the job tagged `tag` (made if missing). The executors
    /// that share it are those of this host that see the same named
    /// namespaces (the same mount namespace).
    pub fn ensure(tag: &str) -> Result<Hub, String> {
        let hub = Hub {
            name: hub_name(tag),
        };
        let n = hub.name.as_str();
        if !Path::new(NETNS_DIR).join(n).exists() {
            // Another executor may make it at the same moment.
            if let Err(e) = run("ip", &["netns", "add", n], None) {
                if !Path::new(NETNS_DIR).join(n).exists() {
                    return Err(e);
                }
            }
        }
        // Another executor that made the namespace a moment ago may not
        // have mounted it or added its bridge yet: a few tries.
        let mut last = String::new();
        for _ in 0..40 {
            if run("ip", &["-n", n, "link", "show", BRIDGE], None).is_ok()
                || run(
                    "ip",
                    &["-n", n, "link", "add", BRIDGE, "type", "bridge"],
                    None,
                )
                .is_ok()
            {
                run("ip", &["-n", n, "link", "set", BRIDGE, "up"], None)?;
                return Ok(hub);
            }
            last = format!("the hub {n} has no bridge and none can be added");
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        Err(last)
    }

    /// Removes the hub once no slot is attached to it, waiting up to
    /// `patience` for the kernel to take down the ports of namespaces
    /// just deleted (it does so in the background); whether it is gone.
    pub fn remove_if_empty(tag: &str, patience: std::time::Duration) -> bool {
        remove_hub_if_empty(&hub_name(tag), patience)
    }
}

/// Removes hub `name` once no slot is attached to it (see
/// [`Hub::remove_if_empty`]); one this view cannot enter is left alone.
fn remove_hub_if_empty(name: &str, patience: std::time::Duration) -> bool {
    let until = std::time::Instant::now() + patience;
    loop {
        match hub_ports(name) {
            Some(0) => return run("ip", &["netns", "delete", name], None).is_ok(),
            None => return !Path::new(NETNS_DIR).join(name).exists(),
            Some(_) if std::time::Instant::now() >= until => return false,
            Some(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

/// How many slots are attached to hub `name` (`None`: it cannot be read).
fn hub_ports(name: &str) -> Option<usize> {
    let path = tool("ip")?;
    let out = Command::new(path)
        .args(["-n", name, "-o", "link", "show", "master", BRIDGE])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).lines().count())
}

/// Runs the admin's `program` inside namespace `ns` (by its full path: a
/// service's `PATH` may lack the system folders).
fn run_in(ns: &str, program: &str, args: &[&str], stdin: Option<&str>) -> Result<(), String> {
    let path = tool(program).ok_or_else(|| format!("`{program}` is not installed"))?;
    let path = path.to_string_lossy();
    let mut all = vec!["netns", "exec", ns, path.as_ref()];
    all.extend_from_slice(args);
    run("ip", &all, stdin)
}

/// One rank slot's network namespace (deleted when dropped).
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
}

static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Netns {
    /// Makes a slot's namespace named [`PREFIX`], this process's id, then
    /// `name`, with its loopback, `ty0`, the block's route and the relay's
    /// redirect. `ty0` is attached to `hub` when given (a script rank's),
    /// else to nothing (a bridge without ports: the rank alone). Needs
    /// `CAP_SYS_ADMIN` and `CAP_NET_ADMIN` (the executor runs as root to
    /// confine users' code).
    pub fn create(name: &str, hub: Option<&Hub>) -> Result<Netns, String> {
        let name = format!("{PREFIX}{}-{name}", std::process::id());
        let path = Path::new(NETNS_DIR).join(&name);
        if path.exists() {
            let _ = run("ip", &["netns", "delete", &name], None);
        }
        run("ip", &["netns", "add", &name], None)?;
        let me = Netns { name, path };
        let n = me.name.as_str();
        run("ip", &["-n", n, "link", "set", "lo", "up"], None)?;
        // No IPv6 on `ty0` (a link-local address would reach every slot of
        // the hub, of any generation), and ARP answers only a neighbour in
        // the same generation's subnet.
        run_in(
            n,
            "sysctl",
            &[
                "-q",
                "-w",
                "net.ipv6.conf.default.disable_ipv6=1",
                "net.ipv4.conf.all.arp_ignore=2",
                "net.ipv4.conf.all.arp_announce=2",
            ],
            None,
        )?;
        match hub {
            Some(hub) => {
                // Unique in the hub among every executor's slots here.
                let k = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let port = format!("y{}.{k}", std::process::id());
                run(
                    "ip",
                    &[
                        "-n", n, "link", "add", INTERFACE, "type", "veth", "peer", "name", &port,
                        "netns", &hub.name,
                    ],
                    None,
                )?;
                run(
                    "ip",
                    &["-n", &hub.name, "link", "set", &port, "master", BRIDGE],
                    None,
                )?;
                run("ip", &["-n", &hub.name, "link", "set", &port, "up"], None)?;
            }
            None => run(
                "ip",
                &["-n", n, "link", "add", INTERFACE, "type", "bridge"],
                None,
            )?,
        }
        run("ip", &["-n", n, "link", "set", INTERFACE, "up"], None)?;
        let block = format!("{BLOCK}/{BLOCK_BITS}");
        run(
            "ip",
            &["-n", n, "route", "add", &block, "dev", INTERFACE],
            None,
        )?;
        run_in(n, "nft", &["-f", "-"], Some(&ruleset()))?;
        Ok(me)
    }

    /// Gives the namespace rank `rank`'s address of `generation` (the one
    /// before goes) and forgets which ranks were here.
    pub fn set_rank(&self, generation: u64, rank: u32) -> Result<Ipv4Addr, String> {
        let n = self.name.as_str();
        run_in(n, "nft", &["flush", "set", "ip", "trainyard", "here"], None)?;
        run("ip", &["-n", n, "addr", "flush", "dev", INTERFACE], None)?;
        let me = rank_address(generation, rank);
        run(
            "ip",
            &[
                "-n",
                n,
                "addr",
                "add",
                &format!("{me}/16"),
                "dev",
                INTERFACE,
            ],
            None,
        )?;
        self.add_here(&[me])?;
        Ok(me)
    }

    /// Lets the rank reach `addrs` directly (they are ranks of its
    /// generation on this host, attached to the same hub).
    pub fn add_here(&self, addrs: &[Ipv4Addr]) -> Result<(), String> {
        add_here_in(&self.name, addrs)
    }

    /// The rank address the namespace holds now, if any.
    pub fn address(&self) -> Option<Ipv4Addr> {
        address_of(&self.name)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its file (what a child joins, [`crate::spawn::Spec::netns`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a thread that has joined the namespace: the sockets it
    /// makes belong to the namespace for good.
    fn inside<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let file = std::fs::File::open(&self.path)?;
        std::thread::spawn(move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)?;
            f()
        })
        .join()
        .map_err(|_| io::Error::other("a thread in the namespace panicked"))?
    }

    /// A listener on `addr` inside the namespace.
    pub fn listen(&self, addr: SocketAddrV4) -> io::Result<TcpListener> {
        self.inside(move || TcpListener::bind(addr))
    }

    /// A connection to `addr` inside the namespace, marked so that the
    /// relay's redirect lets it through.
    pub fn connect(&self, addr: SocketAddrV4) -> io::Result<TcpStream> {
        use nix::sys::socket::{
            connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
        };
        self.inside(move || {
            let fd = socket(
                AddressFamily::Inet,
                SockType::Stream,
                SockFlag::SOCK_CLOEXEC,
                None,
            )?;
            setsockopt(&fd, sockopt::Mark, &MARK)?;
            connect(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                &SockaddrIn::from(addr),
            )?;
            Ok(TcpStream::from(fd))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = run("ip", &["netns", "delete", &self.name], None) {
            tracing::warn!(netns = %self.name, error = %e, "a rank's network namespace stays");
        }
    }
}

/// Adds `addrs` to the `here` set of the slot namespace `name` (another
/// executor's, on this host).
pub fn add_here_in(name: &str, addrs: &[Ipv4Addr]) -> Result<(), String> {
    if addrs.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = addrs.iter().map(Ipv4Addr::to_string).collect();
    let set = format!("{{ {} }}", list.join(", "));
    run_in(
        name,
        "nft",
        &["add", "element", "ip", "trainyard", "here", &set],
        None,
    )
}

/// The rank address slot namespace `name` holds on `ty0`, if any.
pub fn address_of(name: &str) -> Option<Ipv4Addr> {
    let out = Command::new(tool("ip")?)
        .args(["-n", name, "-4", "-o", "addr", "show", "dev", INTERFACE])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace().skip_while(|w| *w != "inet");
    words.next()?;
    words.next()?.split('/').next()?.parse().ok()
}

/// The slot namespaces of the job tagged `tag` on this host, every
/// executor's (their names end in `-{tag}-{slot}`).
pub fn job_slots(tag: &str) -> Vec<String> {
    let needle = format!("-{tag}-");
    let mut names: Vec<String> = std::fs::read_dir(NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(PREFIX) && !n.starts_with(&format!("{PREFIX}hub-")))
        .filter(|n| n.contains(&needle))
        .collect();
    names.sort();
    names
}

/// Where a connection the relay accepted was headed before the redirect.
pub fn original_destination(s: &TcpStream) -> io::Result<SocketAddrV4> {
    let a = nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::OriginalDst)?;
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
        u16::from_be(a.sin_port),
    ))
}

/// Whether this kernel and host can make the layer: a namespace with its
/// rules is made and removed (why not, when not).
pub fn probe() -> Result<(), String> {
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    sweep_stale();
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ns = Netns::create(&format!("probe{n}"), None)?;
    ns.set_rank(1, 0)?;
    let l = ns
        .listen(SocketAddrV4::new(Ipv4Addr::LOCALHOST, RELAY_PORT))
        .map_err(|e| format!("a listener in the namespace: {e}"))?;
    drop(l);
    Ok(())
}

/// How long an empty hub of this view is left to the executor that made
/// it before a sweep may take it for a leftover.
pub const HUB_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long ago hub `name` was made (its namespace file's time), if it
/// can be read.
fn hub_age(name: &str) -> Option<std::time::Duration> {
    let made = std::fs::metadata(Path::new(NETNS_DIR).join(name))
        .ok()?
        .modified()
        .ok()?;
    made.elapsed().ok()
}

/// Removes the namespaces an executor that is gone left behind (its pid is
/// in their names), and the empty hubs that have stood past [`HUB_GRACE`].
pub fn sweep_stale() {
    for e in std::fs::read_dir(NETNS_DIR).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        if let Some(hub) = rest.strip_prefix("hub-") {
            // A hub of a view no process has any more (a test lab's host,
            // a container, gone without cleaning up) is only a file here.
            let view_of = hub.rsplit('-').next().unwrap_or_default();
            if view_of != view() && !view_alive(view_of) {
                let _ = std::fs::remove_file(Path::new(NETNS_DIR).join(&name));
            } else if hub_age(&name).is_some_and(|a| a >= HUB_GRACE) {
                // A hub made a moment ago is empty until its maker attaches
                // its slot: only one that has stood a while is a leftover.
                remove_hub_if_empty(&name, std::time::Duration::ZERO);
            }
            continue;
        }
        let pid: Option<i32> = rest.split('-').next().and_then(|p| p.parse().ok());
        let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let _ = run("ip", &["netns", "delete", &name], None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_rank_address_names_its_generation_and_rank(g in 0u64..1_000_000, rank in 0u32..MAX_RANKS) {
            prop_assert_eq!(rank_of(rank_address(g, rank)), Some((g % GENERATIONS, rank)));
        }

        #[test]
        fn consecutive_generations_never_share_a_subnet(g in 0u64..1_000_000, rank in 0u32..MAX_RANKS) {
            let (a, b) = (rank_address(g, rank), rank_address(g + 1, rank));
            prop_assert_ne!(u32::from(a) >> 16, u32::from(b) >> 16);
        }

        #[test]
        fn addresses_outside_the_block_name_no_rank(a: u32) {
            let inside = a >> (32 - BLOCK_BITS) == u32::from(BLOCK) >> (32 - BLOCK_BITS);
            if !inside {
                prop_assert_eq!(rank_of(Ipv4Addr::from(a)), None);
            }
        }
    }

    #[test]
    fn the_subnet_edges_name_no_rank() {
        assert_eq!(rank_of(BLOCK), None);
        assert_eq!(rank_of(Ipv4Addr::new(10, 64, 255, 255)), None);
        assert_eq!(rank_of(Ipv4Addr::LOCALHOST), None);
        assert_eq!(rank_address(1, 0), Ipv4Addr::new(10, 65, 0, 1));
        assert_eq!(rank_address(65, 256), Ipv4Addr::new(10, 65, 1, 1));
        assert_eq!(rank_of(Ipv4Addr::new(10, 127, 0, 1)), Some((63, 0)));
        assert_eq!(rank_of(Ipv4Addr::new(10, 128, 0, 1)), None);
    }
}
