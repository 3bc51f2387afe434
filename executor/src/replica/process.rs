//! A user's TorchScript module in a confined process of its own.
//!
//! A module is code: its operators may read files, loop forever or crash
//! libtorch. So a replica never loads one in the executor's process. It
//! starts a child (the executor's binary, `--sandboxed model`) that
//! confines itself ([`crate::sandbox`]) before it loads the module, and
//! keeps it for the replica's life. The role's thread stays in the
//! executor with everything the child must not hold: the job's data, the
//! data plane, the object store and its keys, the join token.
//!
//! The two share one sealed memfd ([`super::shm`]): the flat vector of
//! the replica (the module's parameters, then its buffers) and, after it,
//! the gradient. The child's module parameters are views of that memory
//! (on a CPU; on a GPU the child copies them in before each call), so an
//! optimizer step in the executor is the module's new weights with no
//! copy. A step sends the batch down the child's stdin and gets the loss
//! back on its stdout; the gradient is already in place.
//!
//! Every answer is awaited with a deadline (`--inspection-timeout-secs`,
//! per call) and with the role's stop flag: a module that hangs is killed
//! at the deadline, or [`STOP_GRACE`] after its role is told to stop, so
//! its core is free again; one that crashes or outgrows its memory ends
//! its job with the signal or limit, never the executor.
//!
//! Frames, both ways: a `u32` length and a JSON header, then a `u64`
//! length and that many payload bytes (tensors, raw, in the header's
//! order).

use super::data::Batch;
use super::model::{Net, Script};
use super::script::Module;
use super::shm::{self, Shared};
use super::tensors::{dtype_name, first_line, ModelTensors};
use super::{seeded_rng, Core, TrainError};
use crate::sandbox::{Sandbox, RUNTIME_MB};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};
use trainyard_common::spec::JobSpecInput;
use trainyard_sandbox::spawn::Child;
use trainyard_sandbox::{Ending, Limits};

/// How long a module may go on after its role is told to stop.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The largest JSON header either side reads.
const MAX_HEADER: usize = 1 << 20;

/// Tensors a model may have (names, and so the header, stay bounded).
const MAX_TENSORS: usize = 100_000;

/// Where a replica's module process comes from: the sandbox, the limit
/// on each call, and the stop flag of the role using it.
#[derive(Clone)]
pub struct Host {
    /// The executor's sandbox.
    pub sandbox: Arc<Sandbox>,
    /// The longest one call (load, step, evaluation, save) may take.
    pub timeout: Duration,
    /// The role's stop flag (replaced as generations change hands).
    pub stop: Arc<AtomicBool>,
    /// How long a call may go on once stop is set ([`STOP_GRACE`]).
    pub grace: Duration,
}

impl Host {
    /// A host for tests: the test sandbox, five minutes a call.
    pub fn for_tests() -> Host {
        Host {
            sandbox: Arc::new(Sandbox::for_tests()),
            timeout: Duration::from_secs(300),
            stop: Arc::new(AtomicBool::new(false)),
            grace: STOP_GRACE,
        }
    }
}

/// The child's task: the module, where it runs and the job's spec.
#[derive(Serialize, Deserialize)]
pub struct Load {
    /// The module, in the child's read-only inputs.
    pub model: PathBuf,
    /// Its scratch folder (where the trained module is saved).
    pub scratch: PathBuf,
    /// `Some(i)`: CUDA device `i`; `None`: the CPU.
    pub cuda: Option<usize>,
    /// The job's spec (its loss, its seed).
    pub spec: JobSpecInput,
}

/// A tensor's shape and dtype in a header; its bytes are in the payload.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Meta {
    /// Its name (model tensors) or empty.
    #[serde(default)]
    pub name: String,
    /// Its shape.
    pub shape: Vec<i64>,
    /// PyTorch's dtype name.
    pub dtype: String,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    Map {
        bytes: u64,
    },
    Step {
        x: Meta,
        y: Meta,
        samples: u64,
        state: bool,
    },
    Forward {
        x: Meta,
        train: bool,
    },
    Save,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Reply {
    Loaded {
        trainable: Vec<Meta>,
        buffers: Vec<Meta>,
        frozen: Vec<Meta>,
        aliases: Vec<(String, String)>,
    },
    Mapped,
    /// The loss's bits: JSON has no NaN, and a diverged loss must arrive
    /// as one (the replica names it).
    Stepped {
        loss_bits: u64,
    },
    Output {
        out: Meta,
    },
    Saved {
        bytes: u64,
    },
    Failed {
        reason: String,
    },
}

fn kind_of(dtype: &str) -> Option<Kind> {
    [
        Kind::Float,
        Kind::Double,
        Kind::Half,
        Kind::BFloat16,
        Kind::Int64,
        Kind::Int,
        Kind::Int16,
        Kind::Int8,
        Kind::Uint8,
        Kind::Bool,
    ]
    .into_iter()
    .find(|k| dtype_name(*k) == dtype)
}

fn meta(name: &str, t: &Tensor) -> Meta {
    Meta {
        name: name.to_owned(),
        shape: t.size(),
        dtype: dtype_name(t.kind()).to_owned(),
    }
}

/// Elements and bytes of `m`, checked (a header is untrusted).
fn size_of(m: &Meta) -> Result<(usize, usize, Kind), String> {
    let kind = kind_of(&m.dtype).ok_or_else(|| format!("unknown dtype {:?}", m.dtype))?;
    if m.shape.len() > 16 || m.name.len() > 4096 {
        return Err(format!("tensor {:?} has an unreadable shape", m.name));
    }
    let mut n: usize = 1;
    for &d in &m.shape {
        let d = usize::try_from(d).map_err(|_| format!("negative size in {:?}", m.shape))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| format!("tensor {:?} is too large", m.name))?;
    }
    let bytes = n
        .checked_mul(kind.elt_size_in_bytes())
        .ok_or_else(|| format!("tensor {:?} is too large", m.name))?;
    Ok((n, bytes, kind))
}

fn tensor_bytes(t: &Tensor) -> Vec<u8> {
    let t = t.to_device(tch::Device::Cpu).contiguous();
    let n = t.numel() * t.kind().elt_size_in_bytes();
    let mut out = vec![0u8; n];
    t.copy_data_u8(&mut out, t.numel());
    out
}

// ---------------------------------------------------------------- frames

fn write_frame<H: Serialize>(
    w: &mut dyn Write,
    header: &H,
    payload: &[&[u8]],
) -> std::io::Result<()> {
    let h = serde_json::to_vec(header)?;
    let total: usize = payload.iter().map(|p| p.len()).sum();
    w.write_all(&(h.len() as u32).to_le_bytes())?;
    w.write_all(&h)?;
    w.write_all(&(total as u64).to_le_bytes())?;
    for p in payload {
        w.write_all(p)?;
    }
    w.flush()
}

fn read_frame<H: for<'de> Deserialize<'de>>(
    r: &mut dyn Read,
    max_payload: usize,
) -> std::io::Result<(H, Vec<u8>)> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_HEADER {
        return Err(std::io::Error::other("header too large"));
    }
    let mut h = vec![0u8; n];
    r.read_exact(&mut h)?;
    let mut plen = [0u8; 8];
    r.read_exact(&mut plen)?;
    let p = u64::from_le_bytes(plen);
    if p > max_payload as u64 {
        return Err(std::io::Error::other(format!(
            "payload of {p} bytes, more than the {max_payload} allowed"
        )));
    }
    let mut payload = vec![0u8; p as usize];
    r.read_exact(&mut payload)?;
    Ok((serde_json::from_slice(&h)?, payload))
}

// ------------------------------------------------------ the executor's side

/// The executor's end of one module process.
pub struct Conversation {
    child: Child,
    stdin: std::process::ChildStdin,
    stdout: std::process::ChildStdout,
    stderr: Arc<Mutex<String>>,
    /// Mapped once the model's size is known.
    memory: Option<Shared>,
    timeout: Duration,
    stop: Arc<AtomicBool>,
    grace: Duration,
    limits: Limits,
    scratch: PathBuf,
    /// Set once the child is gone: every later call fails with it.
    dead: Option<String>,
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

/// A reader/writer over a non-blocking pipe that gives up at a deadline
/// or once stop has been set for [`STOP_GRACE`].
struct Timed<'a, F> {
    fd: std::os::fd::RawFd,
    io: F,
    deadline: Instant,
    stop: &'a AtomicBool,
    grace: Duration,
    stopped_at: Option<Instant>,
}

impl<F> Timed<'_, F> {
    fn wait(&mut self, write: bool) -> std::io::Result<()> {
        loop {
            if Instant::now() >= self.deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "deadline",
                ));
            }
            if self.stop.load(Ordering::Relaxed) {
                let at = *self.stopped_at.get_or_insert_with(Instant::now);
                if at.elapsed() >= self.grace {
                    // Not `Interrupted`: read_exact and write_all retry that.
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "stopped",
                    ));
                }
            }
            if shm::ready(self.fd, write, Duration::from_millis(100))? {
                return Ok(());
            }
        }
    }
}

impl<R: Read> Read for Timed<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            self.wait(false)?;
            match self.io.read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

impl<W: Write> Write for Timed<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            self.wait(true)?;
            match self.io.write(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.io.flush()
    }
}

impl Conversation {
    /// Starts the module at `model` (a local file) for a replica of
    /// `spec` on `device`, confined by `host`'s sandbox.
    pub fn start(
        host: &Host,
        model: &std::path::Path,
        spec: &JobSpecInput,
        device: tch::Device,
    ) -> Result<Started, TrainError> {
        let sandbox = &host.sandbox;
        let fail = |e: String| TrainError::Model(e);
        if let Some(why) = sandbox.refusal() {
            return Err(fail(why));
        }
        let ws = sandbox.workspace("model").map_err(fail)?;
        let model = ws.input("model.pt", model).map_err(fail)?;
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
            .start("model", &ws, &load, limits, Some(memfd.as_raw_fd()), device)
            .map_err(fail)?;
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
        let wrong = |e: String| {
            fail(format!(
                "the model process described its tensors wrongly: {e}"
            ))
        };
        // Sized before anything is allocated for them: the description is
        // the child's, and the child is not trusted.
        let mut numel = 0usize;
        for m in trainable.iter().chain(&buffers) {
            numel = numel.saturating_add(size_of(m).map_err(wrong)?.0);
        }
        let bytes = numel.checked_mul(8).filter(|b| *b <= cap).ok_or_else(|| {
            fail(format!(
                "the model's {numel} values do not fit the job's memory ({} MiB, resources.memory_mb)",
                spec.resources.memory_mb
            ))
        })?;
        let tensors =
            mirror(&trainable, &buffers, &frozen, aliases, &frozen_bytes).map_err(wrong)?;
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
    pub fn alive(&self) -> bool {
        self.dead.is_none()
    }

    /// Follows the stop flag of the role now using the replica.
    pub fn watch(&mut self, stop: Arc<AtomicBool>) {
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
        if let Some(why) = &self.dead {
            return Err(TrainError::Model(why.clone()));
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
        TrainError::Model(why)
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

/// The executor's copy of the module's tensors, from the child's
/// (untrusted) description: checked, bounded, frozen values from `bytes`.
fn mirror(
    trainable: &[Meta],
    buffers: &[Meta],
    frozen: &[Meta],
    aliases: Vec<(String, String)>,
    bytes: &[u8],
) -> Result<ModelTensors, String> {
    if trainable.len() + buffers.len() + frozen.len() + aliases.len() > MAX_TENSORS {
        return Err("too many tensors".into());
    }
    let cpu = tch::Device::Cpu;
    let mut out = ModelTensors {
        trainable: Vec::new(),
        buffers: Vec::new(),
        frozen: Vec::new(),
        aliases,
    };
    for m in trainable {
        let (_, _, kind) = size_of(m)?;
        if kind != Kind::Float {
            return Err(format!("parameter {:?} is not float32", m.name));
        }
        // Bound to the shared flat vector by the replica: never touched.
        out.trainable.push((
            m.name.clone(),
            Tensor::f_empty(&m.shape, (kind, cpu)).map_err(|e| e.to_string())?,
        ));
    }
    for m in buffers {
        let (_, _, kind) = size_of(m)?;
        out.buffers.push((
            m.name.clone(),
            Tensor::f_zeros(&m.shape, (kind, cpu)).map_err(|e| e.to_string())?,
        ));
    }
    let mut at = 0usize;
    for m in frozen {
        let (_, n, kind) = size_of(m)?;
        let end = at
            .checked_add(n)
            .filter(|e| *e <= bytes.len())
            .ok_or("frozen values cut short")?;
        let t =
            Tensor::f_from_data_size(&bytes[at..end], &m.shape, kind).map_err(|e| e.to_string())?;
        out.frozen.push((m.name.clone(), t));
        at = end;
    }
    if at != bytes.len() {
        return Err("frozen values of the wrong length".into());
    }
    Ok(out)
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

// ---------------------------------------------------------- the child's side

/// The child: loads the module (already confined), describes its tensors,
/// maps the shared memory and answers calls until its stdin closes.
pub fn serve(load: Load, input: &mut dyn BufRead, output: &mut dyn Write) -> i32 {
    match serve_inner(load, input, output) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            5
        }
    }
}

struct Served {
    spec: JobSpecInput,
    net: Script,
    tensors: ModelTensors,
    device: tch::Device,
    trainable: usize,
    numel: usize,
    /// On the device: the flat vector (the parameters are views of it).
    weights: Tensor,
    grad: Tensor,
    /// Over the shared memory (the same tensors on a CPU).
    shared: Option<(Shared, Tensor, Tensor)>,
}

fn serve_inner(load: Load, input: &mut dyn BufRead, output: &mut dyn Write) -> Result<(), String> {
    let device = load.cuda.map_or(tch::Device::Cpu, tch::Device::Cuda);
    let loaded = std::panic::catch_unwind(|| {
        let _seeded = seeded_rng();
        tch::manual_seed(load.spec.seed as i64);
        let module = Module::load(&load.model, device).map_err(|e| {
            format!(
                "model.url is not a loadable TorchScript module: {}",
                first_line(&e.to_string())
            )
        })?;
        let tensors = ModelTensors::of_script(&module)?;
        let net = Script::new(module).map_err(|e| first_line(&e.to_string()))?;
        Ok::<_, String>((net, tensors))
    });
    let (net, tensors) = match loaded {
        Ok(Ok(l)) => l,
        Ok(Err(reason)) => {
            return write_frame(output, &Reply::Failed { reason }, &[]).map_err(|e| e.to_string())
        }
        Err(_) => {
            let reason = "libtorch crashed while loading the model".to_owned();
            return write_frame(output, &Reply::Failed { reason }, &[]).map_err(|e| e.to_string());
        }
    };
    let frozen_bytes: Vec<Vec<u8>> = tensors
        .frozen
        .iter()
        .map(|(_, t)| tensor_bytes(t))
        .collect();
    let described = Reply::Loaded {
        trainable: tensors.trainable.iter().map(|(n, t)| meta(n, t)).collect(),
        buffers: tensors.buffers.iter().map(|(n, t)| meta(n, t)).collect(),
        frozen: tensors.frozen.iter().map(|(n, t)| meta(n, t)).collect(),
        aliases: tensors.aliases.clone(),
    };
    let refs: Vec<&[u8]> = frozen_bytes.iter().map(|b| b.as_slice()).collect();
    write_frame(output, &described, &refs).map_err(|e| e.to_string())?;
    let trainable = tensors.trainable_len();
    let numel = trainable + tensors.buffer_len();
    let mut s = Served {
        spec: load.spec,
        net,
        tensors,
        device,
        trainable,
        numel,
        weights: Tensor::new(),
        grad: Tensor::new(),
        shared: None,
    };
    loop {
        let (req, payload) = match read_frame::<Request>(input, 1 << 34) {
            Ok(r) => r,
            // The executor closed our stdin: the replica is gone.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("reading a call: {e}")),
        };
        let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.handle(req, &payload, &load.scratch)
        }));
        let (reply, bytes) = match answer {
            Ok(Ok(r)) => r,
            Ok(Err(reason)) => (Reply::Failed { reason }, Vec::new()),
            Err(_) => (
                Reply::Failed {
                    reason: "libtorch failed in the model process".into(),
                },
                Vec::new(),
            ),
        };
        write_frame(output, &reply, &[&bytes]).map_err(|e| e.to_string())?;
    }
}

fn tensor_of(m: &Meta, bytes: &[u8]) -> Result<Tensor, String> {
    let (_, n, kind) = size_of(m)?;
    if n != bytes.len() {
        return Err("a tensor of the wrong length".into());
    }
    Tensor::f_from_data_size(bytes, &m.shape, kind).map_err(|e| e.to_string())
}

impl Served {
    fn core(&self) -> Core<'_> {
        Core {
            spec: &self.spec,
            net: &self.net,
            tensors: &self.tensors,
            weights: &self.weights,
            trainable: self.trainable,
            numel: self.numel,
            device: self.device,
        }
    }

    /// Brings the device's flat vector and buffers up to the shared one.
    fn pull(&self) {
        if let Some((_, w, _)) = &self.shared {
            if self.device != tch::Device::Cpu {
                tch::no_grad(|| self.weights.shallow_clone().copy_(w));
            }
        }
        self.core().buffers_from_flat();
    }

    fn handle(
        &mut self,
        req: Request,
        payload: &[u8],
        scratch: &std::path::Path,
    ) -> Result<(Reply, Vec<u8>), String> {
        match req {
            Request::Map { bytes } => {
                if bytes as usize != self.numel * 8 {
                    return Err("the shared memory is not this model's size".into());
                }
                let shared = Shared::from_fd3(bytes as usize).map_err(|e| e.to_string())?;
                let (w, g) = (
                    shared.f32s(0, self.numel),
                    shared.f32s(self.numel, self.numel),
                );
                let start = tch::no_grad(|| {
                    let mut parts: Vec<Tensor> = self
                        .tensors
                        .trainable
                        .iter()
                        .map(|(_, t)| t.detach().reshape([-1]))
                        .collect();
                    parts.push(self.tensors.read_buffers(self.device));
                    Tensor::cat(&parts, 0)
                });
                tch::no_grad(|| w.shallow_clone().copy_(&start));
                self.weights = if self.device == tch::Device::Cpu {
                    w.shallow_clone()
                } else {
                    start
                };
                let mut at = 0i64;
                for (_, v) in &mut self.tensors.trainable {
                    let n = v.numel() as i64;
                    v.set_data(&self.weights.narrow(0, at, n).view(v.size().as_slice()));
                    at += n;
                }
                self.shared = Some((shared, w, g));
                Ok((Reply::Mapped, Vec::new()))
            }
            Request::Step {
                x,
                y,
                samples,
                state,
            } => {
                let Some((_, w, g)) = &self.shared else {
                    return Err("a step before the shared memory".into());
                };
                let (w, g) = (w.shallow_clone(), g.shallow_clone());
                let (_, xn, _) = size_of(&x)?;
                if xn > payload.len() {
                    return Err("a batch cut short".into());
                }
                let xs = tensor_of(&x, &payload[..xn])?;
                let ys = tensor_of(&y, &payload[xn..])?;
                self.pull();
                let mut grad = std::mem::take(&mut self.grad);
                let stepped =
                    self.core()
                        .forward_backward(&xs, &ys, samples as usize, state, &mut grad);
                self.grad = grad;
                let loss_sum = stepped.map_err(|e| e.to_string())?;
                tch::no_grad(|| {
                    g.shallow_clone().copy_(&self.grad);
                    if self.device != tch::Device::Cpu && self.numel > self.trainable {
                        // The buffers the forward moved, back to the executor.
                        let (p, n) = (self.trainable as i64, self.numel as i64);
                        w.narrow(0, p, n - p)
                            .copy_(&self.weights.narrow(0, p, n - p));
                    }
                });
                Ok((
                    Reply::Stepped {
                        loss_bits: loss_sum.to_bits(),
                    },
                    Vec::new(),
                ))
            }
            Request::Forward { x, train } => {
                let xs = tensor_of(&x, payload)?;
                self.pull();
                let out = tch::no_grad(|| self.net.try_forward(&xs.to_device(self.device), train))
                    .map_err(|e| first_line(&e.to_string()))?;
                let out = out.to_kind(Kind::Float);
                let bytes = tensor_bytes(&out);
                Ok((
                    Reply::Output {
                        out: meta("", &out),
                    },
                    bytes,
                ))
            }
            Request::Save => {
                self.pull();
                let path = scratch.join("module.pt");
                // The parameters are views of one flat vector; saved as
                // they are, every tensor of the user's module would share
                // one storage (and `safetensors.torch.save_file` would
                // refuse it). Each gets a storage of its own for the save.
                let views: Vec<Tensor> = self
                    .tensors
                    .trainable
                    .iter()
                    .map(|(_, v)| v.detach())
                    .collect();
                for (_, v) in &self.tensors.trainable {
                    v.shallow_clone().set_data(&v.detach().copy());
                }
                let saved = self.net.module().save(&path);
                for ((_, v), view) in self.tensors.trainable.iter().zip(&views) {
                    v.shallow_clone().set_data(view);
                }
                saved.map_err(|e| first_line(&e.to_string()))?;
                let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                Ok((Reply::Saved { bytes }, Vec::new()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn meta_of(shape: Vec<i64>, dtype: &str) -> Meta {
        Meta {
            name: "t".into(),
            shape,
            dtype: dtype.into(),
        }
    }

    #[test]
    fn sizes_from_a_child_are_checked() {
        assert_eq!(size_of(&meta_of(vec![2, 3], "float32")).unwrap().1, 24);
        assert_eq!(size_of(&meta_of(vec![4], "int64")).unwrap().1, 32);
        assert!(size_of(&meta_of(vec![-1], "float32")).is_err());
        assert!(size_of(&meta_of(vec![i64::MAX, i64::MAX], "float32")).is_err());
        assert!(size_of(&meta_of(vec![1; 17], "float32")).is_err());
        assert!(size_of(&meta_of(vec![1], "float128")).is_err());
    }

    proptest! {
        #[test]
        fn frames_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..512), loss in any::<f64>()) {
            let mut buf = Vec::new();
            let reply = Reply::Stepped { loss_bits: loss.to_bits() };
            write_frame(&mut buf, &reply, &[&bytes]).unwrap();
            let (back, payload): (Reply, Vec<u8>) = read_frame(&mut buf.as_slice(), 512).unwrap();
            prop_assert_eq!(payload, bytes);
            match back {
                // NaN and infinities too: a diverged loss arrives as one.
                Reply::Stepped { loss_bits } => prop_assert_eq!(loss_bits, loss.to_bits()),
                other => prop_assert!(false, "{other:?}"),
            }
        }

        #[test]
        fn any_bytes_read_as_a_frame_are_an_answer_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            // Whatever a hostile child writes: no panic, no allocation past
            // the bound.
            let _ = read_frame::<Reply>(&mut bytes.as_slice(), 1024);
        }
    }

    #[test]
    fn a_payload_past_its_bound_is_refused_before_it_is_read() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Reply::Mapped, &[&[0u8; 100]]).unwrap();
        let e = read_frame::<Reply>(&mut buf.as_slice(), 99).unwrap_err();
        assert!(e.to_string().contains("more than the 99 allowed"), "{e}");
    }
}
