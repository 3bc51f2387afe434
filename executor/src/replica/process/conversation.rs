//! The executor's side of a module process: the [`Host`] it is started
//! from, the start (the sandboxed child, the sealed shared memory sized
//! by the module's checked description), each call with its deadline and
//! the role's stop signal, and the child's ending when a call fails: killed
//! at the deadline or after a stop, or its own signal or memory limit,
//! with the last line it wrote to stderr. [`Remote`] is the module as a
//! [`Net`] for evaluation.

use super::mirror::mirror;
use super::timed::Timed;
use crate::data::Batch;
use crate::replica::TrainError;
use crate::sandbox::{Sandbox, RUNTIME_MB};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};
use trainyard_common::spec::UncheckedJobSpec;
use trainyard_confined::model::Net;
use trainyard_confined::protocol::frames::{
    meta, read_frame, size_of, tensor_bytes, write_frame, Load, Reply, Request,
};
use trainyard_confined::shm::{self, Shared};
use trainyard_confined::tensors::ModelTensors;
use trainyard_sandbox::spawn::Child;
use trainyard_sandbox::{Ending, Limits};
use trainyard_shutdown::Shutdown;

/// How long a module may go on after its role is told to stop.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// Where a replica's module process comes from: the sandbox, the limit
/// on each call, and the stop signal of the role using it.
#[derive(Clone)]
pub struct Host {
    /// The executor's sandbox.
    pub sandbox: Arc<Sandbox>,
    /// The longest one call (load, step, evaluation, save) may take.
    pub timeout: Duration,
    /// The role's stop signal (replaced as generations change hands).
    pub stop: Shutdown,
    /// How long a call may go on once stop is set ([`STOP_GRACE`]).
    pub grace: Duration,
}

impl Host {
    /// A host for tests: the test sandbox, five minutes a call.
    pub fn for_tests() -> Host {
        Host {
            sandbox: Arc::new(Sandbox::for_tests()),
            timeout: Duration::from_secs(300),
            stop: Shutdown::new(),
            grace: STOP_GRACE,
        }
    }
}

/// The executor's end of one module process.
pub struct Conversation {
    child: Child,
    stdin: std::process::ChildStdin,
    stdout: std::process::ChildStdout,
    stderr: Arc<Mutex<String>>,
    /// Mapped once the model's size is known.
    memory: Option<Shared>,
    timeout: Duration,
    stop: Shutdown,
    grace: Duration,
    limits: Limits,
    scratch: PathBuf,
    /// Set once the child is gone: every later call fails with it.
    dead: Option<String>,
    /// Whether it died of its own doing or its deadline (a crash the job
    /// may retry), not because its role stopped.
    crashed: bool,
    _workspace: crate::sandbox::Workspace,
}

/// A replica's handle on its module process.
pub type Process = Arc<Mutex<Conversation>>;

/// The conversation, even after a panic elsewhere.
pub fn lock(p: &Process) -> MutexGuard<'_, Conversation> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the replica gets: the process, the module's tensors as the
/// executor keeps them (trainable ones to be bound to the flat vector,
/// buffers filled from it, frozen ones with their values), the flat vector
/// and the gradient, both over the shared memory.
pub struct Started {
    /// The conversation with the child.
    pub process: Process,
    /// The module's tensors, the executor's copy.
    pub tensors: ModelTensors,
    /// The flat vector, shared.
    pub weights: Tensor,
    /// The gradient the child writes, shared.
    pub grad: Tensor,
}

impl Conversation {
    /// Starts the module at `model` (a local file) for a replica of
    /// `spec` on `device`, confined by `host`'s sandbox.
    pub fn start(
        host: &Host,
        model: &std::path::Path,
        spec: &UncheckedJobSpec,
        device: tch::Device,
    ) -> Result<Started, TrainError> {
        let sandbox = &host.sandbox;
        let fail = |e: String| TrainError::Model(e);
        if let Some(why) = sandbox.refusal() {
            return Err(fail(why));
        }
        let confined = |e: crate::sandbox::SandboxError| TrainError::Model(e.to_string());
        let ws = sandbox.workspace("model").map_err(confined)?;
        let model = ws.input("model.pt", model).map_err(confined)?;
        let memfd = shm::memfd().map_err(|e| fail(format!("shared memory: {e}")))?;
        let limits = Limits {
            memory_mb: spec.resources.memory_mb.saturating_add(RUNTIME_MB),
            ..Limits::default()
        };
        let load = Load {
            model,
            scratch: ws.scratch(),
            cuda: match device {
                tch::Device::Cuda(i) => Some(i),
                _ => None,
            },
            spec: spec.clone(),
        };
        let (mut child, stdin) = sandbox
            .start(
                trainyard_confined::protocol::Kind::Model,
                &ws,
                &load,
                limits,
                Some(memfd.as_raw_fd()),
                device,
            )
            .map_err(confined)?;
        let (Some(stdout), Some(stderr)) = (child.stdout(), child.stderr()) else {
            child.kill();
            return Err(fail("the model process has no pipes".into()));
        };
        let tail = Arc::new(Mutex::new(String::new()));
        {
            let tail = tail.clone();
            std::thread::spawn(move || drain(stderr, &tail));
        }
        for fd in [stdin.as_raw_fd(), stdout.as_raw_fd()] {
            shm::set_nonblocking(fd).map_err(|e| fail(e.to_string()))?;
        }
        let mut c = Conversation {
            child,
            stdin,
            stdout,
            stderr: tail,
            memory: None,
            timeout: host.timeout,
            stop: host.stop.clone(),
            grace: host.grace,
            limits,
            scratch: ws.scratch(),
            dead: None,
            crashed: false,
            _workspace: ws,
        };
        // What the job reserved on this executor bounds what the child may
        // make the executor hold.
        let cap = (spec.resources.memory_mb as usize).saturating_mul(1 << 20);
        let (reply, frozen_bytes) = c.answer(cap)?;
        let Reply::Loaded {
            trainable,
            buffers,
            frozen,
            aliases,
        } = reply
        else {
            return Err(c.unexpected());
        };
        let wrong = |e: &dyn std::fmt::Display| {
            fail(format!(
                "the model process described its tensors wrongly: {e}"
            ))
        };
        // Sized before anything is allocated for them: the description is
        // the child's, and the child is not trusted.
        let mut numel = 0usize;
        for m in trainable.iter().chain(&buffers) {
            numel = numel.saturating_add(size_of(m).map_err(|e| wrong(&e))?.0);
        }
        let bytes = numel.checked_mul(8).filter(|b| *b <= cap).ok_or_else(|| {
            fail(format!(
                "the model's {numel} values do not fit the job's memory ({} MiB, resources.memory_mb)",
                spec.resources.memory_mb
            ))
        })?;
        let tensors =
            mirror(&trainable, &buffers, &frozen, aliases, &frozen_bytes).map_err(|e| wrong(&e))?;
        let memory =
            Shared::seal_and_map(memfd, bytes).map_err(|e| fail(format!("shared memory: {e}")))?;
        let (weights, grad) = (memory.f32s(0, numel), memory.f32s(numel, numel));
        c.memory = Some(memory);
        c.call(
            &Request::Map {
                bytes: bytes as u64,
            },
            &[],
            0,
        )?;
        Ok(Started {
            process: Arc::new(Mutex::new(c)),
            tensors,
            weights,
            grad,
        })
    }

    /// Whether the child still answers (it was not killed, nor ended).
    pub fn alive(&mut self) -> bool {
        // A child that died between calls (killed from outside while its
        // replica waited for a ring) is as dead as one that died in one.
        self.dead.is_none() && self.child.try_ending().is_none()
    }

    /// Follows the stop signal of the role now using the replica.
    pub fn watch(&mut self, stop: Shutdown) {
        self.stop = stop;
    }

    /// A forward and backward on `b` in the child; the loss summed over
    /// the batch (the gradient is in the shared memory).
    pub fn step(&mut self, b: &Batch, state: bool) -> Result<f64, TrainError> {
        let (x, y) = if b.samples > 0 {
            (b.x.shallow_clone(), b.y.shallow_clone())
        } else {
            let z = Tensor::zeros([0], (Kind::Float, tch::Device::Cpu));
            (z.shallow_clone(), z)
        };
        let (xb, yb) = (tensor_bytes(&x), tensor_bytes(&y));
        let req = Request::Step {
            x: meta("", &x),
            y: meta("", &y),
            samples: b.samples as u64,
            state,
        };
        match self.call(&req, &[&xb, &yb], 0)? {
            (Reply::Stepped { loss_bits }, _) => Ok(f64::from_bits(loss_bits)),
            _ => Err(self.unexpected()),
        }
    }

    /// The module's output on `x` (evaluation mode unless `train`).
    pub fn forward(&mut self, x: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        let xb = tensor_bytes(x);
        // An output a thousand times the input is not a model's answer.
        let cap = xb.len().saturating_mul(1000).max(64 << 20);
        let req = Request::Forward {
            x: meta("", x),
            train,
        };
        match self.call(&req, &[&xb], cap)? {
            (Reply::Output { out }, bytes) => {
                let (_, n, kind) = size_of(&out).map_err(TrainError::Model)?;
                if n != bytes.len() {
                    return Err(TrainError::Model("the model's output is cut short".into()));
                }
                Ok(Tensor::f_from_data_size(&bytes, &out.shape, kind)?)
            }
            _ => Err(self.unexpected()),
        }
    }

    /// The module with its trained tensors, as `torch.jit.save` writes it.
    pub fn save(&mut self) -> Result<Vec<u8>, TrainError> {
        match self.call(&Request::Save, &[], 0)? {
            (Reply::Saved { .. }, _) => {
                let path = self.scratch.join("module.pt");
                let bytes = std::fs::read(&path).map_err(|e| TrainError::Model(e.to_string()));
                let _ = std::fs::remove_file(&path);
                bytes
            }
            _ => Err(self.unexpected()),
        }
    }

    /// The error of every call once the process is gone: a crash when it
    /// died of its own doing (or its deadline), not when it was stopped.
    fn dead_error(&self) -> TrainError {
        let why = self.dead.clone().unwrap_or_default();
        if self.crashed {
            TrainError::Crashed(why)
        } else {
            TrainError::Model(why)
        }
    }

    fn unexpected(&mut self) -> TrainError {
        self.child.kill();
        let why = "the model process answered out of turn".to_owned();
        self.dead = Some(why.clone());
        TrainError::Model(why)
    }

    fn call(
        &mut self,
        req: &Request,
        payload: &[&[u8]],
        max_payload: usize,
    ) -> Result<(Reply, Vec<u8>), TrainError> {
        if self.dead.is_some() {
            return Err(self.dead_error());
        }
        let deadline = Instant::now() + self.timeout;
        let stop = self.stop.clone();
        let sent = write_frame(
            &mut Timed {
                fd: self.stdin.as_raw_fd(),
                io: &mut self.stdin,
                deadline,
                stop: &stop,
                grace: self.grace,
                stopped_at: None,
            },
            req,
            payload,
        );
        if let Err(e) = sent {
            return Err(self.ended(e));
        }
        self.answer(max_payload)
    }

    fn answer(&mut self, max_payload: usize) -> Result<(Reply, Vec<u8>), TrainError> {
        let deadline = Instant::now() + self.timeout;
        let stop = self.stop.clone();
        let got = read_frame::<Reply>(
            &mut Timed {
                fd: self.stdout.as_raw_fd(),
                io: &mut self.stdout,
                deadline,
                stop: &stop,
                grace: self.grace,
                stopped_at: None,
            },
            max_payload,
        );
        match got {
            Ok((Reply::Failed { reason }, _)) => Err(TrainError::Model(reason)),
            Ok(r) => Ok(r),
            Err(e) => Err(self.ended(e)),
        }
    }

    /// Why the conversation broke (`e`), with the child's ending: it is
    /// killed if it still runs.
    fn ended(&mut self, e: std::io::Error) -> TrainError {
        // Killed because its role stopped: no crash of the model's.
        let mut crashed = true;
        let ending = match e.kind() {
            std::io::ErrorKind::TimedOut => {
                self.child.kill();
                format!(
                    "did not answer within {} s (killed)",
                    self.timeout.as_secs()
                )
            }
            std::io::ErrorKind::ConnectionAborted => {
                self.child.kill();
                crashed = false;
                "was killed: its role was stopped".to_owned()
            }
            _ => {
                // Closed pipes: it ended (or is ending) on its own.
                let e = self.child.wait(Some(Duration::from_secs(5)), &|| false);
                match e {
                    Ending::Memory { .. } => format!(
                        "{e} ({} MiB asked by resources.memory_mb, {RUNTIME_MB} MiB for the runtime)",
                        self.limits.memory_mb.saturating_sub(RUNTIME_MB)
                    ),
                    other => other.to_string(),
                }
            }
        };
        let last = self
            .stderr
            .lock()
            .map(|t| {
                t.lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .to_owned()
            })
            .unwrap_or_default();
        let why = format!(
            "the model process {ending}{}",
            if last.is_empty() {
                String::new()
            } else {
                format!(": {last}")
            }
        );
        self.dead = Some(why.clone());
        self.crashed = crashed;
        self.dead_error()
    }
}

impl Drop for Conversation {
    fn drop(&mut self) {
        self.child.kill();
    }
}

/// Keeps the last few KiB the child wrote to stderr.
fn drain(mut r: std::process::ChildStderr, tail: &Mutex<String>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = r.read(&mut buf) {
        if n == 0 {
            break;
        }
        if let Ok(mut t) = tail.lock() {
            t.push_str(&String::from_utf8_lossy(&buf[..n]));
            if t.len() > 8192 {
                let cut = t.len() - 4096;
                let cut = (cut..t.len()).find(|i| t.is_char_boundary(*i)).unwrap_or(0);
                t.drain(..cut);
            }
        }
    }
}

/// The executor's view of the module for evaluation: a forward in the
/// child.
pub struct Remote(pub Process);

impl Net for Remote {
    fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        self.try_forward(xs, train)
            .unwrap_or_else(|_| Tensor::zeros([0], (Kind::Float, xs.device())))
    }

    fn try_forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, tch::TchError> {
        lock(&self.0)
            .forward(xs, train)
            .map_err(|e| tch::TchError::Torch(e.to_string()))
    }
}
