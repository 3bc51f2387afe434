//! The child's side of a module process, run confined
//! (`trainyard-confined model`): it loads the module, describes its tensors,
//! maps the shared memory and makes its parameters views of it (on a GPU,
//! copies in before each call), then answers steps, forwards and saves
//! until its stdin closes. A libtorch panic in a call is an answer
//! (`Failed`), not the end of the child.

use crate::core::{seeded_rng, Core};
use crate::model::{Net, Script};
use crate::protocol::frames::{
    meta, read_frame, size_of, tensor_bytes, tensor_of, write_frame, Load, Reply, Request,
};
use crate::shm::Shared;
use crate::tensors::{first_line, ModelTensors};
use crate::torchscript::Module;
use std::io::{BufRead, Write};
use tch::{Kind, Tensor};
use trainyard_common::spec::UncheckedJobSpec;

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
    spec: UncheckedJobSpec,
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
