//! Memory a replica shares with its model process, and waiting on that
//! process's pipes.
//!
//! A user's module runs in a child ([`crate::serve`]); its parameters
//! and their gradients live in one memfd both processes map, so a step
//! moves no weights through a pipe. The executor makes the memfd and gives
//! it to the child as fd 3 ([`trainyard_sandbox::spawn::Spec::fd3`]); once
//! it knows the model's size it sizes it and seals its size
//! (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) before mapping it, so the
//! child (untrusted) can change the values, never the size: a mapping
//! that outlives its file's end would fault the executor (SIGBUS).
//!
//! This module and [`crate::torchscript`] hold this crate's `unsafe` code.
#![allow(unsafe_code)]

use nix::libc;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;
use tch::{Kind, Tensor};

/// One shared, size-sealed mapping of f32 values.
pub struct Shared {
    fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; the tensors over it are used by one
// replica's thread at a time, as any tensor of a replica.
unsafe impl Send for Shared {}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A fresh, empty memfd that may be sealed, closed on exec.
pub fn memfd() -> io::Result<OwnedFd> {
    // SAFETY: a constant C string; the descriptor returned is ours.
    let fd = check(unsafe {
        libc::memfd_create(
            c"trainyard-model".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    })?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn size_of(fd: RawFd) -> io::Result<u64> {
    // SAFETY: `st` is written by fstat before it is read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st.st_size as u64)
}

const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

impl Shared {
    /// The executor's side: sizes `fd` to `len` bytes, seals its size and
    /// maps it.
    pub fn seal_and_map(fd: OwnedFd, len: usize) -> io::Result<Shared> {
        let raw = fd.as_raw_fd();
        check(unsafe { libc::ftruncate(raw, len as libc::off_t) })?;
        check(unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, SEALS) })?;
        // The child may have resized it before the seal: checked after.
        if size_of(raw)? != len as u64 {
            return Err(io::Error::other("the shared memory was resized"));
        }
        Shared::map(fd, len)
    }

    /// The child's side: maps its fd 3, which must be sealed at `len`.
    pub fn from_fd3(len: usize) -> io::Result<Shared> {
        // SAFETY: fd 3 was given to this process for this purpose alone.
        let fd = unsafe { OwnedFd::from_raw_fd(3) };
        let seals = check(unsafe { libc::fcntl(3, libc::F_GET_SEALS) })?;
        if seals & SEALS != SEALS || size_of(3)? != len as u64 {
            return Err(io::Error::other("fd 3 is not the sealed shared memory"));
        }
        Shared::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Shared> {
        if len == 0 {
            return Ok(Shared {
                fd,
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len,
            });
        }
        // SAFETY: a fresh shared mapping of a file whose size is sealed at
        // `len`; it is unmapped once, in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Shared {
            fd,
            ptr: ptr.cast(),
            len,
        })
    }

    /// The descriptor (to hand to the child as its fd 3).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// `n` f32 values from element `at`, as a CPU tensor over the mapping
    /// (no copy). The tensor must not outlive `self`: the replica that
    /// owns both drops the mapping last.
    pub fn f32s(&self, at: usize, n: usize) -> Tensor {
        assert!((at + n) * 4 <= self.len, "outside the shared memory");
        if n == 0 {
            return Tensor::zeros([0], (Kind::Float, tch::Device::Cpu));
        }
        // SAFETY: in bounds (checked above), aligned (mmap is page
        // aligned, offsets are whole f32s) and alive as long as `self`.
        unsafe {
            Tensor::from_blob(
                self.ptr.add(at * 4),
                &[n as i64],
                &[1],
                Kind::Float,
                tch::Device::Cpu,
            )
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: mapped in `map` with this length, unmapped once.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

/// Makes `fd` non-blocking.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

/// Waits up to `wait` until `fd` can be read (or written, `write`);
/// false when it could not. A closed peer counts as ready (the read or
/// write then says so).
pub fn ready(fd: RawFd, write: bool, wait: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: if write { libc::POLLOUT } else { libc::POLLIN },
        revents: 0,
    };
    let ms = wait.as_millis().clamp(1, 1000) as libc::c_int;
    // SAFETY: one valid pollfd for the duration of the call.
    match unsafe { libc::poll(&mut p, 1, ms) } {
        n if n > 0 => Ok(true),
        0 => Ok(false),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}
