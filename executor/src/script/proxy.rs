//! The only way out of a package install's network namespace: an HTTP
//! proxy the executor runs on the namespace's loopback, which carries a
//! connection to the package index the admin configured
//! (`--package-index`, and the hosts it serves files from) and refuses
//! every other destination. The installer (uv) reaches the index through
//! it (`HTTPS_PROXY`), TLS end to end; a package's build step, which runs
//! code, reaches nothing else: not the platform's API or database, not the
//! host's other services, not another job.
//!
//! Both forms an HTTP client sends a proxy are served: `CONNECT host:port`
//! (a tunnel, for `https://`) and an absolute-form request (`GET
//! http://host:port/path`, for a plain-HTTP index), one destination per
//! connection.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest request head the proxy reads, bytes.
const MAX_HEAD: usize = 16 * 1024;
/// Connections one install's proxy carries at once; more are closed at
/// once (a build step cannot make the executor hold a thread each).
pub const MAX_CONNECTIONS: usize = 64;
/// How long a destination may take to accept.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// A destination: host (name or address, lower case) and port.
pub type Destination = (String, u16);

/// The proxy of one install: serving until dropped.
pub struct Proxy {
    stop: Arc<AtomicBool>,
    refused: Arc<Mutex<Vec<Destination>>>,
}

impl Proxy {
    /// Serves `listener` (opened inside the install's namespace), carrying
    /// connections to `allowed` only.
    pub fn serve(listener: TcpListener, allowed: Vec<Destination>) -> io::Result<Proxy> {
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let allowed = Arc::new(allowed);
        let (s, r) = (stop.clone(), refused.clone());
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                            open.fetch_sub(1, Ordering::SeqCst);
                            drop(client);
                            continue;
                        }
                        let (allowed, refused, open) = (allowed.clone(), r.clone(), open.clone());
                        std::thread::spawn(move || {
                            struct Done(Arc<std::sync::atomic::AtomicUsize>);
                            impl Drop for Done {
                                fn drop(&mut self) {
                                    self.0.fetch_sub(1, Ordering::SeqCst);
                                }
                            }
                            let _done = Done(open);
                            let _ = client.set_nonblocking(false);
                            let refuse = |d: Destination| {
                                if let Ok(mut r) = refused.lock() {
                                    if r.len() < 32 && !r.contains(&d) {
                                        r.push(d);
                                    }
                                }
                            };
                            let _ = carry(client, &allowed, &refuse);
                        });
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        Ok(Proxy { stop, refused })
    }

    /// The destinations it refused, in order (at most 32).
    pub fn refused(&self) -> Vec<Destination> {
        self.refused.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One client connection; a destination that is not allowed goes to
/// `refuse` (before the client hears so).
fn carry(
    client: TcpStream,
    allowed: &[Destination],
    refuse: &dyn Fn(Destination),
) -> Result<(), Option<Destination>> {
    let _ = client.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(client.try_clone().map_err(|_| None)?);
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = reader
            .by_ref()
            .take((MAX_HEAD - head.len()) as u64)
            .read_until(b'\n', &mut line)
            .map_err(|_| None)?;
        if n == 0 {
            return Err(None);
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" || line == b"\n" {
            break;
        }
        if head.len() >= MAX_HEAD {
            return Err(None);
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let request_line = text.lines().next().unwrap_or_default().to_owned();
    let Some(request) = parse(&request_line) else {
        let _ = (&client).write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n");
        return Err(None);
    };
    let dest = request.destination();
    if !allowed.contains(&dest) {
        refuse(dest.clone());
        let _ = (&client)
            .write_all(b"HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
        return Err(Some(dest));
    }
    let upstream = connect(&dest).map_err(|_| {
        let _ = (&client).write_all(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n");
        None
    })?;
    let _ = client.set_read_timeout(None);
    match &request {
        Request::Connect { .. } => {
            (&client)
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .map_err(|_| None)?;
        }
        Request::Absolute { method, path, .. } => {
            // Origin form for the server; the rest of the head as sent.
            let rest = &text[request_line.len()..];
            let version = request_line.rsplit(' ').next().unwrap_or("HTTP/1.1");
            let head = format!("{method} {path} {version}{rest}");
            (&upstream).write_all(head.as_bytes()).map_err(|_| None)?;
        }
    }
    // What the reader took past the head goes first.
    let buffered = reader.buffer().to_vec();
    if !buffered.is_empty() {
        (&upstream).write_all(&buffered).map_err(|_| None)?;
    }
    splice(client, upstream);
    Ok(())
}

fn connect(dest: &Destination) -> io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = io::Error::other("no address");
    for addr in (dest.0.as_str(), dest.1).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Copies both ways until either side closes.
fn splice(a: TcpStream, b: TcpStream) {
    let (a2, b2) = match (a.try_clone(), b.try_clone()) {
        (Ok(a2), Ok(b2)) => (a2, b2),
        _ => return,
    };
    let one = std::thread::spawn(move || {
        let (mut from, mut to) = (a2, b2);
        let _ = io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
    let (mut from, mut to) = (b, a);
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
    let _ = one.join();
}

/// What a client asked the proxy for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// `CONNECT host:port`.
    Connect {
        /// The host, lower case.
        host: String,
        /// The port.
        port: u16,
    },
    /// `METHOD http://host[:port]/path`.
    Absolute {
        /// The method.
        method: String,
        /// The host, lower case.
        host: String,
        /// The port (80 when not given).
        port: u16,
        /// The path and query (origin form).
        path: String,
    },
}

impl Request {
    fn destination(&self) -> Destination {
        match self {
            Request::Connect { host, port } | Request::Absolute { host, port, .. } => {
                (host.clone(), *port)
            }
        }
    }
}

/// Parses a proxy request's first line (`None`: not one this proxy
/// serves).
pub fn parse(line: &str) -> Option<Request> {
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return None;
    }
    if method == "CONNECT" {
        let (host, port) = split_host(target, None)?;
        return Some(Request::Connect { host, port });
    }
    if !method.chars().all(|c| c.is_ascii_uppercase()) || method.is_empty() {
        return None;
    }
    let rest = target.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = split_host(authority, Some(80))?;
    Some(Request::Absolute {
        method: method.to_owned(),
        host,
        port,
        path: path.to_owned(),
    })
}

/// `host:port` (or `[v6]:port`; `default` when there is no port), lower
/// case; `None` for userinfo, an empty host or a bad port.
fn split_host(authority: &str, default: Option<u16>) -> Option<(String, u16)> {
    if authority.contains('@') || authority.is_empty() {
        return None;
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, rest) = v6.split_once(']')?;
        match rest.strip_prefix(':') {
            Some(p) => (h, p.parse().ok()?),
            None if rest.is_empty() => (h, default?),
            None => return None,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().ok()?),
            None => (authority, default?),
        }
    };
    if host.is_empty() || port == 0 {
        return None;
    }
    Some((host.to_ascii_lowercase(), port))
}

/// Why a package index's URL (`--package-index`) cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexUrlError {
    /// Not `http://` or `https://`.
    #[error("{0:?} is not an http(s) URL")]
    NotHttp(String),
    /// No host, or port 0.
    #[error("{0:?} has no usable host")]
    NoHost(String),
}

/// The destinations an index at `url` needs: its own host and port, and
/// for the public index (`pypi.org`) the host it serves files from.
pub fn index_destinations(url: &str) -> Result<Vec<Destination>, IndexUrlError> {
    let not_http = || IndexUrlError::NotHttp(url.to_owned());
    let (scheme, rest) = url.split_once("://").ok_or_else(not_http)?;
    let default = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return Err(not_http()),
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let dest = split_host(authority, Some(default))
        .ok_or_else(|| IndexUrlError::NoHost(url.to_owned()))?;
    let mut out = vec![dest.clone()];
    if dest.0 == "pypi.org" {
        out.push(("files.pythonhosted.org".into(), 443));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn both_forms_of_a_proxy_request_are_read() {
        assert_eq!(
            parse("CONNECT pypi.org:443 HTTP/1.1"),
            Some(Request::Connect {
                host: "pypi.org".into(),
                port: 443
            })
        );
        assert_eq!(
            parse("GET http://127.0.0.1:8123/simple/tqdm/ HTTP/1.1"),
            Some(Request::Absolute {
                method: "GET".into(),
                host: "127.0.0.1".into(),
                port: 8123,
                path: "/simple/tqdm/".into()
            })
        );
        assert_eq!(
            parse("GET http://Index.Example HTTP/1.0").map(|r| r.destination()),
            Some(("index.example".into(), 80))
        );
        for bad in [
            "CONNECT pypi.org HTTP/1.1",
            "CONNECT user@pypi.org:443 HTTP/1.1",
            "GET /relative HTTP/1.1",
            "GET https://pypi.org/ HTTP/1.1",
            "GET http://:80/ HTTP/1.1",
            "CONNECT pypi.org:0 HTTP/1.1",
            "CONNECT pypi.org:443 HTTP/2",
            "CONNECT pypi.org:443 HTTP/1.1 extra",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_index_names_its_hosts() {
        assert_eq!(
            index_destinations("https://pypi.org/simple").unwrap(),
            vec![
                ("pypi.org".to_owned(), 443),
                ("files.pythonhosted.org".to_owned(), 443)
            ]
        );
        assert_eq!(
            index_destinations("http://127.0.0.1:8123/simple/").unwrap(),
            vec![("127.0.0.1".to_owned(), 8123)]
        );
        assert!(index_destinations("file:///srv/wheels").is_err());
    }

    #[test]
    fn only_the_allowed_destination_is_carried() {
        let index = TcpListener::bind("127.0.0.1:0").unwrap();
        let index_port = index.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = index.accept().unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap();
            s.write_all(&buf[..n]).unwrap();
        });
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let other_port = other.local_addr().unwrap().port();
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = front.local_addr().unwrap();
        let proxy = Proxy::serve(front, vec![("127.0.0.1".into(), index_port)]).unwrap();
        let mut c = TcpStream::connect(addr).unwrap();
        write!(
            c,
            "CONNECT 127.0.0.1:{index_port} HTTP/1.1\r\nHost: x\r\n\r\nping"
        )
        .unwrap();
        let mut got = vec![0u8; 39 + 4];
        c.read_exact(&mut got).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            "HTTP/1.1 200 Connection established\r\n\r\nping"
        );
        let mut d = TcpStream::connect(addr).unwrap();
        write!(d, "CONNECT 127.0.0.1:{other_port} HTTP/1.1\r\n\r\n").unwrap();
        let mut answer = String::new();
        d.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        assert_eq!(proxy.refused(), vec![("127.0.0.1".to_owned(), other_port)]);
    }

    #[test]
    fn connections_past_the_cap_are_closed_at_once() {
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = front.local_addr().unwrap();
        let _proxy = Proxy::serve(front, vec![]).unwrap();
        // Idle connections hold their threads (each waits for a head).
        let held: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let mut extra = TcpStream::connect(addr).unwrap();
        extra
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(
            extra.read(&mut buf).unwrap(),
            0,
            "the connection past the cap was served"
        );
        drop(held);
    }

    proptest! {
        #[test]
        fn no_request_line_makes_it_panic(line in "\\PC{0,80}") {
            let _ = parse(&line);
        }

        #[test]
        fn a_connect_names_exactly_its_destination(host in "[a-z][a-z0-9.-]{0,30}", port in 1u16..) {
            let r = parse(&format!("CONNECT {host}:{port} HTTP/1.1")).unwrap();
            prop_assert_eq!(r.destination(), (host, port));
        }
    }
}
