//! A script rank's only ways out: its job's hub on this host, and the
//! relay of its other collective connections.
//!
//! Each slot a script job holds on this executor has a network namespace
//! of its own ([`trainyard_sandbox::netns`]) that the slot's rank and its
//! spare interpreter run in, attached to the job's hub on this host (a
//! bridge every executor here attaches the job's slots to). Each
//! generation gives the slot its rank's address in the generation's own
//! subnet ([`Slot::serve`]), and the slots of the same generation on this
//! host are told of each other (the `here` sets, both ways, whichever
//! executor made them): their ranks meet over the hub, kernel to kernel.
//! Every other TCP connection to the job's block is redirected to this
//! relay's listener inside the namespace, which carries it to the rank it
//! names only if that rank belongs to the same job and generation:
//!
//! * **out** ([`Slot`]'s listener): the rank connects to a peer's address
//!   (its TCPStore at `MASTER_ADDR:MASTER_PORT`, a gloo pair's listener)
//!   that is not here yet or on another host; the relay reads where it was
//!   headed, and opens the same connection in the peer's namespace —
//!   directly when the peer's slot is on this executor, else through the
//!   peer executor's data plane, whose handshake proves the job's secret
//!   and the generation ([`EndpointRole::Script`]), followed by the port;
//! * **in** ([`Slot::serve`]'s endpoint): the data plane hands this rank's
//!   endpoint an authenticated stream and the port; the relay opens that
//!   port on the rank's own address inside its namespace.
//!
//! A connection that names anything else (the namespace's own relay port,
//! an address outside the block, another generation, a rank the world does
//! not have) is closed at once, and a stale generation's peers are refused
//! by the handshake. Bytes are copied as they come, both ways, with Nagle
//! off on every leg.

use crate::role::Role;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown as Direction, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use trainyard_common::cluster::WorkerPeer;
use trainyard_dataplane::handshake::Hello;
use trainyard_dataplane::{EndpointKey, EndpointRole};
use trainyard_sandbox::netns::{self, Hub, Netns};
use trainyard_shutdown::Shutdown;
use uuid::Uuid;

/// How long the relay keeps trying to reach a peer rank's listener (the
/// peer may start later than the rank that calls it, as under torchrun).
pub const REACH_LIMIT: Duration = Duration::from_secs(120);
/// Bytes copied per read.
const CHUNK: usize = 256 << 10;
/// Connections a slot's relay carries at once beyond twice its world
/// (a gloo mesh and its store need about one per peer): past it a new one
/// is closed at once, so that a rank cannot spend the executor's threads.
pub const SPARE_CONNECTIONS: usize = 64;

/// A connection the relay carries, counted while it lives.
struct Carried(Arc<AtomicUsize>);

impl Carried {
    /// Counts one more on `count` unless `limit` are carried already.
    fn take(count: &Arc<AtomicUsize>, limit: usize) -> Option<Carried> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Carried(count.clone()))
    }
}

impl Drop for Carried {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many connections a slot whose world is `world` may carry at once.
fn connection_limit(world: usize) -> usize {
    2 * world + SPARE_CONNECTIONS
}

/// The generation a slot's rank belongs to now.
#[derive(Clone)]
struct World {
    job: Uuid,
    generation: i64,
    rank: u32,
    peers: Vec<WorkerPeer>,
    secret: Vec<u8>,
    stop: Shutdown,
}

/// One slot's namespace and its relay.
pub struct Slot {
    netns: Arc<Netns>,
    world: Arc<Mutex<Option<World>>>,
    closed: Arc<AtomicBool>,
    /// Connections carried now, both ways.
    carried: Arc<AtomicUsize>,
}

type Key = (Uuid, u32);

/// Why a slot's namespace or relay could not be made, or a relayed
/// connection was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The namespace, its hub or its firewall could not be set up.
    #[error("{0}")]
    Namespace(String),
    /// A socket or thread of the relay failed.
    #[error("{what}: {source}")]
    Io {
        /// What, in words.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// A connection the relay does not carry: its destination is not a
    /// rank of this generation of the job.
    #[error("{0}: refused")]
    Refused(String),
    /// The peer's executor could not be reached.
    #[error("rank {rank} at {address}: {source}")]
    Peer {
        /// The peer's rank.
        rank: u32,
        /// Its executor's data-plane address.
        address: String,
        /// Why.
        source: trainyard_dataplane::handshake::HandshakeError,
    },
    /// Nothing listens at the rank's port.
    #[error("nothing listens at {0} in the rank's namespace")]
    NotListening(SocketAddrV4),
}

impl RelayError {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RelayError {
        let what = what.into();
        move |source| RelayError::Io { what, source }
    }
}

fn slots() -> &'static Mutex<HashMap<Key, Arc<Slot>>> {
    static SLOTS: std::sync::OnceLock<Mutex<HashMap<Key, Arc<Slot>>>> = std::sync::OnceLock::new();
    SLOTS.get_or_init(Default::default)
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The slot `slot` of `job` on this executor: its namespace is made (with
/// its relay) the first time.
pub fn slot(job: Uuid, slot: u32) -> Result<Arc<Slot>, RelayError> {
    if let Some(s) = locked(slots()).get(&(job, slot)) {
        return Ok(s.clone());
    }
    let tag = tag_of(job);
    let hub = Hub::ensure(&tag).map_err(RelayError::Namespace)?;
    let netns = Arc::new(
        Netns::create(&format!("{tag}-{slot}"), Some(&hub)).map_err(RelayError::Namespace)?,
    );
    let listener = netns
        .listen(SocketAddrV4::new(Ipv4Addr::LOCALHOST, netns::RELAY_PORT))
        .map_err(RelayError::io(
            "the relay's listener in the rank's namespace",
        ))?;
    listener
        .set_nonblocking(true)
        .map_err(RelayError::io("the relay's listener"))?;
    let made = Arc::new(Slot {
        netns,
        world: Default::default(),
        closed: Default::default(),
        carried: Default::default(),
    });
    let (world, closed, carried) = (
        made.world.clone(),
        made.closed.clone(),
        made.carried.clone(),
    );
    std::thread::Builder::new()
        .name(format!("relay-{slot}"))
        .spawn(move || listen(listener, world, closed, carried))
        .map_err(RelayError::io("the relay's thread"))?;
    let mut all = locked(slots());
    Ok(all.entry((job, slot)).or_insert(made).clone())
}

/// The name a job's namespaces carry on every executor of a host.
fn tag_of(job: Uuid) -> String {
    // Whole: job ids are UUIDv7, whose leading digits are the time of
    // their making, which two jobs of one sweep can share.
    job.simple().to_string()
}

/// Drops every slot of `job` (its namespaces go once their ranks have),
/// and the job's hub here once no executor's slot is attached to it.
pub fn forget(job: Uuid) {
    let gone: Vec<Arc<Slot>> = {
        let mut all = locked(slots());
        let keys: Vec<Key> = all.keys().filter(|(j, _)| *j == job).copied().collect();
        keys.iter().filter_map(|k| all.remove(k)).collect()
    };
    drop(gone);
    // The kernel takes the slots' ports down in the background.
    let tag = tag_of(job);
    std::thread::spawn(move || Hub::remove_if_empty(&tag, Duration::from_secs(5)));
}

/// Drops every slot.
pub fn clear() {
    locked(slots()).clear();
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}

impl Slot {
    /// The namespace's file, for the rank's child to join.
    pub fn netns_path(&self) -> std::path::PathBuf {
        self.netns.path().to_owned()
    }

    /// Makes the slot rank `rank` of `role`'s generation among `peers` (its
    /// address, the world the relay serves) and serves the connections its
    /// peers open to it until the role stops.
    pub fn serve(&self, role: &Role, rank: u32, peers: &[&WorkerPeer]) -> Result<(), RelayError> {
        let a = &role.assignment;
        let generation = a.key.generation as u64;
        let me = self
            .netns
            .set_rank(generation, rank)
            .map_err(RelayError::Namespace)?;
        // The slots of this generation on this host (any executor's) and
        // this one reach each other over the hub.
        for other in netns::job_slots(&tag_of(a.key.job_id)) {
            if other == self.netns.name() {
                continue;
            }
            let Some(addr) = netns::address_of(&other) else {
                continue;
            };
            let same = netns::rank_of(addr).is_some_and(|(g, r)| {
                g == generation % netns::GENERATIONS && peers.iter().any(|p| p.rank == r)
            });
            if same {
                self.netns
                    .add_here(&[addr])
                    .map_err(RelayError::Namespace)?;
                // Best effort: that slot may be going away.
                let _ = netns::add_here_in(&other, &[me]);
            }
        }
        let world = World {
            job: a.key.job_id,
            generation: a.key.generation,
            rank,
            peers: peers.iter().map(|p| (*p).clone()).collect(),
            secret: a.secret.clone().into_bytes(),
            stop: role.stop.clone(),
        };
        let endpoint = role.plane.register(
            EndpointKey {
                job: world.job,
                kind: EndpointRole::Script,
                rank,
            },
            world.generation,
            &world.secret,
        );
        let limit = connection_limit(world.peers.len());
        *locked(&self.world) = Some(world);
        let (netns, stop) = (self.netns.clone(), role.stop.clone());
        let carried = self.carried.clone();
        std::thread::Builder::new()
            .name(format!("relay-in-{rank}"))
            .spawn(move || {
                let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
                while let Some((from, stream)) = endpoint.accept(far, &stop) {
                    let Some(held) = Carried::take(&carried, limit) else {
                        tracing::warn!(rank, "the relay carries its most connections: one refused");
                        continue;
                    };
                    let (netns, stop) = (netns.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let _held = held;
                        if let Err(e) = arrive(stream, &netns, me, &stop) {
                            tracing::debug!(from, rank, error = %e, "a relayed connection in");
                        }
                    });
                }
            })
            .map_err(RelayError::io("the relay's thread"))?;
        Ok(())
    }
}

/// A slot's listener: each connection its rank opens to the job's block.
fn listen(
    listener: TcpListener,
    world: Arc<Mutex<Option<World>>>,
    closed: Arc<AtomicBool>,
    carried: Arc<AtomicUsize>,
) {
    while !closed.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                let w = locked(&world).clone();
                let limit = connection_limit(w.as_ref().map_or(0, |w| w.peers.len()));
                // Dropping the stream closes it: the rank sees a reset.
                let Some(held) = Carried::take(&carried, limit) else {
                    continue;
                };
                std::thread::spawn(move || {
                    let _held = held;
                    if let Err(e) = leave(s, w) {
                        tracing::debug!(error = %e, "a relayed connection out");
                    }
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                tracing::warn!(error = %e, "the relay's listener");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Carries a connection the rank opened to the peer it names.
fn leave(rank_side: TcpStream, world: Option<World>) -> Result<(), RelayError> {
    rank_side
        .set_nonblocking(false)
        .map_err(RelayError::io("the rank's connection"))?;
    let to = netns::original_destination(&rank_side)
        .map_err(RelayError::io("the connection's destination"))?;
    let (generation, target) = netns::rank_of(*to.ip())
        .ok_or_else(|| RelayError::Refused(format!("{to} is not a rank of the job")))?;
    let w = world.ok_or_else(|| RelayError::Refused("the slot serves no generation".into()))?;
    if w.stop.is_triggered() {
        return Err(RelayError::Refused(
            "the rank's generation has ended".into(),
        ));
    }
    if generation != (w.generation as u64) % netns::GENERATIONS {
        return Err(RelayError::Refused(format!("{to} is another generation's")));
    }
    let peer =
        w.peers.iter().find(|p| p.rank == target).ok_or_else(|| {
            RelayError::Refused(format!("rank {target} is not in the job's world"))
        })?;
    // A peer on this executor is reached directly; its generation is
    // checked here, as the data plane's handshake would.
    let local = locked(slots()).values().find_map(|s| {
        let sw = locked(&s.world);
        sw.as_ref()
            .filter(|o| {
                o.job == w.job
                    && o.rank == target
                    && o.generation == w.generation
                    && !o.stop.is_triggered()
            })
            .map(|_| s.netns.clone())
    });
    let peer_side = match local {
        Some(ns) => reach(&ns, to, &w.stop)?,
        None => {
            let hello = Hello {
                job: w.job,
                generation: w.generation,
                kind: EndpointRole::Script as u8,
                from: w.rank,
                to: target,
            };
            let deadline = Instant::now() + REACH_LIMIT;
            let mut s = trainyard_dataplane::plane::connect(
                &peer.address,
                &hello,
                &w.secret,
                deadline,
                &w.stop,
            )
            .map_err(|source| RelayError::Peer {
                rank: target,
                address: peer.address.clone(),
                source,
            })?;
            s.write_all(&to.port().to_be_bytes())
                .map_err(RelayError::io("the relayed port"))?;
            s
        }
    };
    pipe(rank_side, peer_side);
    Ok(())
}

/// Carries a connection a peer opened through the data plane to this
/// slot's rank.
fn arrive(
    mut peer_side: TcpStream,
    netns: &Netns,
    me: Ipv4Addr,
    stop: &Shutdown,
) -> Result<(), RelayError> {
    let mut port = [0u8; 2];
    peer_side
        .set_read_timeout(Some(trainyard_dataplane::plane::HANDSHAKE_TIMEOUT))
        .and_then(|_| peer_side.read_exact(&mut port))
        .and_then(|_| peer_side.set_read_timeout(None))
        .map_err(RelayError::io("the relayed port"))?;
    let rank_side = reach(netns, SocketAddrV4::new(me, u16::from_be_bytes(port)), stop)?;
    pipe(peer_side, rank_side);
    Ok(())
}

/// A connection to `addr` (the rank's address, a port) in `netns`,
/// retried while nothing listens there yet (the rank may not have
/// started).
fn reach(netns: &Netns, addr: SocketAddrV4, stop: &Shutdown) -> Result<TcpStream, RelayError> {
    let deadline = Instant::now() + REACH_LIMIT;
    let mut pause = Duration::from_millis(5);
    loop {
        match netns.connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                if Instant::now() + pause > deadline || stop.sleep(pause) {
                    return Err(RelayError::NotListening(addr));
                }
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(RelayError::Io {
                    what: format!("{addr} in the rank's namespace"),
                    source: e,
                })
            }
        }
    }
}

/// Copies both ways until each side has said all it will.
fn pipe(a: TcpStream, b: TcpStream) {
    for s in [&a, &b] {
        let _ = s.set_nodelay(true);
    }
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let there = std::thread::spawn(move || copy(a2, b2));
    copy(b, a);
    let _ = there.join();
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Direction::Write);
    let _ = from.shutdown(Direction::Read);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_carries_at_most_its_limit_and_frees_each_connection_that_ends() {
        let count = Arc::new(AtomicUsize::new(0));
        let limit = connection_limit(2);
        let held: Vec<Carried> = (0..limit)
            .map(|_| Carried::take(&count, limit).expect("under the limit"))
            .collect();
        assert!(Carried::take(&count, limit).is_none(), "past the limit");
        drop(held);
        assert_eq!(count.load(Ordering::Acquire), 0);
        assert!(Carried::take(&count, limit).is_some());
    }

    #[test]
    fn two_jobs_made_in_one_millisecond_have_different_tags() {
        // UUIDv7: the first 48 bits are the time; only the rest differ.
        let a = Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0001);
        let b = Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0002);
        assert_ne!(tag_of(a), tag_of(b));
    }
}
