//! The network layer of script ranks: a network namespace per rank slot,
//! with nothing in it that leads out, and a relay the executor owns.
//!
//! A script rank speaks gloo (and its TCPStore) to its peers, on ports it
//! picks, so rules by port (Landlock's) cannot confine it. Instead it runs
//! in a network namespace of its own ([`Netns`]) that holds only a loopback
//! interface and an interface without ports (`ty0`, a bridge nothing is
//! attached to) that carries the rank's own address. There is no route to
//! the host, its loopback services, its other addresses, other jobs,
//! link-local or metadata addresses, over IPv4 or IPv6, by TCP, UDP or raw
//! sockets: the namespace has no way out to leave by.
//!
//! Its job's world is addressed in `10.77.0.0/16` ([`rank_address`]: rank
//! `r` is `10.77.0.0 + r + 1`). That whole block is local to the namespace,
//! and an nftables rule in it redirects every TCP connection to it to the
//! relay's listener on the namespace's loopback ([`RELAY_PORT`]), which the
//! executor opened inside the namespace ([`Netns::listen`]). The executor
//! reads where the connection was headed ([`original_destination`]), checks
//! that it names a rank of the same job's current generation, and carries
//! it to that rank: through the peer executor's data plane, whose handshake
//! proves the job's secret and generation, and into the peer rank's
//! namespace by a connection the peer executor opens there
//! ([`Netns::connect`], marked with [`MARK`] so that the redirect lets it
//! pass). So a rank reaches its own job's ranks of its own generation and
//! nothing else, on one host and across hosts, and nothing reaches it but
//! them.
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
pub const SUBNET: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 0);
/// Its prefix length.
pub const SUBNET_BITS: u8 = 16;
/// Most ranks the block addresses.
pub const MAX_RANKS: u32 = (1 << (32 - SUBNET_BITS as u32)) - 2;
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
/// The prefix of the namespaces' names (then the executor's pid).
pub const PREFIX: &str = "trainyard-";

/// The address of rank `rank` inside its job's namespaces.
pub fn rank_address(rank: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(SUBNET) + rank.min(MAX_RANKS) + 1)
}

/// The rank an address inside the block names (`None`: not one).
pub fn rank_of(addr: Ipv4Addr) -> Option<u32> {
    let a = u32::from(addr);
    let base = u32::from(SUBNET);
    let mask = !0u32 << (32 - SUBNET_BITS as u32);
    if a & mask != base {
        return None;
    }
    let r = (a - base).checked_sub(1)?;
    (r < MAX_RANKS).then_some(r)
}

/// The nftables rules of a rank's namespace.
fn ruleset() -> String {
    format!(
        "table ip trainyard {{\n\
         \tchain relay {{\n\
         \t\ttype nat hook output priority -100; policy accept;\n\
         \t\tmeta mark {MARK:#x} accept\n\
         \t\tip daddr {SUBNET}/{SUBNET_BITS} meta l4proto tcp redirect to :{RELAY_PORT}\n\
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

/// One rank slot's network namespace (deleted when dropped).
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
}

impl Netns {
    /// Makes namespace `name` (its full name is [`PREFIX`], this process's
    /// id, then `name`) with its loopback, the rank interface, the block's
    /// route and the relay's redirect. Needs `CAP_SYS_ADMIN` and
    /// `CAP_NET_ADMIN` (the executor runs as root to confine users' code).
    pub fn create(name: &str) -> Result<Netns, String> {
        let name = format!("{PREFIX}{}-{name}", std::process::id());
        let path = Path::new(NETNS_DIR).join(&name);
        if path.exists() {
            let _ = run("ip", &["netns", "delete", &name], None);
        }
        run("ip", &["netns", "add", &name], None)?;
        let me = Netns { name, path };
        let n = me.name.as_str();
        let block = format!("{SUBNET}/{SUBNET_BITS}");
        run("ip", &["-n", n, "link", "set", "lo", "up"], None)?;
        run(
            "ip",
            &["-n", n, "link", "add", INTERFACE, "type", "bridge"],
            None,
        )?;
        run("ip", &["-n", n, "link", "set", INTERFACE, "up"], None)?;
        run(
            "ip",
            &[
                "-n", n, "route", "add", "local", &block, "dev", "lo", "table", "local",
            ],
            None,
        )?;
        run(
            "ip",
            &["netns", "exec", n, "nft", "-f", "-"],
            Some(&ruleset()),
        )?;
        Ok(me)
    }

    /// Gives the namespace rank `rank`'s address (the one before goes).
    pub fn set_rank(&self, rank: u32) -> Result<(), String> {
        let n = self.name.as_str();
        run("ip", &["-n", n, "addr", "flush", "dev", INTERFACE], None)?;
        let addr = format!("{}/32", rank_address(rank));
        run(
            "ip",
            &["-n", n, "addr", "add", &addr, "dev", INTERFACE],
            None,
        )
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
    let ns = Netns::create(&format!("probe{n}"))?;
    ns.set_rank(0)?;
    let l = ns
        .listen(SocketAddrV4::new(Ipv4Addr::LOCALHOST, RELAY_PORT))
        .map_err(|e| format!("a listener in the namespace: {e}"))?;
    drop(l);
    Ok(())
}

/// Removes the namespaces an executor that is gone left behind (its pid is
/// in their names).
pub fn sweep_stale() {
    for e in std::fs::read_dir(NETNS_DIR).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
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
        fn a_rank_address_names_its_rank(rank in 0u32..MAX_RANKS) {
            prop_assert_eq!(rank_of(rank_address(rank)), Some(rank));
        }

        #[test]
        fn addresses_outside_the_block_name_no_rank(a: u32) {
            let addr = Ipv4Addr::from(a);
            let inside = a >> 16 == u32::from(SUBNET) >> 16;
            if !inside {
                prop_assert_eq!(rank_of(addr), None);
            }
        }
    }

    #[test]
    fn the_block_edges_name_no_rank() {
        assert_eq!(rank_of(SUBNET), None);
        assert_eq!(rank_of(Ipv4Addr::new(10, 77, 255, 255)), None);
        assert_eq!(rank_of(Ipv4Addr::LOCALHOST), None);
        assert_eq!(rank_address(0), Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(rank_address(256), Ipv4Addr::new(10, 77, 1, 1));
    }
}
