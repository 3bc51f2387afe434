//! The built-in models, built with `tch::nn` from the job spec.
//!
//! A user's TorchScript module is a [`Script`]. Built-in models have no
//! buffers and no dropout, so their two modes forward alike.
//!
//! Tensor names and shapes are exactly those of
//! `trainyard_common::model::parameters` (a test checks it), because the
//! scheduler shards the PS tier and sizes memory from that list.

use tch::nn::{self, Module};
use tch::{Kind, Tensor};
use trainyard_common::model::CNN_KERNEL;
use trainyard_common::spec::{CnnSpec, MlpSpec, ModelSpec, TransformerSpec};

/// A model that maps a batch to outputs (logits or regression values).
pub trait Net: Send {
    /// Forward pass; `train` enables training-only behaviour.
    fn forward(&self, xs: &Tensor, train: bool) -> Tensor;

    /// Forward pass that reports libtorch errors (a user's TorchScript
    /// module may not accept the data) instead of panicking.
    fn try_forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, tch::TchError> {
        Ok(self.forward(xs, train))
    }

    /// The TorchScript module behind it, if it is a user's.
    fn script(&self) -> Option<&crate::torchscript::Module> {
        None
    }
}

/// A user's TorchScript module ([`crate::torchscript::Module`]) as a [`Net`]:
/// forwards in training mode while training and in evaluation mode
/// (dropout off, BatchNorm on its running statistics) while evaluating.
pub struct Script {
    module: crate::torchscript::Module,
    train: std::sync::atomic::AtomicBool,
    /// Tensor arguments of its forward (see
    /// [`crate::torchscript::Module::forward_packed`]).
    inputs: usize,
}

impl Script {
    /// The loaded module, put in training mode.
    pub fn new(module: crate::torchscript::Module) -> Result<Script, tch::TchError> {
        module.set_train(true)?;
        let inputs = module.schema()?.tensor_args;
        Ok(Script {
            module,
            train: std::sync::atomic::AtomicBool::new(true),
            inputs,
        })
    }

    /// The module (its tensors, to save it).
    pub fn module(&self) -> &crate::torchscript::Module {
        &self.module
    }
}

impl Net for Script {
    fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        // Only reached through try_forward in the training loop.
        self.try_forward(xs, train)
            .unwrap_or_else(|_| Tensor::zeros([0], (Kind::Float, xs.device())))
    }

    fn try_forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, tch::TchError> {
        use std::sync::atomic::Ordering;
        if self.train.swap(train, Ordering::Relaxed) != train {
            self.module.set_train(train)?;
        }
        self.module.forward_packed(xs, self.inputs)
    }

    fn script(&self) -> Option<&crate::torchscript::Module> {
        Some(&self.module)
    }
}

/// Fully connected layers with ReLU between them.
pub struct Mlp {
    layers: Vec<nn::Linear>,
}

impl Mlp {
    /// Builds the MLP under `p`.
    pub fn new(p: &nn::Path, m: &MlpSpec) -> Mlp {
        let mut dims = vec![i64::from(m.inputs)];
        dims.extend(m.hidden.iter().map(|&h| i64::from(h)));
        dims.push(i64::from(m.outputs));
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(i, w)| nn::linear(p / format!("fc{i}"), w[0], w[1], Default::default()))
            .collect();
        Mlp { layers }
    }
}

impl Net for Mlp {
    fn forward(&self, xs: &Tensor, _train: bool) -> Tensor {
        let last = self.layers.len() - 1;
        let mut h = xs.flatten(1, -1);
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h);
            if i < last {
                h = h.relu();
            }
        }
        h
    }
}

/// 3×3 convolutions (ReLU, 2×2 max-pool), then two linear layers.
pub struct Cnn {
    convs: Vec<nn::Conv2D>,
    fc0: nn::Linear,
    fc1: nn::Linear,
    shape: [i64; 3],
}

impl Cnn {
    /// Builds the CNN under `p`.
    pub fn new(p: &nn::Path, c: &CnnSpec) -> Cnn {
        let cfg = nn::ConvConfig {
            padding: (CNN_KERNEL / 2) as i64,
            ..Default::default()
        };
        let mut cin = i64::from(c.channels);
        let mut convs = Vec::new();
        for (i, &cout) in c.conv_channels.iter().enumerate() {
            convs.push(nn::conv2d(
                p / format!("conv{i}"),
                cin,
                i64::from(cout),
                CNN_KERNEL as i64,
                cfg,
            ));
            cin = i64::from(cout);
        }
        let pools = c.conv_channels.len() as u32;
        let flat = cin * (i64::from(c.height) >> pools) * (i64::from(c.width) >> pools);
        Cnn {
            convs,
            fc0: nn::linear(p / "fc0", flat, i64::from(c.hidden), Default::default()),
            fc1: nn::linear(
                p / "fc1",
                i64::from(c.hidden),
                i64::from(c.classes),
                Default::default(),
            ),
            shape: [
                i64::from(c.channels),
                i64::from(c.height),
                i64::from(c.width),
            ],
        }
    }
}

impl Net for Cnn {
    fn forward(&self, xs: &Tensor, _train: bool) -> Tensor {
        let n = xs.size()[0];
        let mut h = xs.reshape([n, self.shape[0], self.shape[1], self.shape[2]]);
        for c in &self.convs {
            h = c.forward(&h).relu().max_pool2d_default(2);
        }
        self.fc1
            .forward(&self.fc0.forward(&h.flatten(1, -1)).relu())
    }
}

struct Block {
    ln1: nn::LayerNorm,
    qkv: nn::Linear,
    proj: nn::Linear,
    ln2: nn::LayerNorm,
    fc: nn::Linear,
    out: nn::Linear,
}

/// A decoder-only transformer language model (pre-norm, causal attention).
pub struct Transformer {
    tok: nn::Embedding,
    pos: nn::Embedding,
    blocks: Vec<Block>,
    ln_f: nn::LayerNorm,
    head: nn::Linear,
    heads: i64,
    width: i64,
}

impl Transformer {
    /// Builds the transformer under `p`.
    pub fn new(p: &nn::Path, t: &TransformerSpec) -> Transformer {
        let w = i64::from(t.width);
        let ff = trainyard_common::model::TRANSFORMER_FF_MULT as i64 * w;
        let blocks = (0..t.layers)
            .map(|l| {
                let b = p / "blocks" / l.to_string();
                Block {
                    ln1: nn::layer_norm(&b / "ln1", vec![w], Default::default()),
                    qkv: nn::linear(&b / "attn" / "qkv", w, 3 * w, Default::default()),
                    proj: nn::linear(&b / "attn" / "proj", w, w, Default::default()),
                    ln2: nn::layer_norm(&b / "ln2", vec![w], Default::default()),
                    fc: nn::linear(&b / "mlp" / "fc", w, ff, Default::default()),
                    out: nn::linear(&b / "mlp" / "proj", ff, w, Default::default()),
                }
            })
            .collect();
        Transformer {
            tok: nn::embedding(p / "tok_emb", i64::from(t.vocab), w, Default::default()),
            pos: nn::embedding(p / "pos_emb", i64::from(t.context), w, Default::default()),
            blocks,
            ln_f: nn::layer_norm(p / "ln_f", vec![w], Default::default()),
            head: nn::linear(p / "head", w, i64::from(t.vocab), Default::default()),
            heads: i64::from(t.heads),
            width: w,
        }
    }
}

impl Net for Transformer {
    /// `xs`: token ids `[batch, time]`; returns logits `[batch, time, vocab]`.
    fn forward(&self, xs: &Tensor, _train: bool) -> Tensor {
        let (b, t) = (xs.size()[0], xs.size()[1]);
        let positions = Tensor::arange(t, (Kind::Int64, xs.device()));
        let mut h = self.tok.forward(xs) + self.pos.forward(&positions);
        let hd = self.width / self.heads;
        for blk in &self.blocks {
            let qkv = blk.qkv.forward(&blk.ln1.forward(&h));
            let parts = qkv.split(self.width, -1);
            let shape = |x: &Tensor| x.reshape([b, t, self.heads, hd]).transpose(1, 2);
            let att = Tensor::scaled_dot_product_attention::<Tensor>(
                &shape(&parts[0]),
                &shape(&parts[1]),
                &shape(&parts[2]),
                None,
                0.0,
                true,
                None,
                false,
            );
            // Out of place: autograd still needs the old `h` (layer norm input).
            let attended = blk
                .proj
                .forward(&att.transpose(1, 2).reshape([b, t, self.width]));
            h = &h + attended;
            h = &h
                + blk
                    .out
                    .forward(&blk.fc.forward(&blk.ln2.forward(&h)).gelu("none"));
        }
        self.head.forward(&self.ln_f.forward(&h))
    }
}

/// Builds the built-in model of `spec` under `p`; `None` for TorchScript.
pub fn build(p: &nn::Path, spec: &ModelSpec) -> Option<Box<dyn Net>> {
    Some(match spec {
        ModelSpec::Mlp(m) => Box::new(Mlp::new(p, m)),
        ModelSpec::Cnn(c) => Box::new(Cnn::new(p, c)),
        ModelSpec::Transformer(t) => Box::new(Transformer::new(p, t)),
        ModelSpec::Torchscript(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use trainyard_common::model::parameters;

    fn names_and_shapes(spec: &ModelSpec) -> BTreeMap<String, Vec<i64>> {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let _net = build(&vs.root(), spec).unwrap();
        vs.variables()
            .into_iter()
            .map(|(k, v)| (k, v.size()))
            .collect()
    }

    #[test]
    fn tensors_match_the_shared_parameter_list() {
        let specs = [
            ModelSpec::Mlp(MlpSpec {
                inputs: 64,
                hidden: vec![32, 16],
                outputs: 10,
            }),
            ModelSpec::Cnn(CnnSpec {
                channels: 1,
                height: 8,
                width: 8,
                conv_channels: vec![4, 8],
                hidden: 16,
                classes: 10,
            }),
            ModelSpec::Transformer(TransformerSpec {
                vocab: 40,
                context: 16,
                layers: 2,
                heads: 2,
                width: 8,
            }),
        ];
        for spec in specs {
            let got = names_and_shapes(&spec);
            let want: BTreeMap<String, Vec<i64>> = parameters(&spec)
                .unwrap()
                .into_iter()
                .map(|p| (p.name, p.shape.iter().map(|&d| d as i64).collect()))
                .collect();
            assert_eq!(got, want, "{spec:?}");
        }
    }

    #[test]
    fn forward_shapes() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let t = TransformerSpec {
            vocab: 40,
            context: 16,
            layers: 1,
            heads: 2,
            width: 8,
        };
        let net = build(&vs.root(), &ModelSpec::Transformer(t)).unwrap();
        let xs = Tensor::zeros([3, 16], (Kind::Int64, tch::Device::Cpu));
        assert_eq!(net.forward(&xs, true).size(), [3, 16, 40]);
        let c = CnnSpec {
            channels: 1,
            height: 8,
            width: 8,
            conv_channels: vec![4],
            hidden: 16,
            classes: 10,
        };
        let net = build(&(vs.root() / "c"), &ModelSpec::Cnn(c)).unwrap();
        assert_eq!(
            net.forward(
                &Tensor::zeros([5, 64], (Kind::Float, tch::Device::Cpu)),
                true
            )
            .size(),
            [5, 10]
        );
    }
}
