//! Trainyard's data plane: how executors exchange tensors during training.
//!
//! Every executor runs one TCP listener ([`plane::DataPlane`]) for all the
//! roles it holds. A peer that connects proves, by challenge and response,
//! that it knows the job's secret ([`handshake`]), and names the job, the
//! generation, the role kind and the rank it wants; the listener hands the
//! authenticated stream to the role that registered that endpoint, and
//! refuses strangers and stale generations. On top of these connections
//! [`ring`] runs the bandwidth-optimal ring all-reduce (reduce-scatter then
//! all-gather, pipelined in segments) and the broadcasts a ring uses to
//! bring a new member up to date; [`ps`] is the parameter-server protocol
//! (init, pull, push of one shard's values).
//!
//! The crate has no libtorch dependency: it moves `f32` buffers, so the
//! benchmarks and the multi-process correctness tests run without `tch`.
//! Frames carry raw little-endian bytes; a big-endian host is refused at
//! compile time.

#[cfg(target_endian = "big")]
compile_error!("the data plane sends native f32 bytes and needs a little-endian host");

pub mod frame;
pub mod handshake;
pub mod plane;
pub mod ps;
pub mod ring;

pub use plane::{DataPlane, Endpoint, EndpointKey, EndpointRole};
pub use ring::{Ring, RingConfig, RingError, Wire};
