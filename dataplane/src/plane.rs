//! The executor's data-plane listener and the endpoints roles register on it.
//!
//! One listener serves every role of an executor. A role registers an
//! [`Endpoint`] under (job, role kind, rank) with its generation and the
//! job's secret; each incoming connection is authenticated by
//! [`crate::handshake`] on a short-lived thread and then handed to the
//! endpoint it names. A caller from an older generation is told it is stale;
//! one from a newer generation (whose endpoint here has not restarted yet)
//! is told to retry. Dropping an endpoint unregisters it.

use crate::handshake::{self, HandshakeError, Hello, Status, CHALLENGE_LEN, HELLO_LEN, MAC_LEN};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use trainyard_shutdown::Shutdown;
use uuid::Uuid;

/// How long a peer may take to complete the handshake (in all, not per read).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Handshakes served at once.
pub const MAX_HANDSHAKES: usize = 64;

/// The kind of endpoint a connection is for (a data-plane endpoint's role;
/// not the scheduler's `trainyard_common::cluster::RoleKind`, which names
/// the role an executor is assigned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EndpointRole {
    /// A rank of a ring all-reduce.
    Ring = 1,
    /// A parameter-server shard.
    ParameterServer = 2,
    /// A script rank's network namespace: the stream is a relayed TCP
    /// connection of the rank's collectives, opened with the port it was
    /// headed to (two bytes, big-endian) after the handshake.
    Script = 3,
}

impl EndpointRole {
    fn from_byte(b: u8) -> Option<EndpointRole> {
        match b {
            1 => Some(EndpointRole::Ring),
            2 => Some(EndpointRole::ParameterServer),
            3 => Some(EndpointRole::Script),
            _ => None,
        }
    }
}

/// What an endpoint is registered under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    /// The job.
    pub job: Uuid,
    /// The role kind.
    pub kind: EndpointRole,
    /// The rank or shard index.
    pub rank: u32,
}

struct Registered {
    id: u64,
    generation: i64,
    secret: Vec<u8>,
    tx: Sender<(u32, TcpStream)>,
}

#[derive(Default)]
struct Inner {
    endpoints: Mutex<HashMap<EndpointKey, Registered>>,
    next_id: AtomicU64,
    shutdown: Shutdown,
    refused: AtomicU64,
    handshaking: std::sync::atomic::AtomicUsize,
}

/// The listener.
pub struct DataPlane {
    addr: SocketAddr,
    inner: Arc<Inner>,
}

/// A registered endpoint: where authenticated connections for it arrive.
pub struct Endpoint {
    key: EndpointKey,
    id: u64,
    rx: Receiver<(u32, TcpStream)>,
    inner: Arc<Inner>,
}

impl DataPlane {
    /// Binds `addr` and starts accepting.
    pub fn bind(addr: impl ToSocketAddrs) -> std::io::Result<DataPlane> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner::default());
        let accept_inner = inner.clone();
        std::thread::Builder::new()
            .name("dataplane-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if accept_inner.shutdown.is_triggered() {
                        return;
                    }
                    let Ok(stream) = conn else {
                        // Out of descriptors, say: do not spin.
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    // Strangers cannot take every thread: beyond this many
                    // handshakes in flight, new connections are dropped.
                    if accept_inner.handshaking.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
                        accept_inner.handshaking.fetch_sub(1, Ordering::AcqRel);
                        accept_inner.refused.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let inner = accept_inner.clone();
                    let _ = std::thread::Builder::new()
                        .name("dataplane-handshake".into())
                        .spawn(move || {
                            serve(stream, &inner);
                            inner.handshaking.fetch_sub(1, Ordering::AcqRel);
                        });
                }
            })?;
        Ok(DataPlane { addr, inner })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections refused so far (bad MAC, stale generation, malformed).
    pub fn refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// Registers (or replaces) the endpoint `key` for `generation`.
    pub fn register(&self, key: EndpointKey, generation: i64, secret: &[u8]) -> Endpoint {
        let (tx, rx) = channel();
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let mut map = self
            .inner
            .endpoints
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        map.insert(
            key,
            Registered {
                id,
                generation,
                secret: secret.to_vec(),
                tx,
            },
        );
        Endpoint {
            key,
            id,
            rx,
            inner: self.inner.clone(),
        }
    }
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        self.inner.shutdown.trigger();
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

impl Endpoint {
    /// The key it is registered under.
    pub fn key(&self) -> EndpointKey {
        self.key
    }

    /// The next authenticated connection: the caller's rank and the stream.
    /// Waits until `deadline`, giving up early once `stop` is triggered.
    pub fn accept(&self, deadline: Instant, stop: &Shutdown) -> Option<(u32, TcpStream)> {
        loop {
            if stop.is_triggered() {
                return None;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            match self.rx.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(c) => return Some(c),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let mut map = self
            .inner
            .endpoints
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if map.get(&self.key).is_some_and(|r| r.id == self.id) {
            map.remove(&self.key);
        }
    }
}

fn serve(mut stream: TcpStream, inner: &Inner) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let _ = stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let challenge = handshake::challenge();
    if stream.write_all(&challenge).is_err() {
        return;
    }
    let mut msg = [0u8; HELLO_LEN + MAC_LEN];
    let never = Shutdown::new();
    let mut patient = crate::frame::Patient {
        stream: &mut stream,
        stop: &never,
        deadline: Some(Instant::now() + HANDSHAKE_TIMEOUT),
    };
    if patient.read_exact(&mut msg).is_err() {
        inner.refused.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let (status, generation, hand_over) = judge(inner, &challenge, &msg);
    if status != Status::Ok {
        inner
            .refused
            .fetch_add(u64::from(status != Status::NotReady), Ordering::Relaxed);
    }
    if stream
        .write_all(&handshake::reply(status, generation))
        .is_err()
    {
        return;
    }
    if let Some((from, tx)) = hand_over {
        let _ = stream.set_read_timeout(None);
        let _ = stream.set_write_timeout(None);
        let _ = tx.send((from, stream));
    }
}

type HandOver = Option<(u32, Sender<(u32, TcpStream)>)>;

fn judge(
    inner: &Inner,
    challenge: &[u8; CHALLENGE_LEN],
    msg: &[u8; HELLO_LEN + MAC_LEN],
) -> (Status, i64, HandOver) {
    let mut h = [0u8; HELLO_LEN];
    h.copy_from_slice(&msg[..HELLO_LEN]);
    let Some(hello) = Hello::decode(&h) else {
        return (Status::Refused, 0, None);
    };
    let Some(kind) = EndpointRole::from_byte(hello.kind) else {
        return (Status::Refused, 0, None);
    };
    let key = EndpointKey {
        job: hello.job,
        kind,
        rank: hello.to,
    };
    let map = inner.endpoints.lock().unwrap_or_else(|p| p.into_inner());
    let Some(ep) = map.get(&key) else {
        return (Status::NotReady, 0, None);
    };
    if !handshake::verify(&ep.secret, challenge, &h, &msg[HELLO_LEN..]) {
        return (Status::Refused, 0, None);
    }
    if hello.generation < ep.generation {
        return (Status::Stale, ep.generation, None);
    }
    if hello.generation > ep.generation {
        return (Status::NotReady, ep.generation, None);
    }
    (Status::Ok, ep.generation, Some((hello.from, ep.tx.clone())))
}

/// Connects to the endpoint `hello` names at `addr`, retrying while the
/// peer is not listening or not ready, until `deadline` or `stop`.
pub fn connect(
    addr: &str,
    hello: &Hello,
    secret: &[u8],
    deadline: Instant,
    stop: &Shutdown,
) -> Result<TcpStream, HandshakeError> {
    let mut backoff = Duration::from_millis(10);
    loop {
        let attempt = (|| {
            let sock = addr
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| std::io::Error::other(format!("{addr} resolves to nothing")))?;
            let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(2))?;
            s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
            s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
            s.set_nodelay(true)?;
            handshake::call(&mut s, hello, secret)?;
            s.set_read_timeout(None)?;
            s.set_write_timeout(None)?;
            Ok::<_, HandshakeError>(s)
        })();
        match attempt {
            Ok(s) => return Ok(s),
            Err(HandshakeError::NotReady | HandshakeError::Io(_) | HandshakeError::Protocol)
                if Instant::now() + backoff < deadline && !stop.is_triggered() =>
            {
                stop.sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(job: Uuid, generation: i64) -> Hello {
        Hello {
            job,
            generation,
            kind: EndpointRole::Ring as u8,
            from: 0,
            to: 1,
        }
    }

    #[test]
    fn only_the_right_secret_and_generation_get_through() {
        let plane = DataPlane::bind("127.0.0.1:0").unwrap();
        let addr = plane.local_addr().to_string();
        let job = Uuid::new_v4();
        let key = EndpointKey {
            job,
            kind: EndpointRole::Ring,
            rank: 1,
        };
        let stop = Shutdown::new();
        let soon = || Instant::now() + Duration::from_millis(300);
        // Nobody registered yet: not ready until the deadline.
        assert!(matches!(
            connect(&addr, &hello(job, 2), b"k", soon(), &stop),
            Err(HandshakeError::NotReady)
        ));
        let ep = plane.register(key, 2, b"k");
        assert!(matches!(
            connect(&addr, &hello(job, 2), b"wrong", soon(), &stop),
            Err(HandshakeError::Refused)
        ));
        assert!(matches!(
            connect(&addr, &hello(job, 1), b"k", soon(), &stop),
            Err(HandshakeError::Stale(2))
        ));
        let mut s = connect(&addr, &hello(job, 2), b"k", soon(), &stop).unwrap();
        let (from, mut t) = ep.accept(soon(), &stop).unwrap();
        assert_eq!(from, 0);
        s.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        t.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        assert_eq!(plane.refused(), 2);
        drop(ep);
        assert!(matches!(
            connect(&addr, &hello(job, 2), b"k", soon(), &stop),
            Err(HandshakeError::NotReady)
        ));
    }

    #[test]
    fn garbage_is_refused_without_harm() {
        let plane = DataPlane::bind("127.0.0.1:0").unwrap();
        let mut s = TcpStream::connect(plane.local_addr()).unwrap();
        let mut ch = [0u8; CHALLENGE_LEN];
        s.read_exact(&mut ch).unwrap();
        s.write_all(&[0xAB; HELLO_LEN + MAC_LEN]).unwrap();
        let mut r = [0u8; handshake::REPLY_LEN];
        s.read_exact(&mut r).unwrap();
        assert_eq!(r[0], Status::Refused as u8);
    }
}
