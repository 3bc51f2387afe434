//! `trainyard-sandbox-probe`: the sandbox's test subject.
//!
//! It reads one JSON line from stdin — a [`Confinement`] (or none) and one
//! attempt — enters the confinement, makes the attempt and prints what
//! happened as one JSON line: `{"ok": true|false, "detail": "..."}`. The
//! sandbox's tests run each attempt once confined and once not, so that a
//! refusal is shown to come from the layer under test. `trainyard-executor
//! --sandbox-check` runs the same attempts on a live machine.

// Raw system calls (keyctl, perf_event_open, bpf, process_vm_readv) that
// no safe wrapper offers: each is called with arguments that touch no
// memory of ours beyond locals, and only their return value is read.
#![allow(unsafe_code)]

use serde::{Deserialize, Serialize};
use std::io::{BufRead, Read, Write};
use trainyard_sandbox::Confinement;

#[derive(Deserialize)]
struct Task {
    confinement: Option<Confinement>,
    attempt: Attempt,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "snake_case")]
enum Attempt {
    Read(String),
    Write(String),
    List(String),
    Connect(String),
    ConnectUnix(String),
    Udp(String),
    Raw,
    Ping,
    Bind(u16),
    Syscall(String),
    Env,
    Identity,
    Memory(u64),
    Threads(u64),
    OpenFiles(u64),
    FileSize(String, u64),
    Signal(i32),
    Spin,
    Abort,
    Segv,
}

#[derive(Serialize)]
struct Answer {
    ok: bool,
    detail: String,
}

fn main() {
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    let task: Task = match serde_json::from_str(&line) {
        Ok(t) => t,
        Err(e) => return answer(false, format!("bad task: {e}")),
    };
    if let Some(c) = &task.confinement {
        if let Err(e) = trainyard_sandbox::enter(c) {
            return answer(false, format!("enter: {e}"));
        }
    }
    let (ok, detail) = attempt(&task.attempt);
    answer(ok, detail);
}

fn answer(ok: bool, detail: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{}",
        serde_json::to_string(&Answer { ok, detail }).unwrap_or_default()
    );
}

fn res<T>(r: std::io::Result<T>, what: impl FnOnce(T) -> String) -> (bool, String) {
    match r {
        Ok(v) => (true, what(v)),
        Err(e) => (false, e.to_string()),
    }
}

fn errno(ret: i64) -> (bool, String) {
    if ret < 0 {
        (false, std::io::Error::last_os_error().to_string())
    } else {
        (true, format!("returned {ret}"))
    }
}

fn attempt(a: &Attempt) -> (bool, String) {
    match a {
        Attempt::Read(p) => res(std::fs::read(p), |b| {
            format!(
                "read {} bytes: {}",
                b.len(),
                String::from_utf8_lossy(&b[..b.len().min(64)])
            )
        }),
        Attempt::Write(p) => res(std::fs::write(p, b"written by the probe"), |_| {
            "written".into()
        }),
        Attempt::List(p) => res(std::fs::read_dir(p), |d| format!("{} entries", d.count())),
        Attempt::Connect(addr) => res(
            std::net::TcpStream::connect_timeout(
                &match addr.parse() {
                    Ok(a) => a,
                    Err(e) => return (false, format!("bad address: {e}")),
                },
                std::time::Duration::from_secs(3),
            ),
            |_| "connected".into(),
        ),
        Attempt::ConnectUnix(path) => res(std::os::unix::net::UnixStream::connect(path), |_| {
            "connected".into()
        }),
        Attempt::Udp(addr) => res(
            std::net::UdpSocket::bind(if addr.starts_with('[') {
                "[::]:0"
            } else {
                "0.0.0.0:0"
            })
            .and_then(|u| u.send_to(b"trainyard", addr.as_str())),
            |n| format!("sent {n} bytes"),
        ),
        Attempt::Raw => {
            errno(unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_TCP) } as i64)
        }
        Attempt::Ping => ping(),
        Attempt::Bind(port) => res(std::net::TcpListener::bind(("127.0.0.1", *port)), |l| {
            format!("bound {:?}", l.local_addr())
        }),
        Attempt::Syscall(name) => syscall(name),
        Attempt::Env => (true, {
            let mut vars: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
            vars.sort();
            vars.join(",")
        }),
        Attempt::Identity => (
            true,
            format!(
                "uid={} gid={} caps={:?}",
                nix::unistd::getuid(),
                nix::unistd::getgid(),
                caps::read(None, caps::CapSet::Effective).map(|c| c.len())
            ),
        ),
        Attempt::Memory(mb) => hold_memory(*mb),
        Attempt::Threads(n) => start_threads(*n),
        Attempt::OpenFiles(n) => open_files(*n),
        Attempt::FileSize(p, mb) => write_file(p, *mb),
        Attempt::Spin => loop {
            std::hint::spin_loop();
        },
        Attempt::Abort => std::process::abort(),
        Attempt::Segv => {
            // A wild write, as a crashing native library would make.
            let p = std::hint::black_box(8usize) as *mut u64;
            unsafe { std::ptr::write_volatile(p, 1) };
            (true, "survived a wild write".into())
        }
        Attempt::Signal(pid) => res(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), None)
                .map_err(std::io::Error::from),
            |_| "may signal it".into(),
        ),
    }
}

/// An ICMP echo to 1.1.1.1 from a datagram socket: a route out is what it
/// needs.
fn ping() -> (bool, String) {
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_ICMP) };
    if fd < 0 {
        return errno(-1);
    }
    // An echo request to 1.1.1.1: a route out is what it needs.
    let mut to: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    to.sin_family = libc::AF_INET as libc::sa_family_t;
    to.sin_addr.s_addr = u32::from_ne_bytes([1, 1, 1, 1]);
    let echo = [8u8, 0, 0, 0, 0, 0, 0, 1];
    errno(unsafe {
        libc::sendto(
            fd,
            echo.as_ptr().cast(),
            echo.len(),
            0,
            (&to as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    } as i64)
}

/// Holds `mb` MiB, every page touched (resident).
fn hold_memory(mb: u64) -> (bool, String) {
    let mut held: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mb {
        let mut v = vec![0u8; 1 << 20];
        // Touch every page so that it is resident.
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        held.push(v);
    }
    (true, format!("held {} MiB", held.len()))
}

/// Starts `n` threads at once.
fn start_threads(n: u64) -> (bool, String) {
    let mut made = 0;
    let mut err = String::new();
    let mut handles = Vec::new();
    for _ in 0..n {
        match std::thread::Builder::new()
            .spawn(|| std::thread::sleep(std::time::Duration::from_millis(500)))
        {
            Ok(h) => {
                made += 1;
                handles.push(h)
            }
            Err(e) => {
                err = e.to_string();
                break;
            }
        }
    }
    for h in handles {
        let _ = h.join();
    }
    (made == n, format!("started {made} threads {err}"))
}

/// Opens `n` files at once.
fn open_files(n: u64) -> (bool, String) {
    let mut files = Vec::new();
    for _ in 0..n {
        match std::fs::File::open("/dev/null") {
            Ok(f) => files.push(f),
            Err(e) => return (false, format!("after {} files: {e}", files.len())),
        }
    }
    (true, format!("opened {}", files.len()))
}

/// Writes `mb` MiB to `p`.
fn write_file(p: &str, mb: u64) -> (bool, String) {
    let f = std::fs::File::create(p);
    res(f, |mut f| {
        let chunk = vec![7u8; 1 << 20];
        for i in 0..mb {
            if let Err(e) = f.write_all(&chunk) {
                return format!("failed after {i} MiB: {e}");
            }
        }
        format!("wrote {mb} MiB")
    })
}

/// System calls that succeed for an unconfined, unprivileged process, so
/// that a refusal is the filter's.
fn syscall(name: &str) -> (bool, String) {
    match name {
        "unshare_user" => res(
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(Into::into),
            |_| "new user namespace".into(),
        ),
        "clone_newuser" => {
            // A child in a new user namespace, made with clone(2).
            let mut stack = vec![0u8; 64 * 1024];
            let r = unsafe {
                nix::sched::clone(
                    Box::new(|| 0),
                    &mut stack,
                    nix::sched::CloneFlags::CLONE_NEWUSER,
                    Some(libc::SIGCHLD),
                )
            };
            res(r.map_err(Into::into), |pid| {
                let _ = nix::sys::wait::waitpid(pid, None);
                "cloned into a new user namespace".into()
            })
        }
        "ptrace" => res(nix::sys::ptrace::traceme().map_err(Into::into), |_| {
            "traced by its parent".into()
        }),
        "keyctl" => {
            // KEYCTL_GET_KEYRING_ID (0) of the session keyring (-3), made if missing.
            errno(unsafe { libc::syscall(libc::SYS_keyctl, 0, -3i64, 1) })
        }
        "personality" => errno(unsafe { libc::syscall(libc::SYS_personality, 0xffff_ffffu64) }),
        "process_vm_readv" => {
            let mut dst = [0u8; 8];
            let src = [1u8; 8];
            let local = libc::iovec {
                iov_base: dst.as_mut_ptr().cast(),
                iov_len: 8,
            };
            let remote = libc::iovec {
                iov_base: src.as_ptr() as *mut libc::c_void,
                iov_len: 8,
            };
            errno(unsafe {
                libc::syscall(
                    libc::SYS_process_vm_readv,
                    std::process::id(),
                    &local as *const libc::iovec,
                    1,
                    &remote as *const libc::iovec,
                    1,
                    0,
                )
            })
        }
        "perf_event_open" => {
            // A software clock event on this process (allowed at
            // perf_event_paranoid ≤ 2).
            let mut attr = [0u8; 128];
            attr[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
            attr[4..8].copy_from_slice(&128u32.to_ne_bytes()); // size
            errno(unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, 0) })
        }
        "bpf" => {
            // BPF_PROG_LOAD with no program: EINVAL unconfined, EPERM filtered.
            let attr = [0u8; 128];
            errno(unsafe { libc::syscall(libc::SYS_bpf, 5, attr.as_ptr(), 128) })
        }
        "mount" => res(
            nix::mount::mount(
                Some("none"),
                "/tmp",
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .map_err(Into::into),
            |_| "mounted".into(),
        ),
        "seccomp_status" => {
            let mut s = String::new();
            let _ =
                std::fs::File::open("/proc/self/status").and_then(|mut f| f.read_to_string(&mut s));
            let line = s
                .lines()
                .filter(|l| l.starts_with("Seccomp") || l.starts_with("NoNewPrivs"))
                .collect::<Vec<_>>()
                .join(" ");
            (true, line)
        }
        other => (false, format!("unknown system call {other}")),
    }
}
